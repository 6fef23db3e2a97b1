"""The origin's release: a wheel of this checkout plus a hash-checked lock for the instance.

A release is content-addressed. The wheel is built by ``uv build`` from a copy of
the checkout (tracked and untracked-but-not-ignored files, so uncommitted edits
ship and stray build output does not) with ``SOURCE_DATE_EPOCH`` fixed, so the
same tree always gives the same bytes. The lock is ``uv pip compile
--generate-hashes`` of the project's ``[project].dependencies`` and its ``otel`` extra
(so a deployed origin can export traces when told where; without an endpoint it imports
none of it) for the
instance's Python and platform (:class:`ReleaseTarget`), not this machine's. The
instance installs ``requirements.txt`` (the lock plus the wheel by path and
hash) with ``pip install --require-hashes``: nothing is installed by bare name.

:attr:`Release.id` (16 hex digits of the hash of both) names the release: the
S3 prefix it is stored under, the instance's ``prism:release`` tag and the
``version`` the origin reports on ``/healthz``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DISTRIBUTION",
    "RELEASE_DIR",
    "TARGETS",
    "Release",
    "ReleaseError",
    "ReleaseTarget",
    "build_release",
    "build_wheel",
    "compile_lock",
    "find_source",
    "find_uv",
    "lock_key",
    "requirements_text",
]

DISTRIBUTION = "prism-edge-gateway"
RELEASE_DIR = "/opt/prism/releases"  # on the instance: <RELEASE_DIR>/<release id>/
# 1980-01-01, the earliest time a zip entry can carry: any fixed value makes the wheel
# reproducible.
_SOURCE_DATE_EPOCH = "315532800"
_UV_TIMEOUT = 600.0
_WHEEL_NAME = re.compile(r"^[A-Za-z0-9_.]+-[A-Za-z0-9_.+!]+-py3-none-any\.whl$")
_SKIP_DIRS = {".git", ".venv", "node_modules", "build", "dist", ".prism", "__pycache__"}


class ReleaseError(Exception):
    """The wheel or the lock could not be built."""


@dataclass(frozen=True, slots=True)
class ReleaseTarget:
    """The instance's OS image, Python and platform: part of the deploy's identity."""

    os: str  # e.g. "ubuntu-24.04"
    python: str  # "3.12": the image's own python3
    platform: str  # uv's --python-platform, e.g. "x86_64-manylinux_2_39"

    @property
    def arch(self) -> str:
        return self.platform.split("-", 1)[0]


# Ubuntu 24.04 LTS ships Python 3.12 and glibc 2.39.
TARGETS: dict[str, ReleaseTarget] = {
    "x86_64": ReleaseTarget("ubuntu-24.04", "3.12", "x86_64-manylinux_2_39"),
    "aarch64": ReleaseTarget("ubuntu-24.04", "3.12", "aarch64-manylinux_2_39"),
}


@dataclass(frozen=True, slots=True)
class Release:
    """One wheel and its lock; ``requirements`` is what the instance installs."""

    wheel_name: str
    wheel_sha256: str
    lock_sha256: str
    target: ReleaseTarget
    wheel: bytes
    lock: str

    @property
    def id(self) -> str:
        both = f"{self.wheel_sha256}\n{self.lock_sha256}\n".encode()
        return hashlib.sha256(both).hexdigest()[:16]

    @property
    def requirements(self) -> str:
        return requirements_text(self.lock, self.wheel_name, self.wheel_sha256, self.id)


def requirements_text(
    lock: str, wheel_name: str, wheel_sha256: str, release_id: str, *, root: str = RELEASE_DIR
) -> str:
    """The lock plus this release's wheel, by its path on the instance and its hash."""
    if not _WHEEL_NAME.match(wheel_name):
        raise ReleaseError(f"unexpected wheel file name {wheel_name!r}")
    path = f"{root}/{release_id}/{wheel_name}"
    return f"{lock.rstrip()}\n{path} \\\n    --hash=sha256:{wheel_sha256}\n"


