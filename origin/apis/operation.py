"""What an API other than chat completions asks of a provider, as one value the router,
the flight and the handler pass along (``Call.op``).

Chat completions is the default (``op=None``): its code paths stay as they are. Another
API (embeddings, Anthropic messages) is an ``Operation``: how to call a provider for a
complete answer or a stream, how to rebuild a stream into the answer that is cached,
and how to replay a cached answer as that API's stream.
"""

from __future__ import annotations

from typing import Any, Protocol

from prism import PrismError

from ..providers.base import ChatProvider, UpstreamCompletion, UpstreamStream

__all__ = ["Operation", "StreamBuilder"]


class StreamBuilder(Protocol):
    """Rebuilds one streamed answer from its events (the data of each SSE event)."""

    @property
    def done(self) -> bool:
        """The stream's own end marker has come: nothing more belongs to the answer."""
        ...

    def add(self, data: bytes) -> bytes:
        """The event's frame, to relay as it is; raises ``PrismError`` for a malformed or
        error event."""
        ...

    def result(self) -> UpstreamCompletion | None:
        """The whole answer, or None when the stream ended before it was whole."""
        ...


class Operation(Protocol):
    name: str  # the API, in error messages

    async def complete(
        self, provider: ChatProvider, body: dict[str, Any], model: str
    ) -> UpstreamCompletion: ...

    async def stream(
        self, provider: ChatProvider, body: dict[str, Any], model: str
    ) -> UpstreamStream: ...

    def builder(self, provider: str) -> StreamBuilder: ...

    def replay(self, result: UpstreamCompletion) -> bytes:
        """A complete answer as this API's whole event stream."""
        ...

    def error_frame(self, error: PrismError) -> bytes:
        """The event that ends a stream that failed after it started."""
        ...
