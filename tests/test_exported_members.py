"""The public surface of each package says what it is: every module's ``__all__`` names
only what the module has, and each package's ``__init__`` exports exactly its ``__all__``
(a package without one exports nothing)."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import pytest

PACKAGES = ("prism", "origin", "edge", "deploy")
# Modules that only import inside the Workers runtime (Pyodide's ``js``).
_RUNTIME_ONLY = {"js", "pyodide", "pyodide.ffi", "workers"}


def _modules() -> list[ModuleType]:
    found = []
    for name in PACKAGES:
        package = importlib.import_module(name)
        found.append(package)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{name}."):
            try:
                found.append(importlib.import_module(info.name))
            except ModuleNotFoundError as error:
                if error.name not in _RUNTIME_ONLY:
                    raise
    return found


MODULES = _modules()
PACKAGES_AND_SUBPACKAGES = [m for m in MODULES if hasattr(m, "__path__")]


def test_the_walk_sees_every_package() -> None:
    names = {m.__name__ for m in MODULES}
    assert {"prism.routes", "origin.http.asgi", "edge.handler", "deploy.cli"} <= names
    assert "edge.workers" not in names  # Pyodide only


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_all_names_only_what_exists(module: ModuleType) -> None:
    exported = getattr(module, "__all__", [])
    assert len(set(exported)) == len(exported), "a name is listed twice"
    missing = [name for name in exported if not hasattr(module, name)]
    assert missing == []


@pytest.mark.parametrize("package", PACKAGES_AND_SUBPACKAGES, ids=lambda m: m.__name__)
def test_package_exports_exactly_its_all(package: ModuleType) -> None:
    public = {
        name
        for name, value in vars(package).items()
        if not name.startswith("_")
        and not isinstance(value, ModuleType)  # its submodules, set as they are imported
        and name != "annotations"  # from __future__ import annotations
    }
    assert public == set(getattr(package, "__all__", []))
