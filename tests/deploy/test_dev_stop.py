"""`make dev` and `prism dev` stopped every way they are in practice (a process manager's
SIGTERM to the group, Ctrl-C, the terminal closing, SIGHUP, SIGKILL of prism dev or of make)
leave no process and no listening port behind, and the next start on the same ports comes up.

The cases share their ports and state folder (per xdist worker) and run in order, so each
start is also the start right after the previous stop. A start costs seconds of CPU, most of
it the Workers runtime booting Pyodide: so every case but the last stops the stack once its
processes have started (each start got past the port check that failed in the bug), and the
last start, after all those stops, waits until the stack is up.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from deploy.local.ports import free_port
from deploy.local.processes import process_tree
from tests.fixtures.stacks import PRISM, as_foreground_job, stack_env
from tests.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
# The stack's processes, by what their command lines hold: redis, the demo provider, the
# origin, the Workers runtime (node), and last to start, workerd under node.
STARTED = ("redis-server", "deploy.local.provider", "origin serve", "runtime.mjs")
WORKERD = "workerd"
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp


@dataclass(frozen=True)
class Place:
    origin_port: int
    edge_port: int
    kv_port: int
    state: Path

    def args(self) -> list[str]:
        return ["--origin-port", str(self.origin_port), "--edge-port", str(self.edge_port),
                "--kv-port", str(self.kv_port), "--state-dir", str(self.state), "--json"]  # fmt: skip


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Place:
    return Place(free_port(), free_port(), free_port(), tmp_path_factory.mktemp("dev-stop"))


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _identity(pid: int) -> tuple[int, str] | None:
    """``pid`` with its start time (a reused pid is another process), None when gone."""
    fields = _stat(pid)
    return None if fields is None or fields[0] == "Z" else (pid, fields[19])


def _in_sessions(sessions: set[int]) -> set[int]:
    """Live processes in any of ``sessions``."""
    found = set()
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None and fields[0] != "Z" and int(fields[3]) in sessions:
            found.add(int(entry.name))
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _listening(ports: set[int] | None = None, owners: list[int] | None = None) -> set[int]:
    """Ports in LISTEN: among ``ports`` if given, held by ``owners``' sockets if given."""
    inodes: set[str] | None = None
    if owners is not None:
        inodes = set()
        for pid in owners:
            try:
                links = [os.readlink(f) for f in Path(f"/proc/{pid}/fd").iterdir()]
            except OSError:
                continue
            inodes |= {link[8:-1] for link in links if link.startswith("socket:[")}
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            cols = row.split()
            port = int(cols[1].rsplit(":", 1)[1], 16)
            mine = inodes is None or cols[9] in inodes
            if cols[3] == _LISTEN and mine and (ports is None or port in ports):
                found.add(port)
    return found


@dataclass
class Run:
    """`make dev` or `prism dev` in a session of its own, as a terminal or a process
    manager runs it; its output (stdout and stderr) read from ``fd`` as it comes."""

    via: str
    popen: subprocess.Popen[bytes]
    fd: int
    output: bytearray = field(default_factory=bytearray)
    seen: set[tuple[int, str]] = field(default_factory=set)
    sessions: set[int] = field(default_factory=set)

    def drain(self, wait: float = 0.0) -> bool:
        """Reads what is there; False once the output has ended."""
        while self.fd >= 0 and select.select([self.fd], [], [], wait)[0]:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # a pty whose other side has gone
                return False
            if not chunk:
                return False
            self.output += chunk
            wait = 0.0
        return self.fd >= 0

    def hang_up(self) -> None:
        """Closes the terminal (the pty's master side), as a terminal window or tmux does."""
        os.close(self.fd)
        self.fd = -1

    @property
    def text(self) -> str:
        return self.output.decode(errors="replace")

    @property
    def prism_dev(self) -> int:
        if self.via == "prism":
            return self.popen.pid
        children = [
            p for p in process_tree(self.popen.pid) if "dev --stop-with-parent" in _cmdline(p)
        ]
        assert children, f"no prism dev under make:\n{self.text}"
        return children[0]

    def tree(self) -> list[int]:
        pids = process_tree(self.popen.pid)
        self.seen |= {i for i in map(_identity, pids) if i is not None}
        self.sessions |= {int(f[3]) for f in map(_stat, pids) if f is not None}
        return pids

    def wait_until_running(self, until: str, timeout: float = 100) -> None:
        """Until the stack's processes have started ("started"), and workerd too
        ("workerd"), or until prism dev says the stack is up with its JSON line ("up")."""
        marks = (*STARTED, WORKERD) if until == "workerd" else STARTED
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.drain(0.25)  # between scans of /proc, which cost the stack CPU it needs
            assert self.popen.poll() is None, f"{self.via} dev exited:\n{self.text}"
            pids = self.tree()
            if until == "up":
                lines = self.text.replace("\r", "").splitlines()
                if any(line.startswith('{"edge_url"') for line in lines):
                    return
            elif all(any(mark in _cmdline(pid) for pid in pids) for mark in marks):
                return
        raise AssertionError(f"{self.via} dev not {until} within {timeout} s:\n{self.text}")

    def left(self) -> dict[int, str]:
        """The stack's processes still alive: those seen, and any other in their sessions
        (one started since the last look: workerd under node, say)."""
        alive = {pid for pid, started in self.seen if _identity(pid) == (pid, started)}
        return {pid: _cmdline(pid) for pid in alive | _in_sessions(self.sessions)}

    def kill_what_is_left(self) -> None:
        for pid in self.left():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.popen.kill()
        self.popen.wait(timeout=10)
        if self.fd >= 0:
            os.close(self.fd)


