"""The releases the AWS deploy tests ship: built for real, once per session (pure wheels: the
deploy's steps are the same for the compiled one, test_compiled_release.py builds that)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from deploy.release import TARGETS, Release, build_release, compile_lock

REPO = Path(__file__).resolve().parents[3]
TARGET = TARGETS["x86_64"]


# --- releases: built once per session, for real --------------------------------------


@pytest.fixture(scope="session")
def instance_lock() -> str:
    """The real hash-checked lock for the instance (Python 3.12, x86_64 manylinux)."""
    return compile_lock(REPO, TARGET)


@pytest.fixture(scope="session")
def releases(tmp_path_factory: pytest.TempPathFactory, instance_lock: str) -> list[Release]:
    """Two real releases: this checkout, and a copy of it with one module changed."""
    out = tmp_path_factory.mktemp("wheels")
    first = build_release(REPO, TARGET, out / "v1", lock=instance_lock, compiled=False)
    changed = tmp_path_factory.mktemp("checkout") / "src"
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (changed / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, changed / name)
    with (changed / "deploy" / "__init__.py").open("a") as f:
        f.write("# the next release\n")
    second = build_release(changed, TARGET, out / "v2", lock=instance_lock, compiled=False)
    return [first, second]
