"""A Bedrock target behind the edge Worker in the real local Workers runtime: the openai SDK
(chat, streamed and not, tools) and the anthropic SDK (Messages) get Converse's answers
through the edge and the origin, and a repeat is a KV hit at the PoP."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import anthropic
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from deploy.edge_bundle import build_edge
from deploy.local.ports import free_port
from deploy.local.provider import ProviderServer
from deploy.local.provider_bedrock import credentials_env
from deploy.local.redis import RedisServer
from deploy.local.workers import ExtraWorker, LocalWorkersRuntime
from origin import Settings
from tests.fixtures.origin import (
    FORWARD_SECRET,
    KEY_SECRET,
    RunningOrigin,
    origin_env,
    serve_origin,
)
from tests.fixtures.workers import KVApi, WorkersRuntimeFactory
from tests.origin.providers.test_bedrock_stack import MODEL, UPSTREAM, providers_file
from tests.polling import wait_for

WEATHER: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@dataclass
class BedrockEdge:
    runtime: LocalWorkersRuntime
    origin: RunningOrigin

    @property
    def url(self) -> str:
        return self.runtime.extra_urls["edge"]


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    workers_runtime_factory: WorkersRuntimeFactory,
    edge_redis: RedisServer,
    provider_server: ProviderServer,
) -> Iterator[BedrockEdge]:
    folder = tmp_path_factory.mktemp("bedrock-edge")
    bundle = build_edge("local", folder / "bundle")
    port = free_port()
    edge_vars = {"PRISM_KEY_SECRET": KEY_SECRET, "PRISM_FORWARD_SECRET": FORWARD_SECRET,
                 "ORIGIN_URL": f"http://127.0.0.1:{port}"}  # fmt: skip
    runtime = workers_runtime_factory(
        None,
        api_token="kv-api-test-token",
        extra_workers=[ExtraWorker("edge", bundle.root, vars=edge_vars, kv_binding="PRISM_KV")],
    )
    kv = KVApi(runtime)
    config = providers_file(provider_server, folder)
    env = origin_env(edge_redis.url, provider_server.url, **kv.settings(),
                     PRISM_KV_FLUSH_INTERVAL="0.05", PRISM_PROVIDERS_FILE=str(config))  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
            patch.delenv(name, raising=False)
        for name, value in credentials_env().items():
            patch.setenv(name, value)  # the origin's credential chain finds the test's
        origin = serve_origin(Settings.from_env(env), port)
        try:
            yield BedrockEdge(runtime, origin)
        finally:
            origin.server.stop()
            kv.close()


def question(text: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": f"{text} {secrets.token_hex(4)}"}]


def converse_calls(provider: ProviderServer) -> int:
    paths: dict[str, int] = provider.control.stats()["paths"]
    return sum(n for path, n in paths.items() if path.startswith(f"/model/{UPSTREAM}/"))


def test_the_openai_sdk_misses_to_bedrock_then_hits_kv(
    stack: BedrockEdge, api_key: str, provider: ProviderServer
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
    stack: BedrockEdge, api_key: str, provider: ProviderServer
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
    stack: BedrockEdge, api_key: str, provider: ProviderServer
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
