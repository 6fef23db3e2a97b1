"""A stream counts as answered at its first body bytes, not at its headers.

``open_started`` starts a provider stream and waits (within the target's first-token
limit) for the first bytes, so a provider that sends its headers and then nothing is
failed over like one that never answered. The stream it returns yields those bytes
first, then the rest, and reports a ``PrismError`` raised mid-stream exactly once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from prism import PrismError, UpstreamError, UpstreamTimeoutError

from ..providers.base import ChatProvider, UpstreamStream
from .operation import Operation
from .stall_watch import Pace, StallWatch

__all__ = ["StartedEvents", "first_token_timeout", "open_started"]


class StartedEvents:
    """``first``, then the rest of ``events``; the first ``PrismError`` goes to ``on_error``,
    unless the consumer said the answer was whole first (``finish``: ``on_finish``).

    Watched while open (``watch``, ``origin.routing.stall_watch``): a silence of ``limit``
    seconds cancels the read waiting on the next chunk and raises ``UpstreamTimeoutError``;
    a whole stream tells ``pace`` its longest silence.

    A class, not an async generator: closing it must close the upstream events even when
    it was never iterated.
    """

    __slots__ = ("_events", "_first", "_idle", "_limit", "_longest", "_on_error", "_on_finish",
                 "_pace", "_provider", "_reader", "_seen", "_watch", "chunks", "reported",
                 "stalled")  # fmt: skip

    def __init__(
        self,
        first: bytes,
        events: AsyncIterator[bytes],
        on_error: Callable[[PrismError], None],
        on_finish: Callable[[], None],
        watch: StallWatch | None = None,
        pace: Pace | None = None,
        limit: float = 0.0,
        provider: str = "",
    ) -> None:
        self._first: bytes | None = first
        self._events = events
        self._on_error = on_error
        self._on_finish = on_finish
        self.reported = False  # its outcome, broken or whole, has been told
        self.chunks = 0  # read so far: what the watch sees move
        self._seen = 0
        self._idle = self._longest = 0.0
        self._limit = limit
        self._pace = pace
        self._provider = provider
        self._reader: asyncio.Task[Any] | None = None
        self.stalled = False
        self._watch = watch
        if watch is not None:
            watch.watch(self)

    def __aiter__(self) -> StartedEvents:
        return self

    async def __anext__(self) -> bytes:
        first = self._first
        if first is not None:
            self._first = None
            self._reader = asyncio.current_task()  # once: one task reads a stream
            return first
        try:
            chunk = await anext(self._events)
        except PrismError as error:
            self._forget()
            self.report(error)
            raise
        except StopAsyncIteration:
            self._forget()
            raise
        except asyncio.CancelledError:
            reader = self._reader
            if not self.stalled or reader is None or reader.uncancel() > 0:
                self._forget()
                raise  # a cancel of someone else's (the client left): not ours to turn
            stall = UpstreamTimeoutError(
                f"Provider '{self._provider}' stalled: no data for {self._limit:g} s mid-stream."
            )
            self.report(stall)
            raise stall from None
        self.chunks += 1
        return chunk

    def tick(self, seconds: float) -> None:
        """The watch's look: has a chunk come since the last one? Silent too long: stall."""
        if self.chunks != self._seen:
            self._seen, self._idle = self.chunks, 0.0
            return
        self._idle += seconds
        if self._idle > self._longest:
            self._longest = self._idle
        if self._limit and self._idle >= self._limit and not self.stalled:
            self.stalled = True
            self._forget()
            if self._reader is not None:
                self._reader.cancel()

    def _forget(self) -> None:
        if self._watch is not None:
            self._watch.forget(self)
            self._watch = None

    def report(self, error: PrismError) -> None:
        """Count a broken stream against its target once (here or from the flight)."""
        if not self.reported:
            self.reported = True
            self._on_error(error)

    def finish(self) -> None:
        """The answer is whole: a stream proves its provider healthy only now, and whatever
        happens to the rest of the body (read only to free the connection) is not the
        provider's failure."""
        self._forget()
        if not self.reported:
            self.reported = True
            if self._pace is not None:
                self._pace.record(self._longest)
            self._on_finish()

    async def aclose(self) -> None:
        self._forget()
        self._first = None
        aclose = getattr(self._events, "aclose", None)
        if aclose is not None:
            await aclose()


async def open_started(
    op: Operation,
    provider: ChatProvider,
    body: dict[str, Any],
    model: str,
    on_error: Callable[[PrismError], None],
    on_finish: Callable[[], None],
    watch: StallWatch | None = None,
    pace: Pace | None = None,
) -> UpstreamStream:
    """``op``'s stream from the provider once its first bytes are here (the caller bounds
    the wait); watched for a stall mid-stream at ``pace``'s limit."""
    upstream = await op.stream(provider, body, model)
    try:
        first = await anext(upstream.events)
    except StopAsyncIteration:
        await upstream.aclose()
        raise UpstreamError(
            f"Provider '{provider.spec.name}' ended the stream before its first byte.",
            code="upstream_truncated",
        ) from None
    except BaseException:
        await upstream.aclose()
        raise
    spec = provider.spec
    limit = pace.limit(spec.first_byte_timeout) if pace is not None else 0.0
    events = StartedEvents(
        first, upstream.events, on_error, on_finish, watch, pace, limit, spec.name
    )
    return UpstreamStream(events=events, close=upstream.close)


def first_token_timeout(provider: ChatProvider) -> UpstreamTimeoutError:
    spec = provider.spec
    return UpstreamTimeoutError(
        f"Provider '{spec.name}' sent no first token within {spec.first_token_limit:g} s."
    )
