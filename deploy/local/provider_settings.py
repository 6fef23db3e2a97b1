"""How the local provider stand-in behaves when no fault is injected: its settings and models.

Below :mod:`deploy.local.provider` (the server), :mod:`deploy.local.provider_replies` (its
replies) and the wire formats (:mod:`deploy.local.provider_openai`,
:mod:`deploy.local.provider_anthropic`), which read them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_MODELS", "ProviderSettings"]

DEFAULT_MODELS = (
    "gpt-4o-mini",
    "gpt-4o",
    "claude-3-5-haiku-latest",
    "claude-sonnet-4-5",
    "prism-local-echo",
)


@dataclass(frozen=True, slots=True)
class ProviderSettings:
    """How the provider behaves when no fault is injected."""

    latency_ms: float = 0.0  # delay before the first byte of every chat response
    tokens_per_second: float = 0.0  # stream pacing; 0 = as fast as possible
    chunk_count: int = 8  # content chunks per streamed reply (at most one per word)
    reply_words: int = 0  # pad replies with filler words up to this length
    echo_chars: int = 80  # how much of the last user message is echoed
    models: tuple[str, ...] = DEFAULT_MODELS
    api_key: str | None = None  # when set, requests must carry it
