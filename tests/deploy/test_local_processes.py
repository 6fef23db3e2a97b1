"""A local stack's child dies with its parent, even one killed by SIGKILL (Linux's
parent-death signal), and nothing breaks where that signal cannot be had."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from deploy.local import ports, processes
from deploy.local.processes import ChildProcess, ChildStartError, die_with_us
from tests.polling import wait_for

# A parent that starts a child as the stack does, says its pid, and waits to be killed.
_PARENT = """
import sys, time
from pathlib import Path
from deploy.local.processes import ChildProcess
child = ChildProcess("sleeper", ["sleep", "600"], Path(sys.argv[1]))
print(child.pid, flush=True)
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the signal is Linux's")
def test_a_child_dies_with_its_parent_killed(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(tmp_path / "sleeper.log")],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert not _gone(child)
        parent.kill()
        parent.wait(timeout=10)
        wait_for(lambda: _gone(child), timeout=10)
    finally:
        if not _gone(child):
            os.kill(child, signal.SIGKILL)


def test_no_parent_death_signal_off_the_main_thread() -> None:
    # It would fire when that thread ends, long before the process does.
    found: list[object] = []
    thread = threading.Thread(target=lambda: found.append(die_with_us()))
    thread.start()
    thread.join()
    assert found == [None]


def test_without_prctl_children_start_all_the_same(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(processes, "_PRCTL", None)  # as on macOS
    assert die_with_us() is None
    child = processes.ChildProcess("true", ["true"], tmp_path / "true.log")
    assert child.popen.wait(timeout=10) == 0
    child.stop()


def test_a_child_that_exits_at_start_up_says_why_in_the_error(tmp_path: Path) -> None:
    """The error carries the end of the child's output: a CI run keeps the message, not
    the log file it names."""
    script = "import sys; print('early line'); sys.exit('Error: [Errno 98] address in use')"
    child = ChildProcess("origin", [sys.executable, "-c", script], tmp_path / "child.log")
    try:
        with pytest.raises(ChildStartError, match="exited at start-up") as raised:
            child.wait_http("http://127.0.0.1:9/healthz", timeout=30)
    finally:
        child.stop()
    assert str(raised.value).splitlines()[-2:] == [
        "early line",
        "Error: [Errno 98] address in use",
    ]


def test_ports_handed_out_are_not_handed_out_again_and_shares_do_not_overlap() -> None:
    before = list(ports._PORTS)
    try:
        ports.share_ports(0, 2)
        first = {ports.free_port() for _ in range(300)}
        ports.share_ports(1, 2)
        second = {ports.free_port() for _ in range(300)}
    finally:
        ports._PORTS[:] = before
    assert len(first) == len(second) == 300  # no port twice, though none was bound
    assert max(first) < min(second)
