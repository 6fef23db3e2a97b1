"""A Gemini target behind the edge Worker in the real local Workers runtime: the openai SDK
gets its answers from Gemini's wire format (plain, streamed, a tool call) and a repeat is
a KV hit at the PoP; the anthropic SDK's Messages too. (Its own edge and origin, routing
``gemini-*`` to the local provider as ``kind = "gemini"``.)"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from deploy.local.provider import ProviderServer
from deploy.local.redis import RedisServer
from prism import KeyRing
from tests.fixtures.edge import EdgeStack, edge_with_providers
from tests.fixtures.workers import WorkersRuntimeFactory
from tests.polling import wait_for

MODEL = "gemini-2.5-flash"
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def gemini_providers(folder: Path, provider_url: str) -> Path:
    path = folder / "providers.toml"
    path.write_text(
        f"""
[providers.openai]
base_url = "{provider_url}/v1"
api_key = "provider-test-key"

[providers.gemini]
kind = "gemini"
base_url = "{provider_url}"
api_key = "gemini-test-key"

[models]
"gemini-*" = ["gemini"]
"*" = ["openai"]
"""
    )
    return path


@pytest.fixture(scope="module")
def gemini_stack(
    tmp_path_factory: pytest.TempPathFactory,
    workers_runtime_factory: WorkersRuntimeFactory,
    edge_redis: RedisServer,
    provider_server: ProviderServer,
    key_ring: KeyRing,
) -> Iterator[EdgeStack]:
    folder = tmp_path_factory.mktemp("gemini-edge")
    config = gemini_providers(folder, provider_server.url)
    with edge_with_providers(
        folder, workers_runtime_factory, edge_redis, provider_server, key_ring, config
    ) as stack:
        yield stack


@pytest.fixture
def edge(gemini_stack: EdgeStack) -> EdgeStack:
    gemini_stack.provider.control.reset()
    return gemini_stack


def question(text: str) -> list[Any]:
    return [{"role": "user", "content": f"{text} {secrets.token_hex(4)}"}]


def gemini_calls(edge: EdgeStack) -> int:
    paths: dict[str, int] = edge.provider.control.stats()["paths"]
    return sum(n for path, n in paths.items() if path.startswith("/v1beta/models/"))


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_gemini_miss_is_then_a_kv_hit(edge: EdgeStack, api_key: str, stream: bool) -> None:
    client = openai.OpenAI(base_url=edge.url + "/v1", api_key=api_key, max_retries=0)
    messages = question("edge gemini")
    if stream:
        with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=messages, temperature=0, stream=True
        ) as response:
            assert response.headers["x-prism-edge-cache-layer"] == "miss"
            chunks = list(response.parse())
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[-1].choices[0].finish_reason == "stop"
    else:
        first = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, temperature=0
        )
        assert first.headers["x-prism-edge-cache-layer"] == "miss"
        text = first.parse().choices[0].message.content or ""
    assert text.startswith("Echo: edge gemini")

    def from_kv() -> bool:
        again = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, temperature=0
        )
        return again.headers["x-prism-edge-cache-layer"] == "kv"

    wait_for(from_kv)  # the origin's KV writer replicated the answer
    before = edge.origin_requests()
    hit = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, temperature=0
    )
    assert hit.headers["x-prism-edge-cache-layer"] == "kv"
    assert hit.parse().choices[0].message.content == text
    assert edge.origin_requests() == before
    assert gemini_calls(edge) == 1


def test_a_tool_call_and_messages_through_the_edge(edge: EdgeStack, api_key: str) -> None:
    client = openai.OpenAI(base_url=edge.url + "/v1", api_key=api_key, max_retries=0)
    answer = client.chat.completions.create(
        model=MODEL, messages=question("weather"), tools=[WEATHER], tool_choice="required"
    )
    assert answer.choices[0].finish_reason == "tool_calls"
    (call,) = answer.choices[0].message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    messages = anthropic.Anthropic(base_url=edge.url, api_key=api_key, max_retries=0)
    with messages.messages.stream(
        model=MODEL, max_tokens=32, messages=question("edge messages")
    ) as stream:
        text = "".join(stream.text_stream)
    assert text.startswith("Echo: edge messages")
    assert gemini_calls(edge) == 2
