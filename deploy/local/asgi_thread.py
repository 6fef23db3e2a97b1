"""Serve an ASGI app with uvicorn in a background thread on loopback (tests, benchmarks)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from types import TracebackType
from typing import Any, Literal

import uvicorn

__all__ = ["ThreadedServer"]


class ThreadedServer:
    """``with ThreadedServer(app) as server: httpx.get(server.url + "/healthz")``"""

    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        lifespan: Literal["auto", "on", "off"] = "on",
        graceful_shutdown: int = 2,
        **options: Any,  # more uvicorn.Config settings
    ):
        self.app = app
        self.host = host
        self.port = port
        self._lifespan = lifespan
        self._graceful_shutdown = graceful_shutdown
        # Every app served here is ASGI 3; said, as uvicorn cannot tell for a compiled one.
        self._options = {"interface": "asgi3", **options}
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop serving, once started (tests block it to play a hung server)."""
        if self._server is None or not self._server.servers:
            raise RuntimeError("the server is not running")
        return self._server.servers[0].get_loop()

    def start(
        self, timeout: float = 10.0, sockets: list[socket.socket] | None = None
    ) -> ThreadedServer:
        """Serve on ``sockets`` (the first one is ``url``), else on a socket bound here."""
        if not sockets:
            # Bind first and hand the socket over: no window for another process to take it.
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sockets = [sock]
        self.host, self.port = sockets[0].getsockname()[:2]
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            log_config=None,
            access_log=False,
            lifespan=self._lifespan,
            timeout_graceful_shutdown=self._graceful_shutdown,
            **self._options,
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": sockets}, name=f"asgi-{self.port}", daemon=True
        )
        thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                server.should_exit = True
                thread.join(timeout=5)
                for sock in sockets:
                    sock.close()
                raise RuntimeError(f"server did not start on {self.url}")
            time.sleep(0.005)
        self._server, self._thread = server, thread
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None or thread is None:
            return
        server.should_exit = True
        thread.join(timeout=10)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout=5)

    def __enter__(self) -> ThreadedServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
