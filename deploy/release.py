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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from deploy.compiled_build import (
    CompileError,
    WheelChoice,
    build_env,
    check_glibc,
    choose,
    reproducible_flags,
)

__all__ = [
    "DISTRIBUTION",
    "RELEASE_DIR",
    "TARGETS",
    "Release",
    "ReleaseError",
    "ReleaseTarget",
    "build_compiled_wheel",
    "build_release",
    "build_wheel",
    "compile_lock",
    "find_source",
    "find_uv",
    "lock_key",
    "requirements_text",
    "wheel_choice",
]

DISTRIBUTION = "prism-edge-gateway"
RELEASE_DIR = "/opt/prism/releases"  # on the instance: <RELEASE_DIR>/<release id>/
# 1980-01-01, the earliest time a zip entry can carry: any fixed value makes the wheel
# reproducible.
_SOURCE_DATE_EPOCH = "315532800"
_UV_TIMEOUT = 600.0
_WHEEL_NAME = re.compile(
    r"^[A-Za-z0-9_.]+-[A-Za-z0-9_.+!]+-(py3-none-any|cp3\d+-cp3\d+-linux_(x86_64|aarch64))\.whl$"
)
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

    @property
    def glibc(self) -> tuple[int, int]:
        """The image's glibc, from the platform's manylinux tag (2.17 if it names none)."""
        found = re.search(r"manylinux_(\d+)_(\d+)", self.platform)
        return (int(found.group(1)), int(found.group(2))) if found else (2, 17)


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
    compiled: bool = False
    note: str = ""  # which wheel this is and why (the plan's and the deploy's words)

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
    """A reproducible pure wheel of ``source``'s working tree, written into ``out``."""
    uv = uv or find_uv()
    with tempfile.TemporaryDirectory(prefix="prism-wheel-") as tmp:
        tree = Path(tmp) / "src"
        _copy_tree(source, tree)
        return _uv_build(uv, tree, Path(tmp) / "dist", out, [], {})


def build_compiled_wheel(
    source: Path, target: ReleaseTarget, out: Path, *, lock: str, python: str, uv: str | None = None
) -> tuple[Path, str]:
    """The compiled wheel of ``source`` for ``target``, built with ``python`` (CPython at the
    target's version) in a fresh environment holding ``lock`` and the pinned build tools, and
    the manylinux policy auditwheel finds it consistent with.

    Raises :class:`~deploy.compiled_build.CompileError` when it cannot be built or would not
    run on the target's glibc.
    """
    uv = uv or find_uv()
    with tempfile.TemporaryDirectory(prefix="prism-compiled-") as tmp:
        tree = Path(tmp) / "src"
        _copy_tree(source, tree)
        folder = Path(tmp) / "build-env"
        interpreter = build_env(
            source, folder, uv=uv, python=python, version=target.python, lock=lock
        )
        flags = reproducible_flags(tree, folder)
        env = {"PRISM_COMPILE": "1", "CFLAGS": f"{os.environ.get('CFLAGS', '')} {flags}".strip()}
        args = ["--no-build-isolation", "--python", str(interpreter)]
        try:
            wheel = _uv_build(uv, tree, Path(tmp) / "dist", out, args, env)
        except ReleaseError as error:
            raise CompileError(str(error)) from None
        expected = f"-cp{target.python.replace('.', '')}-"
        if expected not in wheel.name or not wheel.name.endswith(f"linux_{target.arch}.whl"):
            wheel.unlink()
            raise CompileError(f"the compiled build made {wheel.name}, not one for {target}")
        return wheel, check_glibc(wheel, interpreter, target.glibc)


def _uv_build(
    uv: str, tree: Path, dist: Path, out: Path, args: list[str], env: Mapping[str, str]
) -> Path:
    environ = {**os.environ, **env, "SOURCE_DATE_EPOCH": _SOURCE_DATE_EPOCH}
    command = [uv, "build", "--wheel", "--quiet", *args, "--out-dir", str(dist), str(tree)]
    _run(command, environ, "build")
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


def wheel_choice(source: Path, target: ReleaseTarget, *, compiled: bool = True) -> WheelChoice:
    """Which wheel :func:`build_release` will try for ``target`` (no network, no build)."""
    if not compiled:
        return WheelChoice(False, "the pure build was asked for")
    return choose(source, target.arch, target.python)


def build_release(
    source: Path,
    target: ReleaseTarget,
    out: Path,
    *,
    lock: str | None = None,
    uv: str | None = None,
    compiled: bool = True,
    progress: Callable[[str], None] = lambda _: None,
) -> Release:
    """Build the lock (unless an earlier one is passed in) and the wheel (always): the
    compiled one where :func:`wheel_choice` allows it, else, or if that build fails, the
    pure one. Never fails for want of the compiled build; ``progress`` hears why."""
    text = lock if lock is not None else compile_lock(source, target, uv=uv)
    choice = wheel_choice(source, target, compiled=compiled)
    note = choice.describe(target.arch, target.python)
    wheel: Path | None = None
    if choice.compiled and choice.python is not None:
        progress(f"Compiling the origin's hot modules for {target.arch}: {choice.reason}")
        try:
            wheel, policy = build_compiled_wheel(
                source, target, out, lock=text, python=choice.python, uv=uv
            )
            note = f"{note.removesuffix(')')}; auditwheel: {policy} consistent)"
        except CompileError as error:
            note = f"pure py3-none-any (the compiled build failed: {error})"
            progress(f"warning: {note}")
    if wheel is None:
        wheel = build_wheel(source, out, uv=uv)
    data = wheel.read_bytes()
    return Release(
        wheel_name=wheel.name,
        wheel_sha256=hashlib.sha256(data).hexdigest(),
        lock_sha256=hashlib.sha256(text.encode()).hexdigest(),
        target=target,
        wheel=data,
        lock=text,
        compiled=not wheel.name.endswith("-py3-none-any.whl"),
        note=note,
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
