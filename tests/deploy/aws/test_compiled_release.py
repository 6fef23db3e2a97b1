"""The compiled release: which wheel a release ships for which target and why, the fall back
to the pure wheel, and the compiled x86_64 wheel installed like the instance installs it
(prism-install, --require-hashes, a fresh Python 3.12 venv) serving a miss and a Redis hit
from its compiled modules.

The compiled wheel is built once for the module (mypyc: 2-4 minutes on a busy 2-core
machine); the tests that need it skip where this machine cannot build it (no Python 3.12,
no C compiler, not x86_64), as the deploy then ships the pure wheel.
"""

from __future__ import annotations

import hashlib
import io
import os
import platform
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest
import typer
from typer.testing import CliRunner

from deploy.aws.origin import plan
from deploy.aws.stack import OriginDeployConfig
from deploy.commands import deploy
from deploy.compiled_build import BUILD_PYTHON_ENV, compiled_modules, find_compiler, find_python
from deploy.local.provider import ProviderServer
from deploy.release import TARGETS, Release, build_release, requirements_text, wheel_choice
from tests.deploy.aws.test_origin_instance import RELEASE, free_port, install_script
from tests.fixtures.origin import origin_env
from tests.fixtures.stacks import CLI_START
from tests.polling import wait_for

REPO = Path(__file__).resolve().parents[3]
X86 = TARGETS["x86_64"]
PY312, _ = find_python("3.12")
CAN_COMPILE = PY312 is not None and find_compiler() is not None
CAN_COMPILE = CAN_COMPILE and platform.machine() == "x86_64" and sys.platform == "linux"
needs_compiler = pytest.mark.skipif(
    not CAN_COMPILE, reason="no Python 3.12 with headers, C compiler or x86_64 Linux here"
)
MYPY = next(p for p in REPO.joinpath("pyproject.toml").read_text().split('"') if "mypy==" in p)
SECRETS = {
    "REDIS_URL": "redis://r",
    "PRISM_KEY_SECRET": "k" * 32,
    "PRISM_FORWARD_SECRET": "f" * 32,
    "OPENAI_API_KEY": "sk-test",
}


# --- which wheel, from this machine alone ----------------------------------------------


def test_an_arm64_target_ships_the_pure_wheel_and_says_why() -> None:
    config = OriginDeployConfig(secrets=SECRETS, instance_type="t4g.small")

    shown = plan(config, source=str(REPO))

    assert config.target.arch == "aarch64"
    assert shown.wheel.startswith("pure py3-none-any (a compiled aarch64 wheel cannot be built")
    [step] = [s for s in shown.steps if s.resource == "wheel"]
    assert shown.wheel in step.action and "compiled build fails" not in step.action


@needs_compiler
def test_an_x86_64_target_ships_the_compiled_wheel_in_the_dry_run() -> None:
    root = typer.Typer()
    root.add_typer(deploy.app)
    env = {**dict.fromkeys(deploy.SECRET_ENV_VARS), **SECRETS}
    args = ["deploy", "origin", "--dry-run", "--source", str(REPO)]

    shown = CliRunner().invoke(root, args, env=env)
    pure = CliRunner().invoke(root, [*args, "--pure"], env=env)

    assert shown.exit_code == 0, shown.output
    wheel = f"  wheel: compiled cp312-cp312-linux_x86_64 (mypyc from mypy {MYPY.split('==')[1]}, "
    assert wheel + f"{len(compiled_modules(REPO))} hot modules)" in shown.stdout.splitlines()
    assert "the pure py3-none-any wheel if the compiled build fails" in shown.stdout
    assert pure.exit_code == 0 and "  wheel: pure py3-none-any (the pure build was asked for)" in (
        pure.stdout.splitlines()
    )


def test_without_python_312_the_choice_is_the_pure_wheel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(BUILD_PYTHON_ENV, sys.executable)  # this venv's 3.11
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    if Path("/usr/bin/python3.12").exists():
        pytest.skip("/usr/bin/python3.12 is installed here")

    choice = wheel_choice(REPO, X86)

    assert not choice.compiled and choice.python is None
    assert choice.reason.startswith("no Python 3.12 to compile with: ")
    assert f"{sys.executable} is cpython 3.11, not CPython 3.12" in choice.reason


@needs_compiler
def test_without_a_c_compiler_the_choice_is_the_pure_wheel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert PY312 is not None
    monkeypatch.setenv(BUILD_PYTHON_ENV, PY312)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)

    choice = wheel_choice(REPO, X86)

    assert (choice.compiled, choice.reason) == (
        False,
        "no C compiler (cc, gcc or clang; or set CC)",
    )


@needs_compiler
def test_a_failed_compiled_build_ships_the_pure_wheel_and_says_so(
    tmp_path: Path, instance_lock: str
) -> None:
    # A checkout whose pinned compiler does not exist: the build env cannot be made.
    source = tmp_path / "src"
    skip = (".git", ".venv", "node_modules", "build", ".prism", "*_cache", "__pycache__", "*.so")
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*skip))
    pyproject = source / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(f'"{MYPY}"', '"mypy==0.0.1"'))
    heard: list[str] = []

    release = build_release(
        source, X86, tmp_path / "out", lock=instance_lock, progress=heard.append
    )

    assert release.wheel_name.endswith("-py3-none-any.whl") and not release.compiled
    assert release.note.startswith("pure py3-none-any (the compiled build failed: uv pip compile")
    assert heard[0].startswith("Compiling the origin's hot modules for x86_64")
    assert heard[-1] == f"warning: {release.note}"


