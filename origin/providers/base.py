"""What every provider adapter gives the origin.

A provider turns an OpenAI chat-completions body into either a complete
``chat.completion`` (JSON bytes) or a stream of OpenAI ``chat.completion.chunk``
SSE bytes, and reports failures as ``PrismError`` subclasses (429, 502, 503,
504), so the router and the handlers never see transport exceptions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "ChatProvider",
    "ListedModel",
    "ModelLister",
    "ProviderSpec",
    "UpstreamCompletion",
    "UpstreamStream",
]


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    """A provider as data: an OpenAI-compatible one needs nothing more than this."""

    name: str
    kind: str  # "openai" (any OpenAI-compatible API) or "anthropic"
    base_url: str
    api_key: str | None = None
    api_key_env: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    connect_timeout: float = 5.0
    first_byte_timeout: float = 60.0  # also the longest silence allowed mid-stream
    total_timeout: float = 600.0
    max_connections: int = 256
    label: str | None = None  # what x-prism-provider says; defaults to name
    # Routing policy (see ``origin.routing.retry`` and ``origin.routing.hedge``).
    first_token_timeout: float | None = None  # request to first streamed byte; None: first_byte
    retries: int = 1  # same-provider retries of a 500/502/503 or a reset connection
    retry_backoff: float = 0.1  # seconds before such a retry (jittered x0.5..1.5)
    max_retry_after: float = 5.0  # longest 429 Retry-After worth waiting for (when no other target)
    hedge: bool = True  # start the next target when this one is slow to its first byte
    hedge_delay: float | None = None  # fixed hedge delay; None: adapt to recent first-byte times
    hedge_percentile: float = 95.0  # which recent first-byte time the adaptive delay follows
    # How an OpenAI-compatible provider continues a partial answer put last as an assistant
    # message (``origin.routing.resume``): "continue_final_message" (vLLM) or "prefix"
    # (DeepSeek, Mistral); None: it cannot. Anthropic's kind always can (native prefill).
    continuation: str | None = None
    # The kind's own settings (the provider table's other keys, e.g. Azure's api_version):
    # read and checked by its adapter, which is built when the configuration loads.
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def first_token_limit(self) -> float:
        """Seconds from the request to a stream's first body bytes."""
        return self.first_token_timeout or self.first_byte_timeout


@dataclass(frozen=True, slots=True)
class UpstreamCompletion:
    """A complete, successful (HTTP 200) ``chat.completion``."""

    body: bytes  # JSON, served to the client and stored as is
    completion: dict[str, Any]  # the same, parsed


@dataclass(slots=True)
class UpstreamStream:
    """A successful streamed answer, already started (status 200 seen).

    ``events`` yields OpenAI-format SSE bytes (``data: {chunk}\\n\\n`` … ``data: [DONE]\\n\\n``)
    as they arrive; it raises ``PrismError`` if the stream breaks (stall, cut).
    ``aclose`` releases the connection when the consumer stops early.
    """

    events: AsyncIterator[bytes]
    # Releases the upstream response even if ``events`` was never iterated (a generator
    # closed before its first step skips its ``finally``).
    close: Callable[[], Awaitable[None]] | None = None

    async def aclose(self) -> None:
        aclose = getattr(self.events, "aclose", None)
        if aclose is not None:
            await aclose()
        if self.close is not None:
            await self.close()


class ChatProvider(Protocol):
    spec: ProviderSpec

    async def complete(self, body: dict[str, Any], model: str) -> UpstreamCompletion:
        """Send a non-stream request for upstream ``model``; raise ``PrismError`` on failure."""
        ...

    async def stream(self, body: dict[str, Any], model: str) -> UpstreamStream:
        """Start a stream for upstream ``model``; errors before the first byte raise here."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ListedModel:
    """One model a provider's own models endpoint lists."""

    id: str
    created: int = 0  # Unix seconds, as the provider gives it (0: not given)
    owned_by: str | None = None  # the provider's own value; None: it gives none


@runtime_checkable
class ModelLister(Protocol):
    """A provider that can list its models (optional: ``origin.routing.model_catalog``
    checks for it, so an adapter without a models endpoint needs nothing)."""

    async def models(self) -> list[ListedModel]:
        """Every model the provider lists (all pages); ``PrismError`` on failure."""
        ...
