"""Where request records go: the one interface every destination implements.

A sink receives whole batches from its ``RecordBuffer`` (``origin.requestlog.buffer``), each
record as its JSON and the fields sinks route it by (``origin.requestlog.record.Logged``):
one background task per sink calls ``write`` with up to a batch of records, and retries
the same batch with backoff when it raises. A sink so either stores the whole batch or
raises; it never reports success for a part of it silently. ``close`` is awaited once,
after the last flush at shutdown. A sink may say how it wants its batches, as class
attributes ``flush_interval`` (seconds) and ``flush_records`` (the most a batch holds);
without them, a batch a second of at most 1,000.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .record import Logged

__all__ = ["RecordSink"]


class RecordSink(Protocol):
    """A destination for request records (the Redis window, durable files, OTLP logs)."""

    name: str  # "redis", "files", "otlp": the metric label

    async def write(self, records: Sequence[Logged]) -> None:
        """Store the whole batch or raise (the buffer retries it); never a part silently."""
        ...

    async def close(self) -> None:
        """Release what the sink holds; awaited once, after the last flush."""
        ...
