"""Every provider kind, once: the name a providers file uses, and the adapter that serves it.

An OpenAI-compatible API (OpenAI, Groq, Together, vLLM, Ollama…) needs no code of its
own: it is ``kind = "openai"`` with its base URL. Only genuinely different APIs get one.
"""

from __future__ import annotations

from collections.abc import Callable

from .anthropic import AnthropicProvider
from .base import ChatProvider, ProviderSpec
from .openai import OpenAICompatibleProvider
from .upstream_http import ConnectorFactory

__all__ = ["ADAPTERS", "build_provider"]

# kind -> the adapter's constructor, (spec, connector factory) -> provider
ADAPTERS: dict[str, Callable[[ProviderSpec, ConnectorFactory | None], ChatProvider]] = {
    "openai": OpenAICompatibleProvider,
    "anthropic": AnthropicProvider,
}


def build_provider(spec: ProviderSpec, connector: ConnectorFactory | None = None) -> ChatProvider:
    """The adapter for ``spec.kind`` (checked when the configuration was loaded)."""
    return ADAPTERS[spec.kind](spec, connector)
