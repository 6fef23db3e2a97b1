"""The benchmark's own helper servers, and a sampler of one process's memory.

Helpers (the floor ASGI app, the Node ceiling server) run as children in their
own process groups, like the stack's parts, so stopping the benchmark leaves
nothing behind.
"""

from __future__ import annotations

import threading

from deploy.local.processes import ChildProcess, ChildStartError

from .machine import rss_mb

__all__ = ["BenchError", "HelperServer", "RssSampler"]


class BenchError(RuntimeError):
    """The benchmark could not start or a check failed; said in one line."""


class HelperServer(ChildProcess):
    """A helper HTTP server (the floor app, the Node ceiling), stopped with its group."""

    def wait_ready(self, url: str, timeout: float = 30.0) -> None:
        """Until a POST to ``url`` gets any answer below 500."""
        try:
            self.wait_http(url, timeout=timeout, method="POST")
        except ChildStartError as error:
            raise BenchError(str(error)) from None


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