def find_source(start: Path | None = None) -> Path:
    """The checkout to ship: the folder above ``start`` (or this package) with our pyproject."""
    starts = [start] if start else [Path.cwd(), Path(__file__).resolve().parent]
    for first in starts:
        for folder in (first.resolve(), *first.resolve().parents):
            pyproject = folder / "pyproject.toml"
            if pyproject.is_file() and _project(pyproject).get("name") == DISTRIBUTION:
                return folder
    where = start or "the working directory"
    raise ReleaseError(f"no {DISTRIBUTION} checkout (pyproject.toml) at or above {where}")


def find_uv() -> str:
    """The ``uv`` executable: the PyPI package's own, else one on PATH."""
    try:
        import uv  # the `deploy` extra

        return str(uv.find_uv_bin())
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return found
    raise ReleaseError(f"uv is needed to build the release: pip install '{DISTRIBUTION}[deploy]'")


def lock_key(source: Path, target: ReleaseTarget) -> str:
    """16 hex digits naming the lock of ``source``'s dependencies for ``target``."""
    listed = _project(source / "pyproject.toml").get("dependencies", [])
    dependencies = sorted(str(d) for d in listed) if isinstance(listed, list) else []
    spec = "\n".join([target.python, target.platform, *dependencies])
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def build_wheel(source: Path, out: Path, *, uv: str | None = None) -> Path:
    """A reproducible wheel of ``source``'s working tree, written into ``out``."""
    uv = uv or find_uv()
    with tempfile.TemporaryDirectory(prefix="prism-wheel-") as tmp:
        tree = Path(tmp) / "src"
        _copy_tree(source, tree)
        dist = Path(tmp) / "dist"
        env = {**os.environ, "SOURCE_DATE_EPOCH": _SOURCE_DATE_EPOCH}
        _run([uv, "build", "--wheel", "--quiet", "--out-dir", str(dist), str(tree)], env, "build")
        wheels = list(dist.glob("*.whl"))
        if len(wheels) != 1:
            raise ReleaseError(f"uv build made {len(wheels)} wheels, expected one")
        out.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy2(wheels[0], out / wheels[0].name))


def compile_lock(source: Path, target: ReleaseTarget, *, uv: str | None = None) -> str:
    """Every dependency of ``source`` pinned with its hashes, resolved for ``target``."""
    uv = uv or find_uv()
    args = [uv, "pip", "compile", str(source / "pyproject.toml"), "--extra", "otel"]
    args += ["--generate-hashes"]
    args += ["--python-version", target.python, "--python-platform", target.platform]
    args += ["--no-header", "--no-annotate", "--quiet", "--no-config"]
    text = _run(args, dict(os.environ), "pip compile")
    if "--hash=sha256:" not in text:
        raise ReleaseError("uv pip compile printed no pinned, hashed requirements")
    return text


def build_release(
    source: Path,
    target: ReleaseTarget,
    out: Path,
    *,
    lock: str | None = None,
    uv: str | None = None,
) -> Release:
    """Build the wheel (always) and the lock (unless an earlier one is passed in)."""
    wheel = build_wheel(source, out, uv=uv)
    text = lock if lock is not None else compile_lock(source, target, uv=uv)
    data = wheel.read_bytes()
    return Release(
        wheel_name=wheel.name,
        wheel_sha256=hashlib.sha256(data).hexdigest(),
        lock_sha256=hashlib.sha256(text.encode()).hexdigest(),
        target=target,
        wheel=data,
        lock=text,
    )


def _project(pyproject: Path) -> dict[str, object]:
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    return project if isinstance(project, dict) else {}


def _copy_tree(source: Path, dest: Path) -> None:
    """The files git would ship (tracked or new, not ignored), else all but build output."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=source,
            capture_output=True,
            check=True,
        ).stdout.decode()
        files = [Path(name) for name in listed.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        files = [
            path.relative_to(source)
            for path in source.rglob("*")
            if path.is_file() and not _SKIP_DIRS & set(path.relative_to(source).parts)
        ]
    for name in files:
        origin = source / name
        if origin.is_file():  # a deleted-but-tracked file is listed too
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, dest / name)


def _run(args: list[str], env: dict[str, str], what: str) -> str:
    try:
        done = subprocess.run(
            args, env=env, capture_output=True, text=True, timeout=_UV_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ReleaseError(f"uv {what}: {error}") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise ReleaseError(f"uv {what} failed: {' '.join(lines[-3:]) or 'no output'}")
    return done.stdout
