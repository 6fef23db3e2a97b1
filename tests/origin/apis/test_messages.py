"""``POST /v1/messages`` through the origin with the official anthropic SDK: towards an
OpenAI-compatible provider (translated) and an Anthropic one (passed through), plain
and streamed, cached and replayed, errors in Anthropic's format."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import pytest
from anthropic.types import DocumentBlockParam, Message, TextBlock

from deploy.local.provider import ProviderServer
from tests.fixtures.origin import OriginFactory, RunningOrigin
from tests.fixtures.provider import claude_and_local
from tests.redis_replies import stream_fields

PATH = "/v1/messages"
OPENAI_MODEL = "gpt-4o-mini"  # routed to the OpenAI-compatible provider
CLAUDE_MODEL = "claude-prism-test"  # routed to the Anthropic provider
WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.fixture
def origin(
    origin_factory: OriginFactory, provider: ProviderServer, tmp_path: Path
) -> RunningOrigin:
    return origin_factory(PRISM_PROVIDERS_FILE=str(claude_and_local(provider, tmp_path)))


def sdk(origin: RunningOrigin, api_key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=origin.url, api_key=api_key, max_retries=0)


def layer(response: httpx.Response | httpx2.Response) -> str:
    return response.headers["x-prism-edge-cache-layer"]


def text_of(message: Message) -> str:
    """The text of the message's first block (a ``TextBlock``)."""
    block = message.content[0]
    assert isinstance(block, TextBlock), block
    return block.text


def body_of(error: anthropic.APIStatusError) -> dict[str, Any]:
    """The JSON body of the error (the SDK types it ``object``)."""
    assert isinstance(error.body, dict), error.body
    return error.body


def upstream_calls(provider: ProviderServer) -> dict[str, int]:
    paths: dict[str, int] = provider.control.stats()["paths"]
    return paths


def question(text: str = "tell me about prisms") -> list[Any]:
    return [{"role": "user", "content": f"{text} {secrets.token_hex(4)}"}]


@pytest.mark.parametrize(
    ("model", "upstream_path"),
    [(OPENAI_MODEL, "/v1/chat/completions"), (CLAUDE_MODEL, "/v1/messages")],
)
def test_a_plain_miss_then_a_redis_hit_replayed_byte_for_byte(
    origin: RunningOrigin, api_key: str, provider: ProviderServer, model: str, upstream_path: str
) -> None:
    client = sdk(origin, api_key)
    messages = question()
    args: dict[str, Any] = {
        "model": model,
        "max_tokens": 64,
        "system": "Be brief.",
        "messages": messages,
        "extra_body": {"temperature": 0},  # the newest SDKs take it only this way
    }
    first = client.messages.with_raw_response.create(**args)
    origin.wait_stored()
    second = client.messages.with_raw_response.create(**args)
    assert (layer(first.http_response), layer(second.http_response)) == ("miss", "redis")
    assert first.http_response.content == second.http_response.content
    message = first.parse()
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "text"
    assert message.content[0].text.startswith("Echo: " + messages[0]["content"][:20])
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    assert upstream_calls(provider) == {upstream_path: 1}
    sent = provider.control.requests()[-1]["body"]
    if upstream_path == "/v1/messages":  # passed through as sent
        assert sent["system"] == "Be brief." and sent["messages"] == messages
    else:  # translated to a chat completion
        assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
        assert sent["max_tokens"] == 64 and sent["temperature"] == 0


@pytest.mark.parametrize("model", [OPENAI_MODEL, CLAUDE_MODEL])
def test_a_streamed_miss_then_stream_and_plain_hits_from_the_same_entry(
    origin: RunningOrigin, api_key: str, provider: ProviderServer, model: str
) -> None:
    client = sdk(origin, api_key)
    messages = question("stream me")
    with client.messages.with_streaming_response.create(
        model=model, max_tokens=64, messages=messages, stream=True
    ) as response:
        assert layer(response.http_response) == "miss"
        assert response.http_response.headers["content-type"].startswith("text/event-stream")
        events = [event.type for event in response.parse()]
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "message_delta"} <= set(events)
    origin.wait_stored()
    with client.messages.stream(model=model, max_tokens=64, messages=messages) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text.startswith("Echo: stream me") and text_of(final) == text
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0
    plain = client.messages.with_raw_response.create(model=model, max_tokens=64, messages=messages)
    assert layer(plain.http_response) == "redis"
    assert text_of(plain.parse()) == text
    assert sum(upstream_calls(provider).values()) == 1


