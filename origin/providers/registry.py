"""Every provider kind, once: the name a providers file uses, and the adapter that serves it.

An OpenAI-compatible API (OpenAI, Groq, Together, vLLM, Ollama…) needs no code of its
own: it is ``kind = "openai"`` with its base URL. Only genuinely different APIs get one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import aiohttp

from .anthropic import AnthropicProvider
from .azure import AzureProvider
from .base import ChatProvider, ProviderSpec
from .bedrock import BedrockProvider
from .gemini import GeminiProvider
from .openai import OpenAICompatibleProvider
from .upstream_http import ConnectorFactory, UpstreamHTTP

__all__ = ["ADAPTERS", "build_provider"]


class Adapter(Protocol):
    """An adapter's constructor: the spec and the connection pool it calls through."""

    def __call__(self, spec: ProviderSpec, http: UpstreamHTTP | None = None) -> ChatProvider: ...


# kind -> the adapter's constructor
ADAPTERS: dict[str, Adapter] = {
    "openai": OpenAICompatibleProvider,
    "anthropic": AnthropicProvider,
    "azure": AzureProvider,
    "gemini": GeminiProvider,
    "bedrock": BedrockProvider,
}


def build_provider(
    spec: ProviderSpec,
    connector: ConnectorFactory | None = None,
    trace_configs: Sequence[aiohttp.TraceConfig] = (),
) -> ChatProvider:
    """The adapter for ``spec.kind`` (checked when the configuration was loaded), calling
    through its own pool: made by ``connector`` (None: the default), with ``trace_configs``
    (aiohttp request hooks: tracing's)."""
    return ADAPTERS[spec.kind](spec, UpstreamHTTP(spec, connector, trace_configs))
