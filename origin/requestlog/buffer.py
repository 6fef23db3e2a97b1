"""Records on their way to one sink: taken on the request path, written in batches.

``append`` is what a request pays: an O(1) append to a bounded deque and no I/O. One
background task per sink takes up to ``batch`` records at a time, every ``interval`` or as
soon as a batch is ready, and hands them to the sink (each record as its JSON and the
fields sinks route by, ``origin.requestlog.record.Logged``: nothing the garbage collector
walks); after a write it goes on only while a whole batch waits (what arrived
during the write waits for the next interval, so a sink that wants few large batches, the
files, does not get a small one after each). A batch the sink fails is held and retried
with backoff (doubling to ``max_backoff``) while new records queue behind it; beyond
``bound`` queued records the oldest are dropped and counted
(``prism_request_log_dropped_total{sink}``), so an outage costs memory up to the bound and
never a request's time. Written records are counted
(``prism_request_log_written_total{sink}``). ``close`` flushes what is left, for at most
``close_timeout``, then closes the sink.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

from prometheus_client import Counter

from ..background import cancel_and_wait
from .record import Logged
from .sink import RecordSink

__all__ = ["RecordBuffer"]

log = logging.getLogger("prism.origin")


class RecordBuffer:
    __slots__ = (
        "_batch",
        "_bound",
        "_close_timeout",
        "_dropped",
        "_failing",
        "_first_backoff",
        "_held",
        "_interval",
        "_max_backoff",
        "_queue",
        "_task",
        "_wake",
        "_written",
        "sink",
    )

    def __init__(
        self,
        sink: RecordSink,
        bound: int,
        written: Counter,
        dropped: Counter,
        *,
        batch: int = 1000,
        interval: float = 1.0,
        first_backoff: float = 0.5,
        max_backoff: float = 10.0,
        close_timeout: float = 5.0,
    ) -> None:
        self.sink = sink
        self._queue: deque[Logged] = deque(maxlen=bound)
        self._bound = bound  # the deque's maxlen, an attribute lookup where this is a field
        self._batch = batch
        self._interval = interval
        self._first_backoff = first_backoff
        self._max_backoff = max_backoff
        self._close_timeout = close_timeout
        self._written = written.labels(sink.name)
        self._dropped = dropped.labels(sink.name)
        self._held: list[Logged] = []  # the batch being written (or retried)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failing = False  # said once per outage, not per retry

    @property
    def queued(self) -> int:
        """Records waiting, the batch being written included."""
        return len(self._queue) + len(self._held)

    def append(self, record: Logged) -> None:
        queue = self._queue
        if len(queue) == self._bound:  # full: the deque drops the oldest
            self._dropped.inc()
        queue.append(record)
        if len(queue) >= self._batch:
            self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        wake = self._wake
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval):
                    await wake.wait()
            wake.clear()
            delay = self._first_backoff
            while self._queue or self._held:
                if await self._write_once():
                    if len(self._queue) < self._batch:
                        break  # what came meanwhile waits for its interval: fewer, fuller batches
                    delay = self._first_backoff
                else:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self._max_backoff)

    async def _write_once(self) -> bool:
        """Write the held batch, or the next one; False when the sink failed it (it stays
        held, to be retried)."""
        if not self._held:
            queue = self._queue
            self._held = [queue.popleft() for _ in range(min(len(queue), self._batch))]
        try:
            await self.sink.write(self._held)
        except Exception as error:
            if not self._failing:
                self._failing = True
                log.warning(
                    "request log: sink %s failed a batch of %d records (%s); retrying, "
                    "%d records at most wait meanwhile",
                    self.sink.name,
                    len(self._held),
                    type(error).__name__,
                    self._queue.maxlen,
                )
            return False
        if self._failing:
            self._failing = False
            log.warning("request log: sink %s writes again", self.sink.name)
        self._written.inc(len(self._held))
        self._held = []
        return True

    async def close(self) -> None:
        """Stop the task, write what is left (within ``close_timeout``; what is not written
        by then is counted dropped), and close the sink."""
        await cancel_and_wait(self._task)
        self._task = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._close_timeout):
                while (self._queue or self._held) and await self._write_once():
                    pass
        lost = self.queued
        if lost:
            self._dropped.inc(lost)
            self._queue.clear()
            self._held = []
        await self.sink.close()
