"""Child processes of the local stack and the benchmark: each in its own process group,
and each dying with us where the kernel can see to it (Linux's parent-death signal)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

__all__ = ["ChildProcess", "ChildStartError", "die_with_us", "process_tree", "stop_group"]

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    # Every argument an unsigned long, as the kernel reads them (prctl is variadic).
    prctl.argtypes = [ctypes.c_int, *[ctypes.c_ulong] * 4]
    prctl.restype = ctypes.c_int
    return prctl


_PRCTL = _load_prctl()


def die_with_us(signum: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` after which the kernel sends the child ``signum`` when we die, even
    by SIGKILL; None where that cannot be had: not Linux, or not the main thread (the
    signal fires when the *thread* that forked exits, and only the main thread lives as
    long as the process)."""
    prctl = _PRCTL
    if prctl is None or threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()

    def arm() -> None:
        # Between fork and exec: no import, no lock, no logging (other threads may hold them).
        prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # we died before it was armed: nobody will send it
            os._exit(1)

    return arm


class ChildStartError(RuntimeError):
    """A child exited or stayed silent at start-up; said in one line."""


def stop_group(popen: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """SIGTERM the child's whole group, wait, then SIGKILL what is left."""
    if popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGTERM)
            os.killpg(popen.pid, signal.SIGCONT)  # a stopped child handles it only then
        try:
            popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait()


def process_tree(root: int) -> list[int]:
    """``root`` and every live process below it (children in new sessions included)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
    tree, frontier = [root], [root]
    while frontier:
        current = frontier.pop()
        children = [pid for pid, parent in parents.items() if parent == current]
        tree.extend(children)
        frontier.extend(children)
    return tree


class ChildProcess:
    """A child in its own process group, its output in ``log``; stop() ends the group, and
    our death (even by SIGKILL, on Linux) sends the child SIGTERM; ``cwd``: where it runs
    (ours if not given)."""

    def __init__(
        self,
        name: str,
        args: list[str],
        log: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.log_path = log
        self._log = log.open("ab")
        self.popen = subprocess.Popen(
            args,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_us(),
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_http(self, url: str, *, timeout: float = 30.0, method: str = "GET") -> None:
        """Until ``url`` answers below 500; ``ChildStartError`` if the child dies or stays mute."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise ChildStartError(
                    f"{self.name} exited at start-up ({self.log_path}):\n{self.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                body = b"{}" if method == "POST" else None
                if httpx.request(method, url, content=body, timeout=1).status_code < 500:
                    return
            time.sleep(0.05)  # polling a child we do not control, with a deadline
        raise ChildStartError(
            f"{self.name} did not answer at {url} within {timeout:.0f} s:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 20) -> str:
        """The end of the child's output: why it exited, said where the error is raised
        (a CI run keeps the message, not the log file)."""
        if not self._log.closed:
            self._log.flush()
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as error:
            return f"(its log cannot be read: {error})"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        stop_group(self.popen, timeout)
        self._log.close()
