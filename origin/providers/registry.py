"""Every provider kind, once: the name a providers file uses, and the adapter that serves it.

An OpenAI-compatible API (OpenAI, Groq, Together, vLLM, Ollama…) needs no code of its
own: it is ``kind = "openai"`` with its base URL. Only genuinely different APIs get one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import aiohttp

from .anthropic import AnthropicProvider
from .base import ChatProvider, ProviderSpec
from .openai import OpenAICompatibleProvider
from .upstream_http import ConnectorFactory

__all__ = ["ADAPTERS", "build_provider"]


class Adapter(Protocol):
    """An adapter's constructor: the spec, its connection pool's factory (None: the
    default), and aiohttp request hooks (tracing's)."""

    def __call__(
        self,
        spec: ProviderSpec,
        connector: ConnectorFactory | None = None,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
    ) -> ChatProvider: ...


# kind -> the adapter's constructor
ADAPTERS: dict[str, Adapter] = {
    "openai": OpenAICompatibleProvider,
    "anthropic": AnthropicProvider,
}


def build_provider(
    spec: ProviderSpec,
    connector: ConnectorFactory | None = None,
    trace_configs: Sequence[aiohttp.TraceConfig] = (),
) -> ChatProvider:
    """The adapter for ``spec.kind`` (checked when the configuration was loaded)."""
    return ADAPTERS[spec.kind](spec, connector, trace_configs)
