"""`prism dev` as a user runs it: a subprocess, a smoke test against it, Ctrl-C, nothing left."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from deploy.local.ports import free_port
from deploy.local.processes import process_tree
from tests.fixtures.stacks import (
    CLI_START,
    PRISM,
    STACK_START,
    STACK_STOP,
    STACK_TEST_TIMEOUT,
    prism_dev,
    read_line,
    stack_env,
)
from tests.polling import wait_for


def descendants(root: int) -> set[int]:
    """Every live process below ``root`` (children started in new sessions included)."""
    return set(process_tree(root)) - {root}


def _argv(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def _environ(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
    return dict(pair.split("=", 1) for pair in pairs if "=" in pair)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.timeout(STACK_TEST_TIMEOUT)
def test_prism_dev_serves_miss_then_kv_and_stops_cleanly_on_sigint(tmp_path: Path) -> None:
    env = stack_env()
    dev = prism_dev(tmp_path / "state", env)
    try:
        info = json.loads(read_line(dev, timeout=STACK_START))
        assert info["provider"] == "demo (local)"
        children = descendants(dev.pid)
        assert len(children) >= 4  # redis, provider, origin, runtime (+ workerd)
        # The request log's durable files go to the state directory (`prism logs query`).
        origins = [pid for pid in children if _argv(pid)[3:5] == ["origin", "serve"]]
        logs = str((tmp_path / "state" / "logs" / "requests").resolve())
        assert origins and all(_environ(pid)["PRISM_LOG_DIR"] == logs for pid in origins)
        assert all(_environ(pid)["PRISM_LOG_FILES_INTERVAL"] == "5" for pid in origins)

        smoke = subprocess.run(
            [*PRISM, "smoke", info["edge_url"], "--key", info["api_key"], "--json", "--pause", "1.5"],
            capture_output=True, text=True, timeout=CLI_START, env=env,
        )  # fmt: skip
        assert smoke.returncode == 0, smoke.stderr
        rows = json.loads(smoke.stdout)
        assert [row["status"] for row in rows] == [200, 200, 200]
        assert rows[0]["layer"] == "miss"
        assert rows[2]["layer"] == "kv"

        status = subprocess.run(
            [*PRISM, "status", "--state-dir", str(tmp_path / "state"), "--json"],
            capture_output=True, text=True, timeout=CLI_START, env=env,
        )  # fmt: skip
        assert status.returncode == 0, status.stdout + status.stderr
        # the path row: the dev key (derived from the state folder) got through to the origin
        assert {c["part"]: c["state"] for c in json.loads(status.stdout)} == {
            "origin": "ok",
            "edge": "ok",
            "path": "ok",
            "redis": "ok",
        }
    finally:
        dev.send_signal(signal.SIGINT)
        dev.wait(timeout=STACK_STOP)
    assert dev.returncode == 0
    wait_for(lambda: not any(alive(pid) for pid in children), timeout=20, interval=0.1)


def test_port_in_use_is_one_clear_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = subprocess.run(
            [*PRISM, "dev", "--edge-port", port, "--origin-port", str(free_port()),
             "--kv-port", str(free_port()), "--state-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=CLI_START,
        )  # fmt: skip
    assert result.returncode == 1
    assert f"port {port} (edge) is in use" in result.stderr
    assert "Traceback" not in result.stderr
