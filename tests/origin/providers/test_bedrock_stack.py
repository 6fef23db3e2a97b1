"""A Bedrock target through the real origin: the openai SDK (chat, streamed and not, tools)
and the anthropic SDK (Messages) get their answers from Converse; a repeat is a cache hit;
a 429, a 5xx, a cut before the first event and a stall are routed to the next target."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import redis
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam

from deploy.local.provider import ProviderServer
from deploy.local.provider_bedrock import credentials_env
from tests.fixtures.origin import OriginFactory, RunningOrigin

UPSTREAM = "anthropic.claude-3-5-haiku-20241022-v1:0"
MODEL = "claude-on-bedrock"  # the public name routed to Bedrock first, then the local OpenAI
WEATHER: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def providers_file(provider: ProviderServer, folder: Path, bedrock_extra: str = "") -> Path:
    config = folder / "providers.toml"
    config.write_text(
        f"""
[providers.aws]
kind = "bedrock"
base_url = "{provider.url}"
region = "us-east-1"
label = "bedrock"
{bedrock_extra}

[providers.local]
base_url = "{provider.url}/v1"
api_key = "provider-test-key"
label = "local"

[models]
"{MODEL}" = ["aws:{UPSTREAM}", "local:gpt-4o-mini"]
"titan-embed" = ["aws:amazon.titan-embed-text-v2:0"]
"*" = ["local"]
"""
    )
    return config


@pytest.fixture
def aws_credentials(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(name, raising=False)
    for name, value in credentials_env().items():
        monkeypatch.setenv(name, value)
    yield


@pytest.fixture
def origin(
    origin_factory: OriginFactory, provider: ProviderServer, tmp_path: Path, aws_credentials: None
) -> RunningOrigin:
    return origin_factory(PRISM_PROVIDERS_FILE=str(providers_file(provider, tmp_path)))


def sdk(origin: RunningOrigin, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=origin.url + "/v1", api_key=api_key, max_retries=0)


def question(text: str = "tell me about prisms") -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": f"{text} {secrets.token_hex(4)}"}]


def converse_calls(provider: ProviderServer) -> int:
    paths: dict[str, int] = provider.control.stats()["paths"]
    return sum(n for path, n in paths.items() if path.startswith("/model/"))


def test_chat_miss_from_converse_then_a_redis_hit(
    origin: RunningOrigin, api_key: str, provider: ProviderServer
) -> None:
    client, messages = sdk(origin, api_key), question()
    first = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "system", "content": "Be brief."}, *messages], max_tokens=40
    )
    origin.wait_stored()
    second = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "system", "content": "Be brief."}, *messages], max_tokens=40
    )
    headers = first.http_response.headers
    assert (headers["x-prism-edge-cache-layer"], headers["x-prism-provider"]) == ("miss", "bedrock")
    assert second.http_response.headers["x-prism-edge-cache-layer"] == "redis"
    completion = first.parse()
    assert completion.model == MODEL or completion.model == UPSTREAM
    assert completion.choices[0].message.content == second.parse().choices[0].message.content
    assert str(completion.choices[0].message.content).startswith("Echo: tell me about prisms")
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.prompt_tokens > 0
    (sent,) = provider.control.requests()
    assert sent["path"] == f"/model/{UPSTREAM}/converse"
    assert sent["body"]["system"] == [{"text": "Be brief."}]
    assert sent["body"]["inferenceConfig"] == {"maxTokens": 40}


def test_a_streamed_miss_then_stream_and_json_hits(
    origin: RunningOrigin, api_key: str, provider: ProviderServer
) -> None:
    client, messages = sdk(origin, api_key), question("stream me")
    with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True}
    ) as response:
        assert response.http_response.headers["x-prism-edge-cache-layer"] == "miss"
        chunks = list(response.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("Echo: stream me") and chunks[-1].usage is not None
    origin.wait_stored()
    with client.chat.completions.with_streaming_response.create(
        model=MODEL, messages=messages, stream=True
    ) as response:
        assert response.http_response.headers["x-prism-edge-cache-layer"] == "redis"
        replayed = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
    plain = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    assert plain.http_response.headers["x-prism-edge-cache-layer"] == "redis"
    assert replayed == text == plain.parse().choices[0].message.content
    assert provider.control.stats()["paths"] == {f"/model/{UPSTREAM}/converse-stream": 1}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_tool_calls_and_results_round_trip(
    origin: RunningOrigin, api_key: str, provider: ProviderServer, stream: bool
) -> None:
    client, messages = sdk(origin, api_key), question("what is the weather")
    args: dict[str, Any] = {"model": MODEL, "messages": messages, "tools": [WEATHER],
                            "tool_choice": "required"}  # fmt: skip
    if stream:
        with client.chat.completions.stream(**args) as streamed:
            completion = streamed.get_final_completion()
    else:
        completion = client.chat.completions.create(**args)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    assert call.function.arguments.startswith('{"city":')
    answer = client.chat.completions.create(
        model=MODEL,
        tools=[WEATHER],
        messages=[
            *messages,
            {"role": "assistant", "tool_calls": [{"id": call.id, "type": "function",
             "function": {"name": "get_weather", "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 31}'},
        ],
    )  # fmt: skip
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].message.content
    sent = provider.control.requests()[-1]["body"]
    assert sent["messages"][-1]["content"] == [
        {"toolResult": {"toolUseId": call.id, "content": [{"text": '{"temp": 31}'}]}}
    ]


def test_the_anthropic_sdk_gets_messages_from_converse(
    origin: RunningOrigin, api_key: str, provider: ProviderServer
) -> None:
    client = anthropic.Anthropic(base_url=origin.url, api_key=api_key, max_retries=0)
    content = f"messages through bedrock {secrets.token_hex(4)}"
    message = client.messages.create(
        model=MODEL,
        max_tokens=32,
        system="Be brief.",
        messages=[{"role": "user", "content": content}],
    )
    assert message.type == "message" and message.stop_reason == "end_turn"
    block = message.content[0]
    assert block.type == "text" and block.text.startswith("Echo: messages through bedrock")
    with client.messages.stream(
        model=MODEL, max_tokens=32, messages=[{"role": "user", "content": content + " streamed"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.startswith("Echo: messages through bedrock") and final.usage.output_tokens > 0
    assert converse_calls(provider) == 2
    assert provider.control.requests()[0]["body"]["system"] == [{"text": "Be brief."}]


@pytest.mark.parametrize(
    ("fault", "bedrock_extra"),
    [
        ({"mode": "rate_limit"}, ""),
        ({"mode": "status", "status": 503, "count": 2}, ""),  # retried once, then the next
        ({"mode": "status", "status": 500, "count": 2}, ""),
        ({"mode": "truncated_stream", "after_chunks": 0, "abort": 1}, "retries = 0"),
        ({"mode": "stall_before_first_byte", "seconds": 5}, "first_token_timeout = 0.3\nfirst_byte_timeout = 0.3\nhedge = false"),
        ({"mode": "error_event"}, "retries = 0"),
    ],
    ids=["429", "503", "500", "cut-before-first-event", "stall", "exception-event"],
)  # fmt: skip
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_bedrock_faults_are_routed_to_the_next_target(
    origin_factory: OriginFactory,
    provider: ProviderServer,
    tmp_path: Path,
    aws_credentials: None,
    api_key: str,
    fault: dict[str, Any],
    bedrock_extra: str,
    stream: bool,
) -> None:
    if fault["mode"] in ("error_event", "truncated_stream") and not stream:
        fault = {"mode": "truncated_stream", "abort": 1}  # a JSON answer cut in half
    config = providers_file(provider, tmp_path, bedrock_extra)
    origin = origin_factory(PRISM_PROVIDERS_FILE=str(config))
    provider.control.set_fault(**fault)
    body = {"model": MODEL, "messages": question("fail over"), "stream": stream}
    response = httpx.post(origin.url + "/v1/chat/completions", json=body,
                          headers={"authorization": f"Bearer {api_key}"}, timeout=30)  # fmt: skip
    assert response.status_code == 200, response.text
    assert response.headers["x-prism-provider"] == "local"
    assert "Echo:" in response.text and "fail" in response.text
    if stream:
        assert response.text.endswith("data: [DONE]\n\n") and '"error"' not in response.text
    health = httpx.get(origin.admin_url + "/healthz").json()["providers"]["aws"]
    assert health["error_rate"] > 0 and health["last_error"]
    assert provider.control.stats()["paths"].get("/v1/chat/completions") == 1


def test_a_cut_after_the_first_events_ends_in_an_error_and_stores_nothing(
    origin: RunningOrigin, api_key: str, provider: ProviderServer, redis_url: str
) -> None:
    provider.control.set_fault("truncated_stream", after_chunks=3)
    body = {"model": MODEL, "messages": question("cut me"), "stream": True}
    response = httpx.post(origin.url + "/v1/chat/completions", json=body,
                          headers={"authorization": f"Bearer {api_key}"}, timeout=30)  # fmt: skip
    assert response.status_code == 200  # the stream had started
    assert "Echo:" in response.text and "[DONE]" not in response.text
    assert '"code":"upstream_truncated"' in response.text.replace(" ", "")
    origin.wait_stored()
    admin = redis.Redis.from_url(redis_url)
    try:
        assert list(admin.scan_iter("prism:v1:*")) == []
    finally:
        admin.close()


def test_embeddings_from_titan_then_a_redis_hit(
    origin: RunningOrigin, api_key: str, provider: ProviderServer
) -> None:
    client, text = sdk(origin, api_key), f"embed me {secrets.token_hex(4)}"
    first = client.embeddings.with_raw_response.create(
        model="titan-embed", input=[text, "and me"], dimensions=256
    )
    origin.wait_stored()
    second = client.embeddings.with_raw_response.create(
        model="titan-embed", input=[text, "and me"], dimensions=256
    )
    layers = [r.http_response.headers["x-prism-edge-cache-layer"] for r in (first, second)]
    assert layers == ["miss", "redis"]
    embeddings = first.parse()
    assert [len(e.embedding) for e in embeddings.data] == [256, 256]
    assert embeddings.usage.prompt_tokens == 5
    assert second.parse().data[0].embedding == embeddings.data[0].embedding
    assert provider.control.stats()["paths"] == {"/model/amazon.titan-embed-text-v2:0/invoke": 2}
