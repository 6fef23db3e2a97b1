"""The benchmark's own helper servers, and a sampler of one process's memory.

Helpers (the floor ASGI app, the Node ceiling server) run as children in their
own process groups, like the stack's parts, so stopping the benchmark leaves
nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx

from .machine import rss_mb

__all__ = ["BenchError", "HelperServer", "RssSampler"]


class BenchError(RuntimeError):
    """The benchmark could not start or a check failed; said in one line."""


class HelperServer:
    """A helper HTTP server in its own process group, logging to ``log``."""

    def __init__(self, name: str, args: list[str], log: Path) -> None:
        self.name = name
        self._log_path = log
        self._log = log.open("ab")
        self.popen = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_ready(self, url: str, timeout: float = 30.0) -> None:
        """Until a POST to ``url`` gets any answer below 500."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise BenchError(f"{self.name} exited at start-up (see {self._log_path})")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.post(url, content=b"{}", timeout=1).status_code < 500:
                    return
            time.sleep(0.05)
        raise BenchError(f"{self.name} did not answer at {url} within {timeout:.0f} s")

    def stop(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        self._log.close()


class RssSampler:
    """The peak RSS of one process while ``active`` is set (sampled every 50 ms)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0
        self.active = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-rss", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            if self.active:
                self.peak = max(self.peak, rss_mb(self.pid))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
