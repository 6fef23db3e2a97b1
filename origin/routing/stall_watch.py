"""A stalled stream told by its own pace, not by a fixed minute.

A provider's streams have a rhythm: chunks every few tens of milliseconds, and now and then
a longer silence. Each target remembers the longest silence of its recent whole streams
(``Pace``); a stream of it that goes quiet for ``FACTOR`` times the longest of them (never
less than ``FLOOR``, never more than the provider's own ``first_byte_timeout``) is stalled.
Until a target has a few whole streams behind it, its provider's limit stands.

One ``StallWatch`` per process looks at every open stream each ``TICK``: a stream costs a
counter increment per chunk and a set entry while it is open, not a timer per chunk. A
stalled stream's read is cancelled and raises ``UpstreamTimeoutError`` mid-stream, which the
flight treats as any other break (``origin.routing.resume`` may continue it elsewhere).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

__all__ = ["FACTOR", "FLOOR", "TICK", "Pace", "StallWatch", "Watched"]

TICK = 0.25  # seconds between looks at the open streams
FLOOR = 2.0  # seconds: the shortest silence taken for a stall
FACTOR = 4.0  # a stall: this many times the longest silence of the target's recent streams
_PACES = 32  # whole streams a target remembers
_LEARNED = 3  # whole streams it needs before its pace, not its provider's limit, decides


class Pace:
    """A target's recent streams' longest silences (seconds), and the limit they make."""

    __slots__ = ("_longest",)

    def __init__(self) -> None:
        self._longest: deque[float] = deque(maxlen=_PACES)

    def record(self, longest: float) -> None:
        self._longest.append(longest)

    def limit(self, ceiling: float) -> float:
        """The silence that stalls a stream of this target: at most ``ceiling``."""
        if len(self._longest) < _LEARNED:
            return ceiling
        return min(ceiling, max(FLOOR, FACTOR * max(self._longest)))


class Watched(Protocol):
    """What the watch asks of an open stream (``origin.routing.first_byte.StartedEvents``)."""

    def tick(self, seconds: float) -> None: ...


class StallWatch:
    """Every open stream, looked at each ``TICK`` while any is open."""

    __slots__ = ("_streams", "_task", "tick")

    def __init__(self, tick: float = TICK) -> None:
        self.tick = tick
        self._streams: set[Watched] = set()
        self._task: asyncio.Task[None] | None = None

    def watch(self, stream: Watched) -> None:
        self._streams.add(stream)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def forget(self, stream: Watched) -> None:
        self._streams.discard(stream)

    def __len__(self) -> int:
        return len(self._streams)

    async def _run(self) -> None:
        try:
            while self._streams:
                await asyncio.sleep(self.tick)
                for stream in list(self._streams):
                    stream.tick(self.tick)
        finally:
            self._task = None

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
