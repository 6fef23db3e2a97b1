"""A parsed body is remembered and shared by every later request with the same bytes
(``prism.RecentBodies``), so nothing that receives ``ChatRequest.body`` may change it:
each provider is run on a remembered body, against the local provider stand-in."""

from __future__ import annotations

import copy
import json

import pytest

from deploy.local.provider import ProviderServer
from origin.providers.anthropic import AnthropicProvider
from origin.providers.base import ChatProvider, ProviderSpec
from origin.providers.openai import OpenAICompatibleProvider
from prism import ChatRequest, RecentBodies, parse_chat_request

RAW = json.dumps(
    {
        "model": "public-name",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "shared body"}]},
        ],
        "temperature": 0,
        "max_tokens": 20,
        "stop": ["\n\n"],
        "tools": [
            {
                "type": "function",
                "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
            }
        ],
        "stream_options": {"include_usage": True},
    }
).encode()


def _providers(provider: ProviderServer) -> list[ChatProvider]:
    return [
        OpenAICompatibleProvider(
            ProviderSpec(name="o", kind="openai", base_url=provider.url + "/v1", api_key="k")
        ),
        AnthropicProvider(
            ProviderSpec(name="a", kind="anthropic", base_url=provider.url, api_key="k")
        ),
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["complete", "stream"])
async def test_providers_leave_a_remembered_body_as_it_was(
    provider: ProviderServer, stream: bool
) -> None:
    recent: RecentBodies[ChatRequest] = RecentBodies()
    recent.put("acme", RAW, parse_chat_request(RAW), "fp")
    remembered = recent.get("acme", RAW)
    assert remembered is not None
    body = remembered[0].body
    before = copy.deepcopy(body)
    for upstream in _providers(provider):
        try:
            if stream:
                reply = await upstream.stream(body, "upstream-name")
                async for _ in reply.events:
                    pass
            else:
                await upstream.complete(body, "upstream-name")
        finally:
            await upstream.aclose()
    assert provider.control.stats()["chat_requests"] >= 1  # the calls really happened
    again = recent.get("acme", RAW)
    assert again is not None and again[0].body == before
    assert again[0].body == parse_chat_request(RAW).body
