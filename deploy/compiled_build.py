"""The compiled wheel of a release: the origin's hot modules built by mypyc for the instance.

The modules are those of pyproject.toml's ``[tool.prism.compiled]`` (the list ``make
compile`` builds in the checkout, through setup.py with ``PRISM_COMPILE=1``). The release
builds them in an isolated environment that uv creates from PyPI for the instance's Python
(3.12 on Ubuntu 24.04): the release's own lock (so the compiled code is type-checked against
exactly the dependencies the instance installs) plus ``build-requires``, the pinned mypy,
setuptools and what mypy needs to check the modules they import (the semantic cache's
numpy, the S3 stubs), all installed with ``--require-hashes``.

The wheel is tagged ``cp312-cp312-linux_<arch>`` by setuptools and kept so: the instance
installs it by path, and pip accepts a ``linux_<arch>`` wheel on the machine it matches.
auditwheel then checks it needs no glibc newer than the instance's (it links nothing else).

A compiled wheel can only be built on the target's own architecture, on Linux, with that
Python (and its headers) and a C compiler; :func:`choose` says which wheel a release ships,
and why, from this machine alone (no network, so a dry run can say it too).
"""

from __future__ import annotations

import glob
import os
import platform
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BUILD_PYTHON_ENV",
    "CompileError",
    "WheelChoice",
    "build_env",
    "build_requires",
    "check_glibc",
    "choose",
    "compiled_modules",
    "find_compiler",
    "find_python",
    "reproducible_flags",
]

#: Names the Python to build with, where it is not found on its own.
BUILD_PYTHON_ENV = "PRISM_BUILD_PYTHON"
_TIMEOUT = 900.0
_PROBE = (
    "import os, sys, sysconfig; "
    "print('%d.%d' % sys.version_info[:2], sys.implementation.name, "
    "os.path.isfile(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"
)
_POLICY = re.compile(r'consistent with the following platform tag: "manylinux_(\d+)_(\d+)_')


class CompileError(Exception):
    """The compiled wheel could not be built (the release then ships the pure one)."""


@dataclass(frozen=True, slots=True)
class WheelChoice:
    """Which wheel a release ships: compiled (with ``python``) or pure, and why."""

    compiled: bool
    reason: str
    python: str | None = None

    def describe(self, arch: str, python: str) -> str:
        """One line for the plan and the release's note."""
        if self.compiled:
            tag = f"cp{python.replace('.', '')}-cp{python.replace('.', '')}-linux_{arch}"
            return f"compiled {tag} ({self.reason})"
        return f"pure py3-none-any ({self.reason})"


def _table(source: Path) -> dict[str, object]:
    text = (source / "pyproject.toml").read_text(encoding="utf-8")
    table = tomllib.loads(text).get("tool", {}).get("prism", {}).get("compiled", {})
    return table if isinstance(table, dict) else {}


def compiled_modules(source: Path) -> list[str]:
    """The source files mypyc compiles (setup.py reads the same list)."""
    modules = _table(source).get("modules", [])
    return [str(m) for m in modules] if isinstance(modules, list) else []


def build_requires(source: Path) -> list[str]:
    """The compiled build's pinned tools and type-checking packages (``name==version``)."""
    listed = _table(source).get("build-requires", [])
    pins = [str(r) for r in listed] if isinstance(listed, list) else []
    loose = [pin for pin in pins if "==" not in pin]
    if loose:
        raise CompileError(f"[tool.prism.compiled] build-requires must pin versions: {loose}")
    return pins


def _mypy_pin(source: Path) -> str:
    for pin in build_requires(source):
        if pin.split("==")[0].strip().lower() == "mypy":
            return pin.split("==")[1].strip()
    raise CompileError("[tool.prism.compiled] build-requires pins no mypy")


def _probe(python: str, version: str) -> str | None:
    """None if ``python`` is CPython ``version`` with its headers, else what is wrong."""
    try:
        done = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{python}: {error}"
    found = done.stdout.split()
    if done.returncode != 0 or len(found) != 3:
        return f"{python} does not run"
    if found[:2] != [version, "cpython"]:
        return f"{python} is {found[1]} {found[0]}, not CPython {version}"
    if found[2] != "True":
        return f"{python} has no C headers (Python.h: install python{version}-dev)"
    return None


def find_python(version: str) -> tuple[str | None, str]:
    """(CPython ``version`` with headers, or None; what was looked at) on this machine."""
    named = os.environ.get(BUILD_PYTHON_ENV)
    candidates = [named] if named else []
    on_path = shutil.which(f"python{version}")
    candidates += [on_path] if on_path else []
    candidates.append(f"/usr/bin/python{version}")
    # pyenv's shims answer only for the versions it has selected; its own copies always run.
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates += sorted(glob.glob(f"{pyenv}/versions/{version}*/bin/python{version}"))
    problems: list[str] = []
    for candidate in dict.fromkeys(candidates):
        if not os.path.isfile(candidate) and candidate != named:
            continue
        problem = _probe(candidate, version)
        if problem is None:
            return candidate, ""
        problems.append(problem)
    return None, "; ".join(problems) or f"no python{version} on this machine"


