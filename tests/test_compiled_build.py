"""The compiled build (setup.py, mypyc): the origin loads the compiled hot modules, none is
older than its source, and the edge's bundle holds none of them.

``make setup`` compiles the modules of pyproject.toml's ``[tool.prism.compiled]``;
``make test-pure`` runs the suite without them (``PRISM_PURE=1``), where every one of them
must load from its ``.py``.
"""

from __future__ import annotations

import importlib
import os
import sys
import tomllib
from pathlib import Path

import pytest

from deploy.edge_bundle import BuildTarget, build_edge

ROOT = Path(__file__).resolve().parent.parent
SOURCES = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["prism"]["compiled"][
    "modules"
]
PURE = os.environ.get("PRISM_PURE") == "1"


def _module(source: str) -> str:
    return source.removesuffix(".py").replace("/", ".")


def _extensions(source: str) -> list[Path]:
    path = ROOT / source
    return sorted(path.parent.glob(f"{path.stem}.cpython-*.so"))


COMPILED = any(_extensions(source) for source in SOURCES)


def test_the_list_names_existing_origin_and_core_modules() -> None:
    assert SOURCES and len(set(SOURCES)) == len(SOURCES)
    for source in SOURCES:
        assert (ROOT / source).is_file(), source
        assert source.startswith(("prism/", "origin/")), source  # never the edge's own code


@pytest.mark.skipif(PURE or not COMPILED, reason="no compiled build here (make compile)")
def test_the_compiled_modules_are_the_ones_loaded_and_none_is_stale() -> None:
    [library] = (ROOT / "prism").glob("_compiled__mypyc.cpython-*.so")  # setup.py's group
    for source in SOURCES:
        extensions = _extensions(source)
        assert len(extensions) == 1, f"{source}: {extensions} (make compile)"
        # Each module's extension is a shim; the code of all of them is in the group's library.
        older = library.stat().st_mtime < (ROOT / source).stat().st_mtime
        assert not older, f"{library.name} is older than {source}: run make compile"
        module = importlib.import_module(_module(source))
        assert module.__file__ is not None and module.__file__.endswith(".so"), module.__file__


@pytest.mark.skipif(not PURE, reason="only in the pure build (make test-pure)")
def test_the_pure_build_loads_every_module_from_its_source() -> None:
    assert not COMPILED, "PRISM_PURE=1 with compiled modules in the checkout (make pure)"
    for source in SOURCES:
        module = sys.modules.get(_module(source)) or importlib.import_module(_module(source))
        assert module.__file__ == str(ROOT / source)


TARGETS: list[BuildTarget] = ["local", "cloudflare"]


@pytest.mark.parametrize("target", TARGETS)
def test_the_edge_bundle_holds_only_python_sources(tmp_path: Path, target: BuildTarget) -> None:
    bundle = build_edge(target, tmp_path / "bundle")
    shipped = [p for p in bundle.out.rglob("*") if p.is_file()]
    core = [p for p in shipped if p.parent.name == "prism" and p.suffix == ".py"]
    assert {p.stem for p in core} >= {Path(s).stem for s in SOURCES if s.startswith("prism/")}
    assert [p for p in shipped if p.suffix not in {".py", ".toml"}] == []
