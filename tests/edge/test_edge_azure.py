"""Azure OpenAI behind the edge Worker in the real local Workers runtime: the openai SDK's
chat (streamed and not, tools) and the anthropic SDK's Messages, missed at the PoP,
answered through the origin by the local provider's Azure, then KV hits that reach
neither; a 429 from Azure answered by the route's next target. (Its own edge and origin,
routing ``azure-*`` to the local provider as ``kind = "azure"``, then as OpenAI.)"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx2
import openai
import pytest
from anthropic.types import MessageParam, TextBlock
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from deploy.local.provider import ProviderServer
from deploy.local.redis import RedisServer
from prism import KeyRing
from tests.fixtures.edge import EdgeStack, edge_with_providers
from tests.fixtures.workers import WorkersRuntimeFactory
from tests.polling import wait_for

MODEL = "azure-gpt-4o-mini"  # routed to the Azure provider, deployment gpt-4o-mini
WEATHER: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def azure_providers(folder: Path, provider_url: str) -> Path:
    """``azure-*`` to the local provider as Azure (its deployments named by the mapping),
    then, on a failure only (unhedged), as OpenAI; every other model as OpenAI."""
    path = folder / "providers.toml"
    path.write_text(
        f"""
[providers.openai]
base_url = "{provider_url}/v1"
api_key = "provider-test-key"

[providers.azure]
kind = "azure"
base_url = "{provider_url}"
api_key = "provider-test-key"
deployments = {{ "{MODEL}" = "gpt-4o-mini", "azure-embed" = "text-embedding-3-small" }}