# --- the compiled wheel, built once ----------------------------------------------------


@pytest.fixture(scope="module")
def compiled_release(tmp_path_factory: pytest.TempPathFactory, instance_lock: str) -> Release:
    if not CAN_COMPILE:
        pytest.skip("no Python 3.12 with headers, C compiler or x86_64 Linux here")
    if os.environ.get("PRISM_PURE") == "1":
        pytest.skip("built once, by the compiled suite (make test), not again by make test-pure")
    out = tmp_path_factory.mktemp("compiled")
    heard: list[str] = []
    release = build_release(REPO, X86, out, lock=instance_lock, progress=heard.append)
    assert release.compiled, heard  # a fall back here is a failure: this machine can build it
    return release


@pytest.mark.timeout(1200)
def test_the_compiled_release_installs_with_require_hashes_and_serves_from_its_extensions(
    compiled_release: Release,
    tmp_path: Path,
    redis_url: str,
    provider: ProviderServer,
    api_key: str,
) -> None:
    # One test, so that `pytest -n 2` builds the wheel once (xdist spreads a module's tests).
    release = compiled_release
    assert release.wheel_name == "prism_edge_gateway-0.1.0-cp312-cp312-linux_x86_64.whl"
    mypy = MYPY.split("==")[1]
    assert release.note.startswith(f"compiled cp312-cp312-linux_x86_64 (mypyc from mypy {mypy},")
    # No newer glibc than the instance's 2.39 (it links nothing but libc).
    assert release.note.endswith(" consistent)") and "; auditwheel: manylinux_2_" in release.note
    names = zipfile.ZipFile(io.BytesIO(release.wheel)).namelist()
    for source in compiled_modules(REPO):
        assert f"{source.removesuffix('.py')}.cpython-312-x86_64-linux-gnu.so" in names, source
        assert source in names  # the source ships beside it
    assert "prism/_compiled__mypyc.cpython-312-x86_64-linux-gnu.so" in names
    assert not [n for n in names if n.startswith("edge/") and n.endswith(".so")]  # edge code: pure
    text = requirements_text(release.lock, release.wheel_name, release.wheel_sha256, release.id)
    assert f"--hash=sha256:{hashlib.sha256(release.wheel).hexdigest()}" in text.splitlines()[-1]

    # The instance's prism-install, run by Python 3.12: pip --require-hashes into a fresh venv.
    assert PY312 is not None
    script, _, venv = install_script(tmp_path, release)
    done = subprocess.run([PY312, str(script)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert f"installed release {RELEASE}" in done.stdout

    modules = [s.removesuffix(".py").replace("/", ".") for s in compiled_modules(REPO)]
    code = "import importlib, sys; print(sys.version_info[:2] == (3, 12)); " + "; ".join(
        f"print(importlib.import_module({m!r}).__file__)" for m in modules
    )
    # Not this checkout's folder, which would shadow the venv's copy.
    python = venv / "bin" / "python"
    shown = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout.split()
    assert shown[0] == "True"
    for module, path in zip(modules, shown[1:], strict=True):
        assert path.startswith(str(venv)) and path.endswith(".so"), (module, path)

    port = free_port()
    env = origin_env(redis_url, provider.url, PATH=f"{venv / 'bin'}:/usr/bin:/bin")
    serve = [str(venv / "bin" / "prism"), "origin", "serve", "--port", str(port)]
    server = subprocess.Popen(
        [*serve, "--admin-port", "0", "--workers", "1"],
        env={**env, "HOME": str(tmp_path)},
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        health = wait_for(lambda: _healthy(url), timeout=CLI_START, interval=0.05)
        assert health.json()["status"] == "ok"
        body: dict[str, object] = {"model": "demo", "messages": [{"role": "user", "content": "?"}]}
        headers = {"authorization": f"Bearer {api_key}"}
        with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
            miss = client.post("/v1/chat/completions", json=body)
            assert miss.status_code == 200, miss.text
            assert miss.headers.get("x-prism-edge-cache-layer") != "redis"
            hit = wait_for(lambda: _hit(client, body), timeout=10)  # stored in the background
            assert hit.json()["choices"] == miss.json()["choices"]
    finally:
        server.terminate()
        server.wait(timeout=30)


def _healthy(url: str) -> httpx.Response | None:
    try:
        response = httpx.get(url + "/healthz", timeout=5)
    except httpx.TransportError:
        return None
    return response if response.status_code == 200 else None


def _hit(client: httpx.Client, body: dict[str, object]) -> httpx.Response | None:
    """The answer once it comes from Redis (the miss stores it in the background)."""
    response = client.post("/v1/chat/completions", json=body)
    return response if response.headers.get("x-prism-edge-cache-layer") == "redis" else None
