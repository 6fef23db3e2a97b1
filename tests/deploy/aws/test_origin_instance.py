"""What runs on the origin instance, run here: the install step (a fresh venv from the built
wheel with --require-hashes), the user-data under shellcheck, the Caddyfile under
`caddy validate` and a real Caddy (503 JSON until the origin answers), and the deployer's
HTTPS health check against a real TLS server."""

from __future__ import annotations

import http.server
import json
import os
import platform
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from deploy.aws import userdata
from deploy.aws.health import check_health, probe
from deploy.aws.userdata import HEALTH_HOST, WATCHDOG_SECONDS, render_caddyfile, render_user_data
from deploy.release import Release, ReleaseTarget, build_release, compile_lock, requirements_text
from tests.polling import wait_for

REPO = Path(__file__).resolve().parents[3]
RELEASE = "0123456789abcdef"
needs_shellcheck = pytest.mark.skipif(
    shutil.which("shellcheck") is None, reason="shellcheck is not installed (apt-get install)"
)
needs_caddy = pytest.mark.skipif(
    shutil.which("caddy") is None, reason="caddy is not installed (apt-get install caddy)"
)


def user_data(*, acme: bool, files: dict[str, str] | None = None) -> str:
    return render_user_data(
        region="ap-south-1",
        parameter_path="/prism/origin/main",
        required=("REDIS_URL", "PRISM_KEY_SECRET", "PRISM_FORWARD_SECRET"),
        site="origin.example.com" if acme else "203.0.113.7",
        acme=acme,
        bucket="prism-releases-123456789012-ap-south-1",
        prefix=f"origin/main/releases/{RELEASE}/",
        release=RELEASE,
        files=files or {"prism_edge_gateway-0.1.0-py3-none-any.whl": "0" * 64},
    )