def find_compiler() -> str | None:
    """The C compiler setuptools will use: ``$CC``, else cc, gcc or clang on PATH."""
    named = os.environ.get("CC", "").split()
    for name in [*named[:1], "cc", "gcc", "clang"]:
        found = shutil.which(name)
        if found:
            return found
    return None


def _host_arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def choose(source: Path, arch: str, python: str) -> WheelChoice:
    """The wheel a release for ``arch`` and ``python`` ships, from this machine's tools."""
    host = _host_arch()
    if sys.platform != "linux" or host != arch:
        here = f"{sys.platform} {host}"
        return WheelChoice(False, f"a compiled {arch} wheel cannot be built on {here}")
    try:
        mypy = _mypy_pin(source)
    except (CompileError, OSError, tomllib.TOMLDecodeError) as error:
        return WheelChoice(False, f"no compiled build configured: {error}")
    if not compiled_modules(source):
        return WheelChoice(False, "[tool.prism.compiled] lists no modules")
    interpreter, problem = find_python(python)
    if interpreter is None:
        return WheelChoice(False, f"no Python {python} to compile with: {problem}")
    if find_compiler() is None:
        return WheelChoice(False, "no C compiler (cc, gcc or clang; or set CC)")
    modules = len(compiled_modules(source))
    return WheelChoice(True, f"mypyc from mypy {mypy}, {modules} hot modules", interpreter)


def _run(args: list[str], what: str, env: dict[str, str] | None = None) -> str:
    try:
        done = subprocess.run(
            args, env=env, capture_output=True, text=True, timeout=_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise CompileError(f"{what}: {error}") from None
    if done.returncode != 0:
        lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        errors = [line for line in lines if "error" in line.lower()] or lines
        raise CompileError(f"{what} failed: {' '.join(errors[-3:]) or 'no output'}")
    return done.stdout


def build_env(source: Path, folder: Path, *, uv: str, python: str, version: str, lock: str) -> Path:
    """A fresh venv in ``folder`` with the lock and the pinned build requirements; its python.

    The build requirements are resolved with hashes against the lock (``-c``), so every
    package both name has the lock's version, then installed, like the lock, with
    ``--require-hashes``.
    """
    folder.mkdir(parents=True, exist_ok=True)
    env = folder / "env"
    quiet = ["--quiet", "--no-config"]
    _run([uv, "venv", *quiet, "--python", python, str(env)], "uv venv")
    interpreter = env / "bin" / "python"
    (folder / "lock.txt").write_text(lock)
    (folder / "build.in").write_text("\n".join(build_requires(source)) + "\n")
    constrained = [str(folder / "build.in"), "-c", str(folder / "lock.txt")]
    hashed = ["--generate-hashes", "--python-version", version, "--no-header", "--no-annotate"]
    pinned = _run(
        [uv, "pip", "compile", *constrained, *hashed, *quiet],
        "uv pip compile (build requirements)",
    )
    (folder / "build.txt").write_text(pinned)
    for requirements in ("lock.txt", "build.txt"):
        target = ["--python", str(interpreter), "--require-hashes"]
        _run(
            [uv, "pip", "install", *quiet, *target, "-r", str(folder / requirements)],
            f"uv pip install ({requirements})",
        )
    return interpreter


def reproducible_flags(tree: Path, env: Path) -> str:
    """CFLAGS that keep the build's temporary paths out of the objects' debug info."""
    return f"-ffile-prefix-map={tree}=/prism/src -ffile-prefix-map={env}=/prism/build-env"


def check_glibc(wheel: Path, interpreter: Path, glibc: tuple[int, int]) -> str:
    """auditwheel's manylinux policy for ``wheel``, if no newer than ``glibc``; else raise."""
    shown = _run([str(interpreter), "-m", "auditwheel", "show", str(wheel)], "auditwheel show")
    found = _POLICY.search(" ".join(shown.split()))
    if found is None:
        raise CompileError(f"auditwheel found no manylinux policy: {' '.join(shown.split())[:200]}")
    needs = (int(found.group(1)), int(found.group(2)))
    if needs > glibc:
        raise CompileError(
            f"the compiled wheel needs glibc {needs[0]}.{needs[1]}, newer than the "
            f"instance's {glibc[0]}.{glibc[1]}"
        )
    return f"manylinux_{needs[0]}_{needs[1]}"
