"""A stream counts as answered at its first body bytes, not at its headers.

``open_started`` starts a provider stream and waits (within the target's first-token
limit) for the first bytes, so a provider that sends its headers and then nothing is
failed over like one that never answered. The stream it returns yields those bytes
first, then the rest, and reports a ``PrismError`` raised mid-stream exactly once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from prism import PrismError, UpstreamError, UpstreamTimeoutError

from ..providers.base import ChatProvider, UpstreamStream
from .operation import Operation

__all__ = ["StartedEvents", "first_token_timeout", "open_started"]


class StartedEvents:
    """``first``, then the rest of ``events``; the first ``PrismError`` goes to ``on_error``,
    unless the consumer said the answer was whole first (``finish``: ``on_finish``).

    A class, not an async generator: closing it must close the upstream events even when
    it was never iterated.
    """

    __slots__ = ("_events", "_first", "_on_error", "_on_finish", "reported")

    def __init__(
        self,
        first: bytes,
        events: AsyncIterator[bytes],
        on_error: Callable[[PrismError], None],
        on_finish: Callable[[], None],
    ) -> None:
        self._first: bytes | None = first
        self._events = events
        self._on_error = on_error
        self._on_finish = on_finish
        self.reported = False  # its outcome, broken or whole, has been told

    def __aiter__(self) -> StartedEvents:
        return self

    async def __anext__(self) -> bytes:
        first = self._first
        if first is not None:
            self._first = None
            return first
        try:
            return await anext(self._events)
        except PrismError as error:
            self.report(error)
            raise

    def report(self, error: PrismError) -> None:
        """Count a broken stream against its target once (here or from the flight)."""
        if not self.reported:
            self.reported = True
            self._on_error(error)

    def finish(self) -> None:
        """The answer is whole: a stream proves its provider healthy only now, and whatever
        happens to the rest of the body (read only to free the connection) is not the
        provider's failure."""
        if not self.reported:
            self.reported = True
            self._on_finish()

    async def aclose(self) -> None:
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
) -> UpstreamStream:
    """``op``'s stream from the provider once its first bytes are here (the caller bounds
    the wait)."""
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
    return UpstreamStream(
        events=StartedEvents(first, upstream.events, on_error, on_finish), close=upstream.close
    )


def first_token_timeout(provider: ChatProvider) -> UpstreamTimeoutError:
    spec = provider.spec
    return UpstreamTimeoutError(
        f"Provider '{spec.name}' sent no first token within {spec.first_token_limit:g} s."
    )