@pytest.mark.parametrize("model", [OPENAI_MODEL, CLAUDE_MODEL])
def test_tool_use_plain_streamed_and_replayed(
    origin: RunningOrigin, api_key: str, model: str
) -> None:
    client = sdk(origin, api_key)
    messages = question("what does get_weather say for Paris?")
    args: dict[str, Any] = {
        "model": model,
        "max_tokens": 64,
        "messages": messages,
        "tools": [WEATHER],
    }
    with client.messages.stream(**args) as stream:
        streamed = stream.get_final_message()
    block = streamed.content[-1]
    assert block.type == "tool_use" and block.name == "get_weather"
    assert isinstance(block.input, dict) and set(block.input) == {"city"}
    assert streamed.stop_reason == "tool_use"
    origin.wait_stored()
    with client.messages.stream(**args) as stream:  # replayed from Redis
        replayed = stream.get_final_message()
    assert replayed.content == streamed.content and replayed.stop_reason == "tool_use"
    plain = client.messages.create(**args)
    assert plain.content == streamed.content
    # the answer goes back as a tool result, and the model answers in text
    follow_up = [
        *messages,
        {"role": "assistant", "content": [b.model_dump() for b in streamed.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "Sunny"}],
        },
    ]
    answer = client.messages.create(model=model, max_tokens=64, messages=follow_up)
    assert answer.content[0].type == "text" and answer.stop_reason == "end_turn"


def test_the_key_as_a_bearer_token_and_bad_keys_in_anthropic_format(
    origin: RunningOrigin, api_key: str
) -> None:
    bearer = anthropic.Anthropic(base_url=origin.url, auth_token=api_key, max_retries=0)
    assert bearer.messages.create(model=OPENAI_MODEL, max_tokens=8, messages=question()).content
    with pytest.raises(anthropic.AuthenticationError) as refused:
        sdk(origin, "sk-prism-v1.acme.nope.nope").messages.create(
            model=OPENAI_MODEL, max_tokens=8, messages=question()
        )
    assert refused.value.status_code == 401
    assert refused.value.body == {
        "type": "error",
        "error": {
            "type": "authentication_error",
            "message": body_of(refused.value)["error"]["message"],
        },
    }


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"model": OPENAI_MODEL, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": OPENAI_MODEL, "max_tokens": 0, "messages": []}, "max_tokens"),
        ({"model": OPENAI_MODEL, "max_tokens": 8, "messages": []}, "messages"),
        (
            {"model": OPENAI_MODEL, "max_tokens": 8, "messages": [{"role": "system"}]},
            "messages.0.role",
        ),
        (
            {"model": OPENAI_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": 5}]},
            "messages.0.content",
        ),
        ({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}, "model"),
        (
            {
                "model": OPENAI_MODEL,
                "max_tokens": 8,
                "temperature": 1.5,
                "messages": [{"role": "user", "content": "x"}],
            },
            "temperature",
        ),
    ],
)
def test_bad_bodies_get_anthropic_errors(
    origin: RunningOrigin, api_key: str, provider: ProviderServer, body: dict[str, Any], where: str
) -> None:
    response = httpx.post(origin.url + PATH, json=body, headers={"x-api-key": api_key})
    assert response.status_code == 400
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert where in error["error"]["message"]
    assert upstream_calls(provider) == {}


def test_wrong_method_unsupported_content_and_provider_faults_in_anthropic_format(
    origin: RunningOrigin, api_key: str, provider: ProviderServer
) -> None:
    wrong = httpx.get(origin.url + PATH, headers={"x-api-key": api_key})
    assert wrong.status_code == 405 and wrong.json()["type"] == "error"
    client = sdk(origin, api_key)
    document: DocumentBlockParam = {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": "x"},
    }
    with pytest.raises(anthropic.BadRequestError) as unsupported:
        client.messages.create(
            model=OPENAI_MODEL, max_tokens=8, messages=[{"role": "user", "content": [document]}]
        )
    assert "document" in body_of(unsupported.value)["error"]["message"]
    provider.control.set_fault("malformed_json")
    with pytest.raises(anthropic.InternalServerError) as broken:
        client.messages.create(model=CLAUDE_MODEL, max_tokens=8, messages=question())
    assert broken.value.status_code == 502
    assert body_of(broken.value)["error"]["type"] == "api_error"


