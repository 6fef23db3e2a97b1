"""What an API asks of a provider, as one value the router, the flight and the handler
pass along (``Call.op``): chat completions, embeddings, Anthropic messages.

An ``Operation`` knows how to call a provider for a complete answer or a stream, how to
rebuild a stream into the answer that is cached (its ``StreamBuilder``, fed each event's
data by the flight's one relay), how to replay a cached answer as that API's stream, and
(its ``continuation``) how a stream broken mid-answer is carried on by another target.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from prism import PrismError

from ..providers.base import ChatProvider, UpstreamCompletion, UpstreamStream
from .continuation import Continuation

__all__ = ["Operation", "StreamBuilder"]


class StreamBuilder(Protocol):
    """Rebuilds one streamed answer from its events (the data of each SSE event)."""

    @property
    def done(self) -> bool:
        """The stream's own end marker has come: nothing more belongs to the answer."""
        ...

    @property
    def usage(self) -> bool:
        """The frame ``add`` returned last is a usage-only frame, relayed only to the
        clients that asked for it (chat's ``include_usage``)."""
        ...

    def add(self, data: bytes) -> bytes:
        """The event's frame, to relay as it is (b"": nothing to relay, like chat's
        ``[DONE]``, which ``Operation.done_frame`` sends); raises ``PrismError`` for a
        malformed or error event."""
        ...

    def result(self) -> UpstreamCompletion | None:
        """Once the stream has ended: the whole answer, or None when it was cut short."""
        ...


class Operation(Protocol):
    name: str  # the API, in error messages and in traces
    # Ends a whole stream after its frames (b"": the stream's own end event is one of them).
    done_frame: bytes

    @property
    def continuation(self) -> Continuation | None:
        """How a stream of this API broken mid-answer is carried on (None: it is not)."""
        ...

    def complete(
        self, provider: ChatProvider, body: dict[str, Any], model: str
    ) -> Awaitable[UpstreamCompletion]: ...

    def stream(
        self, provider: ChatProvider, body: dict[str, Any], model: str
    ) -> Awaitable[UpstreamStream]: ...

    def builder(
        self, provider: str, body: dict[str, Any], redact: Callable[[str], str]
    ) -> StreamBuilder:
        """For one stream from ``provider`` asked with ``body``; ``redact`` makes the
        provider's own messages safe to show the client."""
        ...

    def replay(self, result: UpstreamCompletion, include_usage: bool) -> bytes:
        """A complete answer as this API's whole event stream (``include_usage``: the
        client asked for chat's usage chunk)."""
        ...

    def error_frame(self, error: PrismError) -> bytes:
        """The event that ends a stream that failed after it started."""
        ...
