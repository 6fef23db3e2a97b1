"""A Bedrock target behind the edge Worker in the real local Workers runtime: the openai SDK
(chat, streamed and not, tools) and the anthropic SDK (Messages) get Converse's answers
through the edge and the origin, and a repeat is a KV hit at the PoP."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import anthropic
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from deploy.local.provider import ProviderServer
from deploy.local.provider_bedrock import credentials_env
from deploy.local.redis import RedisServer
from prism import KeyRing
from tests.fixtures.edge import EdgeStack, edge_with_providers
from tests.fixtures.workers import WorkersRuntimeFactory
from tests.origin.providers.test_bedrock_stack import MODEL, UPSTREAM, providers_file
from tests.polling import wait_for

WEATHER: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    workers_runtime_factory: WorkersRuntimeFactory,
    edge_redis: RedisServer,
    provider_server: ProviderServer,
    key_ring: KeyRing,
) -> Iterator[EdgeStack]:
    folder = tmp_path_factory.mktemp("bedrock-edge")
    config = providers_file(provider_server, folder)
    with pytest.MonkeyPatch.context() as patch:
        for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
            patch.delenv(name, raising=False)
        for name, value in credentials_env().items():
            patch.setenv(name, value)  # the origin's credential chain finds the test's
        with edge_with_providers(
            folder, workers_runtime_factory, edge_redis, provider_server, key_ring, config
        ) as edge:
            yield edge


def question(text: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": f"{text} {secrets.token_hex(4)}"}]


def converse_calls(provider: ProviderServer) -> int:
    paths: dict[str, int] = provider.control.stats()["paths"]
    return sum(n for path, n in paths.items() if path.startswith(f"/model/{UPSTREAM}/"))


def test_the_openai_sdk_misses_to_bedrock_then_hits_kv(
    stack: EdgeStack, api_key: str, provider: ProviderServer
) -> None:
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key=api_key, max_retries=0)
    messages = question("edge bedrock")
    first = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    assert first.http_response.headers["x-prism-edge-cache-layer"] == "miss"
    assert first.http_response.headers["x-prism-provider"] == "bedrock"
    text = first.parse().choices[0].message.content
    assert text is not None and text.startswith("Echo: edge bedrock")

    def from_kv() -> bool:
        again = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
        return again.http_response.headers["x-prism-edge-cache-layer"] == "kv" and (
            again.parse().choices[0].message.content == text
        )

    wait_for(from_kv)  # the origin's KV writer replicated the answer
    assert converse_calls(provider) == 1


def test_a_streamed_miss_then_a_streamed_kv_hit(
    stack: EdgeStack, api_key: str, provider: ProviderServer
) -> None:
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key=api_key, max_retries=0)
    messages = question("edge stream")
    with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=messages, stream=True
    ) as response:
        assert response.http_response.headers["x-prism-edge-cache-layer"] == "miss"
        text = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
    assert text.startswith("Echo: edge stream")

    def from_kv() -> bool:
        with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=messages, stream=True
        ) as again:
            replayed = "".join(c.choices[0].delta.content or "" for c in again.parse() if c.choices)
            return (
                again.http_response.headers["x-prism-edge-cache-layer"] == "kv" and replayed == text
            )

    wait_for(from_kv)
    assert provider.control.stats()["paths"] == {f"/model/{UPSTREAM}/converse-stream": 1}


def test_tools_and_the_anthropic_sdk_through_the_edge(
    stack: EdgeStack, api_key: str, provider: ProviderServer
) -> None:
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key=api_key, max_retries=0)
    completion = client.chat.completions.create(
        model=MODEL, messages=question("weather"), tools=[WEATHER], tool_choice="required"
    )
    call = completion.choices[0].message.tool_calls
    assert completion.choices[0].finish_reason == "tool_calls" and call
    assert call[0].type == "function" and call[0].function.name == "get_weather"
    claude = anthropic.Anthropic(base_url=stack.url, api_key=api_key, max_retries=0)
    content = f"edge messages {secrets.token_hex(4)}"
    with claude.messages.stream(
        model=MODEL, max_tokens=32, messages=[{"role": "user", "content": content}]
    ) as stream:
        assert "".join(stream.text_stream).startswith("Echo: edge messages")
        assert stream.get_final_message().stop_reason == "end_turn"
    assert converse_calls(provider) == 2
