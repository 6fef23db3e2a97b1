"""How the local provider stand-in behaves when no fault is injected: its settings and models.

Below :mod:`deploy.local.provider` (the server), :mod:`deploy.local.provider_replies` (its
replies) and the wire formats (:mod:`deploy.local.provider_openai`,
:mod:`deploy.local.provider_anthropic`), which read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from deploy.local.provider_models import ANTHROPIC_MODELS, OPENAI_MODELS

__all__ = ["DEFAULT_ANTHROPIC_MODELS", "DEFAULT_MODELS", "ProviderSettings"]

DEFAULT_MODELS = tuple(OPENAI_MODELS)  # what its OpenAI GET /v1/models lists
DEFAULT_ANTHROPIC_MODELS = tuple(ANTHROPIC_MODELS)  # what its Anthropic one lists


@dataclass(frozen=True, slots=True)
class ProviderSettings:
    """How the provider behaves when no fault is injected."""

    latency_ms: float = 0.0  # delay before the first byte of every chat response
    tokens_per_second: float = 0.0  # stream pacing; 0 = as fast as possible
    chunk_count: int = 8  # content chunks per streamed reply (at most one per word)
    reply_words: int = 0  # pad replies with filler words up to this length
    echo_chars: int = 80  # how much of the last user message is echoed
    models: tuple[str, ...] = DEFAULT_MODELS
    anthropic_models: tuple[str, ...] = DEFAULT_ANTHROPIC_MODELS
    # The most models a page of Anthropic's list holds, whatever its limit (the real API
    # gives up to 1,000): small, so the default list takes two pages.
    models_page_size: int = 3
    api_key: str | None = None  # when set, requests must carry it