def embedded(script: str, name: str) -> str:
    found = re.search(rf"{re.escape(name)} <<'PRISM_EOF'\n(.*?)\nPRISM_EOF", script, re.S)
    assert found is not None, name
    return found.group(1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- the install step ----------------------------------------------------------------


def this_machine() -> ReleaseTarget:
    """This interpreter and platform, as a target (the instance's is Ubuntu's 3.12)."""
    libc = os.confstr("CS_GNU_LIBC_VERSION") or "glibc 2.17"
    major, minor = libc.split()[1].split(".")[:2]
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    return ReleaseTarget("here", python, f"{platform.machine()}-manylinux_{major}_{minor}")


@pytest.fixture(scope="module")
def local_release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    target = this_machine()
    out = tmp_path_factory.mktemp("wheel")
    return build_release(REPO, target, out, lock=compile_lock(REPO, target), compiled=False)


def install_script(tmp_path: Path, release: Release) -> tuple[Path, Path, Path]:
    """(the instance's prism-install, pointed at tmp_path; its release folder; the venv)."""
    files = {release.wheel_name: release.wheel_sha256, "requirements.txt": "?"}
    releases, venv = tmp_path / "releases", tmp_path / "venv"
    folder = releases / RELEASE
    folder.mkdir(parents=True)
    (folder / release.wheel_name).write_bytes(release.wheel)
    requirements = requirements_text(
        release.lock, release.wheel_name, release.wheel_sha256, RELEASE, root=str(releases)
    )
    (folder / "requirements.txt").write_text(requirements)
    files["requirements.txt"] = __import__("hashlib").sha256(requirements.encode()).hexdigest()
    source = embedded(user_data(acme=True, files=files), "/opt/prism/bin/prism-install")
    source = source.replace(
        "RELEASE_DIR = '/opt/prism/releases'", f"RELEASE_DIR = {str(releases)!r}"
    )
    source = source.replace("VENV = '/opt/prism/venv'", f"VENV = {str(venv)!r}")
    script = tmp_path / "prism-install"
    script.write_text(source)
    return script, folder, venv


@pytest.mark.timeout(900)
def test_install_step_puts_this_checkout_into_a_fresh_venv_with_require_hashes(
    local_release: Release, tmp_path: Path
) -> None:
    script, _, venv = install_script(tmp_path, local_release)

    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)

    assert done.returncode == 0, done.stdout + done.stderr
    assert f"installed release {RELEASE}" in done.stdout
    python = venv / "bin" / "python"
    shown = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m, origin, deploy; "
            "print(m.version('prism-edge-gateway'), origin.__file__)",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,  # not this checkout's folder, which would shadow the venv's copy
    ).stdout.split()
    assert shown[0] == "0.1.0"
    assert shown[1].startswith(str(venv))  # the wheel's copy, not this checkout
    help_text = subprocess.run(
        [str(venv / "bin" / "prism"), "origin", "serve", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--port" in help_text
    # The wheel holds exactly this tree's modules.
    installed = Path(shown[1]).parent
    assert sorted(p.name for p in installed.glob("*.py")) == sorted(
        p.name for p in (REPO / "origin").glob("*.py")
    )
    # Run again: already installed, nothing is rebuilt.
    again = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert again.returncode == 0 and "is installed" in again.stdout


def test_install_step_refuses_a_wheel_that_does_not_match_its_hash(
    local_release: Release, tmp_path: Path
) -> None:
    script, folder, venv = install_script(tmp_path, local_release)
    wheel = folder / local_release.wheel_name
    wheel.write_bytes(wheel.read_bytes() + b"tampered")

    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)

    assert done.returncode != 0
    assert "does not match its hash" in done.stderr
    assert not wheel.exists() and not venv.exists()


# --- user-data and Caddyfile ---------------------------------------------------------


@needs_shellcheck
@pytest.mark.parametrize("acme", [True, False])
def test_user_data_passes_shellcheck(acme: bool, tmp_path: Path) -> None:
    script = tmp_path / "user-data.sh"
    script.write_text(user_data(acme=acme))

    done = subprocess.run(
        ["shellcheck", "--shell=bash", str(script)], capture_output=True, text=True
    )

    assert done.returncode == 0, done.stdout


def test_user_data_starts_caddy_before_the_origin_and_the_units_independently() -> None:
    script = user_data(acme=True)

    assert script.index("systemctl restart caddy.service") < script.index("prism-install <<")
    assert "systemctl start --no-block prism-origin.service" in script
    unit = embedded(script, "/etc/systemd/system/prism-origin.service")
    assert "Requires=" not in unit and "caddy" not in unit  # neither waits for the other
    assert "ExecStartPre=+/opt/prism/bin/prism-install" in unit
    assert "ExecStartPre=/opt/prism/bin/prism-fetch-env" in unit
    assert "Restart=always" in unit and "StartLimitIntervalSec=0" in unit
    assert "ID:-}-$" in script and "ubuntu-24.04" in script  # refuses another image


def test_the_origin_unit_is_restarted_by_systemds_watchdog_when_its_loop_hangs() -> None:
    unit = embedded(user_data(acme=True), "/etc/systemd/system/prism-origin.service")
    # Ready when it serves, then alive only while its event loop pings (origin.http.watchdog).
    assert "Type=notify" in unit and "NotifyAccess=main" in unit
    assert f"WatchdogSec={WATCHDOG_SECONDS}" in unit and "Restart=always" in unit
    # Caddy takes a hung or lagging origin out meanwhile (its /healthz fails or is a 503).
    caddyfile = embedded(user_data(acme=True), "/etc/caddy/Caddyfile")
    assert "health_uri /healthz" in caddyfile and "health_timeout 1s" in caddyfile


@needs_caddy
@pytest.mark.parametrize("acme", [True, False])
def test_caddyfile_validates(acme: bool, tmp_path: Path) -> None:
    site = "origin.example.com" if acme else "203.0.113.7"
    caddyfile = tmp_path / "Caddyfile"
    caddyfile.write_text(embedded(user_data(acme=acme), "/etc/caddy/Caddyfile") + "\n")
    assert caddyfile.read_text().startswith(render_caddyfile(site, acme=acme)[:20])

    done = subprocess.run(
        ["caddy", "validate", "--config", str(caddyfile), "--adapter", "caddyfile"],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data")},
    )

    assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture
def caddy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[int, int, socket.socket]]:
    """A real Caddy on the rendered Caddyfile (ports moved): (its https port, the origin's
    port, a socket bound to that port and not listening). The socket keeps the port from
    any other process of a parallel suite (Caddy would proxy to it) and refuses Caddy's
    connections like a stopped origin; close it to start one there."""
    reserved = socket.socket()
    reserved.bind(("127.0.0.1", 0))
    origin_port, https_port = int(reserved.getsockname()[1]), free_port()
    monkeypatch.setattr(userdata, "ORIGIN_PORT", origin_port)
    text = render_caddyfile("203.0.113.7", acme=False)
    text = text.replace(
        "{\n\tdefault_sni",
        f"{{\n\tadmin off\n\tskip_install_trust\n\thttp_port {free_port()}\n"
        f"\thttps_port {https_port}\n\tdefault_sni",
        1,
    )
    caddyfile = tmp_path / "Caddyfile"
    caddyfile.write_text(text + "\n")
    env = {**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    process = subprocess.Popen(
        ["caddy", "run", "--config", str(caddyfile), "--adapter", "caddyfile"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _answers(https_port), timeout=30)
        yield https_port, origin_port, reserved
    finally:
        reserved.close()
        process.terminate()
        process.wait(timeout=10)


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _answer(port: int, status: int) -> httpx.Response | None:
    """Caddy's answer once it is ``status`` (None while it is starting or still another)."""
    try:
        response = _get(port)
    except httpx.TransportError:
        return None
    return response if response.status_code == status else None


def _get(port: int) -> httpx.Response:
    with httpx.Client(verify=False, timeout=5) as client:
        return client.get(
            f"https://127.0.0.1:{port}/healthz",
            headers={"Host": HEALTH_HOST},
            extensions={"sni_hostname": HEALTH_HOST},
        )


@needs_caddy
def test_caddy_answers_a_503_json_until_the_origin_is_up(
    caddy: tuple[int, int, socket.socket],
) -> None:
    https_port, origin_port, reserved = caddy

    down = wait_for(lambda: _answer(https_port, 503), timeout=30)

    assert down.headers["content-type"] == "application/json"
    assert down.json()["error"]["code"] == "origin_unavailable"
    reserved.close()
    with _Server(origin_port, {"status": "ok", "version": RELEASE}, tls=None):
        up = wait_for(lambda: _answer(https_port, 200), timeout=30)
        assert up.json()["version"] == RELEASE


# --- the health check ----------------------------------------------------------------


class _Server:
    """A one-route HTTP(S) server answering ``body`` (JSON) with ``status``; records SNI."""

    def __init__(
        self, port: int, body: Any, *, tls: ssl.SSLContext | None, status: int = 200
    ) -> None:
        self.sni: list[str | None] = []
        payload, code = json.dumps(body).encode(), status

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        if tls is not None:
            tls.sni_callback = lambda _sock, name, _ctx: self.sni.append(name)
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> _Server:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def server_tls() -> ssl.SSLContext:
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(HEALTH_HOST).configure_cert(context)
    return context


@pytest.mark.parametrize(
    ("status", "body", "problem"),
    [
        (200, {"status": "ok", "version": RELEASE}, None),
        (
            200,
            {"status": "ok", "version": "fedcba9876543210"},
            "reports version 'fedcba9876543210'",
        ),
        (200, {"status": "ok"}, "reports version None"),
        (200, {"status": "degraded", "version": RELEASE}, "status is 'degraded'"),
        (503, {"error": {"code": "origin_unavailable"}}, "answered 503"),
    ],
)
def test_health_check_wants_https_ok_and_the_expected_version(
    server_tls: ssl.SSLContext, status: int, body: Any, problem: str | None
) -> None:
    port = free_port()
    with (
        _Server(port, body, tls=server_tls, status=status) as server,
        httpx.Client(verify=False, timeout=5) as client,
    ):
        found = probe(client, f"127.0.0.1:{port}", RELEASE)

    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found
    assert server.sni == [HEALTH_HOST]  # Caddy picks its health-check site by this name


def test_health_check_gives_up_at_its_deadline_and_says_why() -> None:
    port = free_port()  # nothing listens
    slept: list[float] = []

    found = check_health(f"127.0.0.1:{port}", RELEASE, deadline=0.0, sleep=slept.append)

    assert found is not None and "ConnectError" in found and slept == []