def _env() -> dict[str, str]:
    # Not the jobserver of a make running these tests.
    return stack_env("MAKEFLAGS", "MFLAGS", "MAKELEVEL")


def _command(via: str, place: Place) -> list[str]:
    if via == "prism":
        return [*PRISM, "dev", *place.args()]
    # This interpreter's prism, and no setup: the tests run in an installed tree.
    bin_dir = Path(sys.executable).parent
    return ["make", "--no-print-directory", "-C", str(ROOT), "-o", "setup", f"BIN={bin_dir}",
            "dev", "DEV_ARGS=" + " ".join(place.args())]  # fmt: skip


def _take_terminal() -> None:
    # In the child, a session leader by now: the pty on stdin becomes its terminal.
    as_foreground_job()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def start(via: str, place: Place, *, terminal: bool = False) -> Run:
    if terminal:
        # make the session leader of a terminal, as a tmux pane's command or a shell is.
        read, write = pty.openpty()
        stdin, take = write, _take_terminal
    else:
        read, write = os.pipe()
        stdin, take = subprocess.DEVNULL, as_foreground_job
    popen = subprocess.Popen(
        _command(via, place), stdin=stdin, stdout=write, stderr=write, env=_env(),
        start_new_session=True, preexec_fn=take,
    )  # fmt: skip
    os.close(write)
    return Run(via, popen, read)


def _to_group(signum: int) -> Callable[[Run], None]:
    return lambda run: os.killpg(run.popen.pid, signum)


def _kill_prism_dev(run: Run) -> None:
    os.kill(run.prism_dev, signal.SIGKILL)


def _kill_make(run: Run) -> None:
    run.popen.kill()


@dataclass(frozen=True)
class Way:
    via: str  # "make" (make dev) or "prism" (prism dev)
    stop: Callable[[Run], None]
    polite: bool  # prism dev stops the stack itself, and says so
    terminal: bool = False  # run in a terminal (its output is lost with it)
    until: str = "started"  # when it is stopped (Run.wait_until_running)


# In this order (see above).
WAYS = {
    "make-Ctrl-C": Way("make", _to_group(signal.SIGINT), polite=True),
    "make-terminal-closed": Way("make", Run.hang_up, polite=True, terminal=True),
    "make-KILL-make": Way("make", _kill_make, polite=True),
    "prism-HUP-to-group": Way("prism", _to_group(signal.SIGHUP), polite=True),
    # Nobody stops the stack: each child, workerd's node too, gets the parent-death signal.
    "prism-KILL": Way("prism", _kill_prism_dev, polite=False, until="workerd"),
    # The issue's: prism dev is sent SIGTERM twice (make forwards the group's).
    "make-TERM-to-group": Way("make", _to_group(signal.SIGTERM), polite=True, until="up"),
}


def _within(what: Callable[[], str], predicate: Callable[[], object], timeout: float) -> None:
    try:
        wait_for(predicate, timeout=timeout, interval=0.1)
    except AssertionError:
        raise AssertionError(f"after {timeout} s: {what()}") from None


@pytest.mark.parametrize("way", WAYS.values(), ids=WAYS.keys())
def test_stopped_it_leaves_nothing_and_the_next_start_comes_up(way: Way, place: Place) -> None:
    run = start(way.via, place, terminal=way.terminal)  # the start after the previous stop
    try:
        run.wait_until_running(way.until)
        ports = _listening(owners=run.tree()) | {place.origin_port, place.edge_port, place.kv_port}
        way.stop(run)
        _within(lambda: f"still running: {run.left()}", lambda: not run.left(), 30)
        _within(lambda: f"still listening: {_listening(ports)}", lambda: not _listening(ports), 10)
        deadline = time.monotonic() + 10
        while run.drain(0.1) and time.monotonic() < deadline:
            pass  # the output ends when the last of make and prism dev has exited
        if way.polite and not way.terminal:
            assert "Prism stack stopped." in run.text, run.text
            assert "***" not in run.text and "Traceback" not in run.text, run.text  # make's
        if way.polite and way.via == "prism":
            assert run.popen.wait(timeout=10) == 0, run.text
    finally:
        run.kill_what_is_left()
