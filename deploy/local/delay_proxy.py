"""A TCP proxy that delays every byte by a fixed one-way time: distance, on one machine.

Where the kernel has no ``netem`` (no qdisc modules in this machine's kernel), this puts a
region's distance between two local parts: each chunk read on one side is written to the
other ``delay`` seconds later, in order, in both directions, so a round trip costs
``2 * delay`` and bandwidth is not limited. It runs its own event loop in a thread.

It also breaks a connection on request, as a network path does: ``cut_in_body(n)`` cuts
the next ``n`` HTTP answers from the target a few bytes into their body (the head
delivered, then both sides closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType

from deploy.local.ports import free_port

__all__ = ["DelayProxy"]

_CHUNK = 65_536
_CUT_AT = 5  # bytes of a cut answer's body that still arrive


class DelayProxy:
    """``host:port`` forwards to ``target``, ``delay`` seconds each way."""

    def __init__(
        self, target_host: str, target_port: int, delay: float, host: str = "127.0.0.1"
    ) -> None:
        self.target = (target_host, target_port)
        self.delay = delay
        self.host = host
        self.port = free_port(host)
        self.connections = 0  # accepted so far
        self.cuts_left = 0  # answers still to cut in their body (see cut_in_body)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def cut_in_body(self, count: int = 1) -> None:
        """Cut the next ``count`` answers (on any connection) just after their head."""
        self.cuts_left = count

    def start(self) -> DelayProxy:
        ready = threading.Event()
        loop = self._loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            self._server = loop.run_until_complete(
                asyncio.start_server(self._serve, self.host, self.port)
            )
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="prism-delay-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise TimeoutError("the delay proxy did not start")
        return self

    def stop(self) -> None:
        loop, server, thread = self._loop, self._server, self._thread
        if loop is None or thread is None:
            return

        async def close() -> None:
            if server is not None:
                server.close()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # let them close sockets

        asyncio.run_coroutine_threadsafe(close(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
        self._loop = self._server = self._thread = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        # Stopping cancels this task; it ends quietly (asyncio logs a cancelled handler).
        with contextlib.suppress(asyncio.CancelledError):
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.target)
            except OSError:
                writer.close()  # the target is down: so is the connection, as it would be
                return
            try:
                await asyncio.gather(
                    self._pipe(reader, up_writer),
                    self._pipe(up_reader, writer, answers=True),
                    return_exceptions=True,
                )
            finally:
                writer.close()
                up_writer.close()

    async def _pipe(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, answers: bool = False
    ) -> None:
        """Copy ``source`` to ``sink``, each chunk ``delay`` after it was read; on the
        ``answers`` side, an answer to cut ends the connection a few bytes into its body."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    break
                sink.write(data)
                await sink.drain()
            with contextlib.suppress(OSError):
                sink.write_eof() if sink.can_write_eof() else sink.close()

        delivering = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await source.read(_CHUNK)
                head_end = data.find(b"\r\n\r\n") if answers and self.cuts_left else -1
                if head_end >= 0:
                    self.cuts_left -= 1
                    queue.put_nowait((loop.time() + self.delay, data[: head_end + 4 + _CUT_AT]))
                    data = b""  # and the end: the rest of the answer never arrives
                queue.put_nowait((loop.time() + self.delay, data))
                if not data:  # the end, delivered after the same delay
                    break
            await delivering
        finally:
            delivering.cancel()

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