@pytest.mark.parametrize("model", [OPENAI_MODEL, CLAUDE_MODEL])
def test_a_stream_cut_midway_ends_in_an_error_event_and_is_not_cached(
    origin: RunningOrigin, api_key: str, provider: ProviderServer, model: str
) -> None:
    provider.control.set_fault("truncated_stream", after_chunks=3)
    body = {"model": model, "max_tokens": 64, "messages": question("cut"), "stream": True}
    headers = {"x-api-key": api_key}
    cut = httpx.post(origin.url + PATH, json=body, headers=headers, timeout=30)
    assert cut.status_code == 200 and layer(cut) == "miss"
    assert cut.text.startswith("event: message_start")
    assert cut.text.rstrip().splitlines()[-2] == "event: error"
    assert "message_stop" not in cut.text
    origin.wait_stored()
    again = httpx.post(origin.url + PATH, json=body, headers=headers, timeout=30)
    assert layer(again) == "miss" and again.text.rstrip().endswith('{"type":"message_stop"}')


def test_identical_concurrent_requests_make_one_provider_call(
    origin: RunningOrigin, api_key: str, provider: ProviderServer
) -> None:
    provider.control.set_fault("latency", ms=300)
    body = {"model": CLAUDE_MODEL, "max_tokens": 64, "messages": question("together")}

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=origin.url, headers={"x-api-key": api_key}, timeout=30
        ) as http:
            return await asyncio.gather(
                *[
                    http.post(PATH, json={**body, "stream": True} if i % 2 else body)
                    for i in range(10)
                ]
            )

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * 10
    assert (
        len(
            {r.content for r in responses if not r.headers["content-type"].startswith("text/event")}
        )
        == 1
    )
    assert all(
        r.text.rstrip().endswith('{"type":"message_stop"}')
        for r in responses
        if r.headers["content-type"].startswith("text/event")
    )
    assert upstream_calls(provider) == {"/v1/messages": 1}


def test_a_denied_model_is_a_403_in_anthropic_format_and_audited(
    origin: RunningOrigin, api_key: str, provider: ProviderServer, redis_url: str
) -> None:
    import redis

    from prism import Policy, policy_key

    admin = redis.Redis.from_url(redis_url)
    admin.set(policy_key("acme"), Policy.parse('{"deny": ["gpt-4o*"]}').encode())
    with pytest.raises(anthropic.PermissionDeniedError) as refused:
        sdk(origin, api_key).messages.create(model=OPENAI_MODEL, max_tokens=8, messages=question())
    assert body_of(refused.value)["error"]["type"] == "permission_error"
    assert (
        sdk(origin, api_key)
        .messages.create(model=CLAUDE_MODEL, max_tokens=8, messages=question())
        .content
    )
    assert upstream_calls(provider) == {"/v1/messages": 1}
    origin.wait_stored()
    assert b"policy.refuse" in b"".join(
        value
        for fields in stream_fields(bytes, admin.xrange("prism:audit"))
        for value in fields.values()
    )
    admin.close()


def test_an_error_event_right_after_the_200_fails_over_before_the_client_sees_a_byte(
    origin_factory: OriginFactory, api_key: str, provider: ProviderServer, tmp_path: Path
) -> None:
    config = tmp_path / "providers.toml"
    config.write_text(
        f"""
[providers.claude]
kind = "anthropic"
base_url = "{provider.url}"
api_key = "provider-test-key"
retries = 0

[providers.claude_backup]
kind = "anthropic"
base_url = "{provider.url}"
api_key = "provider-test-key"

[models]
"claude-*" = ["claude", "claude_backup"]
"""
    )
    origin = origin_factory(PRISM_PROVIDERS_FILE=str(config))
    provider.control.set_fault("error_event", message="Overloaded")
    body = {"model": CLAUDE_MODEL, "max_tokens": 32, "messages": question(), "stream": True}
    streamed = httpx.post(origin.url + PATH, json=body, headers={"x-api-key": api_key}, timeout=30)
    assert streamed.status_code == 200 and streamed.headers["x-prism-provider"] == "claude_backup"
    assert streamed.text.startswith("event: message_start")
    assert "event: error" not in streamed.text
    assert upstream_calls(provider) == {"/v1/messages": 2}
