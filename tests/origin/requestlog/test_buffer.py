"""RecordBuffer on its own: batches, retries a failed batch whole, drops the oldest past
its bound (counted), flushes at close. Its sink here is a list that can be told to fail."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from origin.requestlog.buffer import RecordBuffer
from origin.requestlog.record import Logged, logged
from tests.polling import async_wait_for


class ListSink:
    name = "list"

    def __init__(self) -> None:
        self.batches: list[list[Logged]] = []
        self.failing = False
        self.closed = False

    async def write(self, records: Sequence[Logged]) -> None:
        if self.failing:
            raise ConnectionError("down")
        self.batches.append(list(records))

    async def close(self) -> None:
        self.closed = True


def _buffer(sink: ListSink, bound: int, **options: Any) -> tuple[RecordBuffer, CollectorRegistry]:
    registry = CollectorRegistry()
    written = Counter("written", "", ("sink",), registry=registry)
    dropped = Counter("dropped", "", ("sink",), registry=registry)
    return RecordBuffer(sink, bound, written, dropped, **options), registry


def _record(n: int) -> Logged:
    return logged({"id": str(n), "ts": 1.0, "ttfb_ms": 1.0, "total_ms": 2.0, "stages": {}})


def _count(registry: CollectorRegistry, name: str) -> float:
    return registry.get_sample_value(f"{name}_total", {"sink": "list"}) or 0.0


def test_a_full_batch_is_written_at_once_whole_and_counted() -> None:
    async def run() -> None:
        sink = ListSink()
        buffer, registry = _buffer(sink, 100, batch=10, interval=60)
        buffer.start()
        for n in range(10):
            buffer.append(_record(n))
        await async_wait_for(lambda: sink.batches, within=5)
        (batch,) = sink.batches
        assert batch == [_record(n) for n in range(10)]  # in order, each as appended
        assert _count(registry, "written") == 10
        await buffer.close()
        assert sink.closed

    asyncio.run(run())


class SlowSink(ListSink):
    """A sink whose write takes a moment, and records arriving meanwhile."""

    def __init__(self, buffer_ref: list[RecordBuffer]) -> None:
        super().__init__()
        self.buffer_ref = buffer_ref

    async def write(self, records: Sequence[Logged]) -> None:
        await super().write(records)
        if len(self.batches) == 1:  # two records come while the first batch is written
            for n in (100, 101):
                self.buffer_ref[0].append(_record(n))


def test_what_arrives_during_a_write_waits_for_the_next_interval_not_a_batch_of_its_own() -> None:
    async def run() -> None:
        held: list[RecordBuffer] = []
        sink = SlowSink(held)
        buffer, _ = _buffer(sink, 100, batch=10, interval=60)
        held.append(buffer)
        buffer.start()
        for n in range(10):
            buffer.append(_record(n))
        await async_wait_for(lambda: sink.batches, within=5)
        await asyncio.sleep(0)  # the task's next turns: it must not write the two now
        await asyncio.sleep(0)
        assert len(sink.batches) == 1 and buffer.queued == 2
        await buffer.close()  # they are written at close (or at the next interval)
        assert [r[3] for r in sink.batches[-1]] == ["100", "101"]

    asyncio.run(run())


def test_a_failed_batch_is_retried_whole_and_the_oldest_beyond_the_bound_dropped() -> None:
    async def run() -> None:
        sink = ListSink()
        sink.failing = True
        buffer, registry = _buffer(sink, 5, batch=3, interval=0.01, first_backoff=0.01)
        buffer.start()
        for n in range(3):
            buffer.append(_record(n))
        await async_wait_for(lambda: buffer.queued == 3 and not buffer._queue, within=5)
        for n in range(3, 10):  # 7 more while the first 3 are held: the queue keeps 5
            buffer.append(_record(n))
        assert _count(registry, "dropped") == 2 and buffer.queued == 8
        sink.failing = False
        await async_wait_for(lambda: buffer.queued == 0, within=5)
        ids = [r[3] for batch in sink.batches for r in batch]
        assert ids == ["0", "1", "2", "5", "6", "7", "8", "9"]
        assert _count(registry, "written") == 8
        await buffer.close()

    asyncio.run(run())


def test_close_flushes_what_is_left_and_counts_what_cannot_be_written() -> None:
    async def run() -> None:
        sink = ListSink()
        buffer, registry = _buffer(sink, 100, interval=60, close_timeout=0.5)
        buffer.start()
        buffer.append(_record(1))
        await buffer.close()
        assert [r[3] for batch in sink.batches for r in batch] == ["1"]

        down = ListSink()
        down.failing = True
        buffer, registry = _buffer(down, 100, interval=60, close_timeout=0.5)
        buffer.start()
        buffer.append(_record(2))
        await buffer.close()
        assert _count(registry, "dropped") == 1 and down.closed

    asyncio.run(run())