[models]
"azure-*" = {{ targets = ["azure", "openai"], hedge = false }}
"*" = ["openai"]
"""
    )
    return path


@pytest.fixture(scope="module")
def azure_stack(
    tmp_path_factory: pytest.TempPathFactory,
    workers_runtime_factory: WorkersRuntimeFactory,
    edge_redis: RedisServer,
    provider_server: ProviderServer,
    key_ring: KeyRing,
) -> Iterator[EdgeStack]:
    folder = tmp_path_factory.mktemp("azure-edge")
    config = azure_providers(folder, provider_server.url)
    with edge_with_providers(
        folder, workers_runtime_factory, edge_redis, provider_server, key_ring, config
    ) as stack:
        yield stack


@pytest.fixture
def edge(azure_stack: EdgeStack) -> EdgeStack:
    azure_stack.provider.control.reset()
    return azure_stack


def layer(response: httpx2.Response) -> str:
    return response.headers["x-prism-edge-cache-layer"]


def question(text: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": f"{text} {secrets.token_hex(4)}"}]


def test_a_plain_miss_through_azure_then_a_kv_hit(edge: EdgeStack, api_key: str) -> None:
    client = openai.OpenAI(base_url=edge.url + "/v1", api_key=api_key, max_retries=0)
    messages = question("edge azure")
    first = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    assert layer(first.http_response) == "miss"
    assert first.http_response.headers["x-prism-provider"] == "azure"
    answer = first.parse()
    assert (answer.choices[0].message.content or "").startswith("Echo: edge azure")
    assert "prompt_filter_results" not in (answer.model_extra or {})
    (sent,) = edge.provider.control.requests()
    assert sent["path"] == "/openai/deployments/gpt-4o-mini/chat/completions"

    def from_kv() -> bool:
        hit = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
        return layer(hit.http_response) == "kv"

    wait_for(from_kv)  # the origin's KV writer replicated the answer
    before = edge.origin_requests()
    hit = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    assert layer(hit.http_response) == "kv"
    assert hit.parse().choices[0].message.content == answer.choices[0].message.content
    assert edge.origin_requests() == before
    assert edge.provider.control.stats()["chat_requests"] == 1


def test_a_streamed_miss_through_azure_then_stream_and_plain_kv_hits(
    edge: EdgeStack, api_key: str
) -> None:
    client = openai.OpenAI(base_url=edge.url + "/v1", api_key=api_key, max_retries=0)
    messages = question("edge azure stream")
    with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True}
    ) as response:
        assert layer(response.http_response) == "miss"
        chunks = list(response.parse())
    # Azure's prompt-results chunk (empty id, no choices) never reaches the client.
    assert all(chunk.id for chunk in chunks) and chunks[0].choices
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("Echo: edge azure stream")
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0

    def from_kv() -> bool:
        plain = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
        return layer(plain.http_response) == "kv"

    wait_for(from_kv)
    before = edge.origin_requests()
    with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=messages, stream=True
    ) as response:
        assert layer(response.http_response) == "kv"
        replayed = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
    assert replayed == text
    assert edge.origin_requests() == before
    assert edge.provider.control.stats()["chat_requests"] == 1


def test_tool_calls_streamed_through_azure(edge: EdgeStack, api_key: str) -> None:
    client = openai.OpenAI(base_url=edge.url + "/v1", api_key=api_key, max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=question("weather in Pune"),
            tools=[WEATHER],
            tool_choice="required",
            stream=True,
        )
    )
    functions = [
        call.function
        for chunk in chunks
        if chunk.choices
        for call in chunk.choices[0].delta.tool_calls or ()
        if call.function
    ]
    assert functions[0].name == "get_weather"
    assert "".join(f.arguments or "" for f in functions).startswith('{"city":')
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert edge.provider.control.requests()[0]["path"].startswith("/openai/deployments/")


def test_anthropic_messages_through_azure_then_a_kv_hit(edge: EdgeStack, api_key: str) -> None:
    client = anthropic.Anthropic(base_url=edge.url, api_key=api_key, max_retries=0)
    messages: list[MessageParam] = [
        {"role": "user", "content": f"edge azure messages {secrets.token_hex(4)}"}
    ]
    with client.messages.stream(model=MODEL, max_tokens=32, messages=messages) as stream:
        assert stream.response.headers["x-prism-edge-cache-layer"] == "miss"
        text = "".join(stream.text_stream)
    assert text.startswith("Echo: edge azure messages")

    def from_kv() -> bool:
        plain = client.messages.with_raw_response.create(
            model=MODEL, max_tokens=32, messages=messages
        )
        return plain.http_response.headers["x-prism-edge-cache-layer"] == "kv"

    wait_for(from_kv)
    hit = client.messages.create(model=MODEL, max_tokens=32, messages=messages)
    block = hit.content[0]
    assert isinstance(block, TextBlock) and block.text == text
    assert edge.provider.control.stats()["chat_requests"] == 1


def test_a_429_from_azure_is_routed_to_the_next_target(edge: EdgeStack, api_key: str) -> None:
    client = openai.OpenAI(base_url=edge.url + "/v1", api_key=api_key, max_retries=0)
    edge.provider.control.set_fault("rate_limit", retry_after=7)
    answer = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=question("edge azure limited")
    )
    assert answer.http_response.headers["x-prism-provider"] == "openai"
    assert answer.parse().choices[0].message.content
    paths = [sent["path"] for sent in edge.provider.control.requests()]
    assert paths == ["/openai/deployments/gpt-4o-mini/chat/completions", "/v1/chat/completions"]


def test_embeddings_through_azure_then_a_kv_hit(edge: EdgeStack, api_key: str) -> None:
    client = openai.OpenAI(base_url=edge.url + "/v1", api_key=api_key, max_retries=0)
    inputs = [f"edge azure embed {secrets.token_hex(6)}", "second"]
    first = client.embeddings.with_raw_response.create(model="azure-embed", input=inputs)
    assert layer(first.http_response) == "miss"
    assert first.parse().model == "text-embedding-3-small" and len(first.parse().data) == 2

    def from_kv() -> bool:
        again = client.embeddings.with_raw_response.create(model="azure-embed", input=inputs)
        return layer(again.http_response) == "kv"

    wait_for(from_kv)
    hit = client.embeddings.with_raw_response.create(model="azure-embed", input=inputs)
    assert hit.http_response.content == first.http_response.content
    assert edge.provider.control.stats()["paths"] == {
        "/openai/deployments/text-embedding-3-small/embeddings": 1
    }
