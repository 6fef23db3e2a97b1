"""The local provider over real HTTP: OpenAI SDK, Anthropic wire format, faults, control API."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam

from deploy.local.provider import ProviderServer, ProviderSettings, closed_port
from deploy.local.provider_models import ANTHROPIC_MODELS, OPENAI_MODELS
from tests.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
ANTHROPIC_HEADERS = {"x-api-key": "test-key", "anthropic-version": "2023-06-01"}
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the capital of France?"}
]
WEATHER_FUNCTION: dict[str, Any] = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city"],
    },
}
WEATHER_TOOL: dict[str, Any] = {"type": "function", "function": WEATHER_FUNCTION}

ProviderFactory = Callable[[ProviderSettings], ProviderServer]


# ---------------------------------------------------------------- helpers


# Clients are shared by the module's tests: building one (TLS context included) costs ~50 ms.
@pytest.fixture(scope="module")
def sdk_client(provider_server: ProviderServer) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=provider_server.url + "/v1", api_key="sk-test", max_retries=0)
    yield client
    client.close()


@pytest.fixture(scope="module")
def http_client(provider_server: ProviderServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=provider_server.url, timeout=10, trust_env=False) as client:
        yield client


@pytest.fixture
def sdk(provider: ProviderServer, sdk_client: openai.OpenAI) -> openai.OpenAI:
    return sdk_client


@pytest.fixture
def http(provider: ProviderServer, http_client: httpx.Client) -> httpx.Client:
    return http_client


def chat(client: httpx.Client, **extra: Any) -> httpx.Response:
    headers = extra.pop("headers", None)
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, **extra}
    return client.post("/v1/chat/completions", json=body, headers=headers)


def sse_data(text: str) -> list[str]:
    """The data field of every SSE event, in order."""
    return [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, parsed data) for an Anthropic event stream."""
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((lines["event"], orjson.loads(lines["data"])))
    return events


# ---------------------------------------------------------------- OpenAI API via the SDK


def test_stream_content_equals_non_stream_content(sdk: openai.OpenAI) -> None:
    full = sdk.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    content = full.choices[0].message.content
    assert content is not None and content.startswith("Echo: What is the capital of France?")
    assert full.choices[0].finish_reason == "stop"
    assert full.usage is not None
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens

    stream = sdk.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len(chunks) > 3, "content arrives in several chunks"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == content
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_content_is_deterministic_per_body(http: httpx.Client) -> None:
    first = chat(http).json()["choices"][0]["message"]["content"]
    again = chat(http).json()["choices"][0]["message"]["content"]
    warmer = chat(http, temperature=0.9).json()["choices"][0]["message"]["content"]
    assert first == again
    assert warmer != first


def test_include_usage_adds_a_usage_chunk_before_done(http: httpx.Client) -> None:
    response = chat(http, stream=True, stream_options={"include_usage": True})
    assert response.headers["content-type"].startswith("text/event-stream")
    data = sse_data(response.text)
    assert data[-1] == "[DONE]"
    usage_chunk = orjson.loads(data[-2])
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["total_tokens"] > 0


def test_n_gives_distinct_choices_streamed_and_not(sdk: openai.OpenAI) -> None:
    full = sdk.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, n=2)
    assert [c.index for c in full.choices] == [0, 1]
    contents = [c.message.content for c in full.choices]
    assert contents[0] != contents[1]

    assembled = ["", ""]
    for chunk in sdk.chat.completions.create(
        model="gpt-4o-mini",
        messages=MESSAGES,
        n=2,
        stream=True,
    ):
        for choice in chunk.choices:
            assembled[choice.index] += choice.delta.content or ""
    assert assembled == contents


def test_required_tool_choice_gives_a_tool_call(sdk: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER_TOOL],
        "tool_choice": "required",
    }
    full = sdk.chat.completions.create(**kwargs)
    choice = full.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    arguments = orjson.loads(call.function.arguments)
    assert set(arguments) == {"city", "days", "unit"}
    assert isinstance(arguments["city"], str) and arguments["unit"] == "celsius"

    ids, names, fragments, finish = set(), set(), [], None
    for chunk in sdk.chat.completions.create(**kwargs, stream=True):
        delta = chunk.choices[0].delta
        for tool_call in delta.tool_calls or []:
            ids.add(tool_call.id)
            if tool_call.function is not None:
                names.add(tool_call.function.name)
                fragments.append(tool_call.function.arguments or "")
        finish = chunk.choices[0].finish_reason or finish
    assert ids - {None} == {call.id}
    assert names - {None} == {"get_weather"}
    assert len(fragments) > 2, "arguments arrive in fragments"
    assert "".join(fragments) == call.function.arguments
    assert finish == "tool_calls"


def test_auto_tool_choice_calls_only_when_asked(http: httpx.Client) -> None:
    other = {"type": "function", "function": {"name": "get_time", "parameters": {}}}
    named = {"type": "function", "function": {"name": "get_time"}}
    forced = chat(http, tools=[WEATHER_TOOL, other], tool_choice=named).json()
    assert forced["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_time"

    plain = chat(http, tools=[WEATHER_TOOL]).json()["choices"][0]
    assert plain["finish_reason"] == "stop" and plain["message"]["content"].startswith("Echo:")

    asking = [{"role": "user", "content": "please call get_weather for Oslo"}]
    called = chat(http, messages=asking, tools=[WEATHER_TOOL]).json()["choices"][0]
    assert called["finish_reason"] == "tool_calls"

    call = called["message"]["tool_calls"][0]
    answered = [
        *asking,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "sunny"},
    ]
    after = chat(http, messages=answered, tools=[WEATHER_TOOL]).json()["choices"][0]
    assert after["finish_reason"] == "stop", "a tool result is answered with text"


def test_models_lists_the_configured_models(sdk: openai.OpenAI, provider: ProviderServer) -> None:
    models = list(sdk.models.list())
    assert [m.id for m in models] == list(provider.settings.models)
    assert {(m.id, m.created, m.owned_by) for m in models} == {
        (name, created, owned_by) for name, (created, owned_by) in OPENAI_MODELS.items()
    }


def test_the_anthropic_sdk_reads_the_paged_model_list(provider: ProviderServer) -> None:
    client = anthropic.Anthropic(base_url=provider.url, api_key="test-key", max_retries=0)
    with client:
        first = client.models.list(limit=2)  # a page of two, of a list of five
        assert [m.id for m in first.data] == list(ANTHROPIC_MODELS)[:2] and first.has_more
        every = list(client.models.list())  # the SDK follows has_more / last_id itself
    assert [m.id for m in every] == list(ANTHROPIC_MODELS)
    for model, (name, created_at) in zip(every, ANTHROPIC_MODELS.values(), strict=True):
        assert model.type == "model" and model.display_name == name
        assert model.created_at == datetime.fromisoformat(created_at)
    # Five models in pages of at most three: two pages, then the two-model page above.
    assert provider.control.stats()["model_lists"] == {"anthropic": 3}


def test_the_anthropic_model_list_checks_its_headers_and_cursors(http: httpx.Client) -> None:
    no_key = http.get("/v1/models", headers={"anthropic-version": "2023-06-01"})
    assert no_key.status_code == 401 and no_key.json()["error"]["type"] == "authentication_error"
    for query in ({"limit": "0"}, {"limit": "1001"}, {"after_id": "gpt-9"}):
        bad = http.get("/v1/models", params=query, headers=ANTHROPIC_HEADERS)
        assert bad.status_code == 400 and bad.json()["type"] == "error", query
    last = list(ANTHROPIC_MODELS)[-1]
    before = http.get("/v1/models", params={"before_id": last}, headers=ANTHROPIC_HEADERS).json()
    assert [m["id"] for m in before["data"]] == list(ANTHROPIC_MODELS)[1:4] and before["has_more"]


def test_a_models_fault_spoils_only_the_model_lists(
    http: httpx.Client, provider: ProviderServer
) -> None:
    provider.control.set_fault("status", count=2, status=503, endpoint="models")
    assert http.get("/v1/models").status_code == 503
    failed = http.get("/v1/models", headers=ANTHROPIC_HEADERS)
    assert failed.status_code == 503 and failed.json()["type"] == "error"
    assert chat(http).status_code == 200  # chat requests take the chat queue's faults only
    assert http.get("/v1/models").status_code == 200
    stats = provider.control.stats()
    assert stats["model_list_faults"] == 2 and stats["faults_applied"] == 0


def test_bad_requests_get_openai_style_400(http: httpx.Client) -> None:
    not_json = http.post("/v1/chat/completions", content=b"{nope")
    no_messages = http.post("/v1/chat/completions", json={"model": "gpt-4o-mini"})
    for response in (not_json, no_messages):
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "invalid_request_error"
    unknown = http.get("/v1/engines")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"


# ---------------------------------------------------------------- Anthropic Messages API


def test_anthropic_json_and_stream_carry_the_same_text(http: httpx.Client) -> None:
    body = {"model": "claude-3-5-haiku-latest", "max_tokens": 64, "messages": MESSAGES}
    message = http.post("/v1/messages", json=body, headers=ANTHROPIC_HEADERS).json()
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["stop_reason"] == "end_turn"
    assert message["usage"]["input_tokens"] > 0 and message["usage"]["output_tokens"] > 0
    [block] = message["content"]
    assert block["type"] == "text" and block["text"].startswith("Echo: What is the capital")

    response = http.post("/v1/messages", json={**body, "stream": True}, headers=ANTHROPIC_HEADERS)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert all(name == data["type"] for name, data in events)
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    assert len(deltas) > 2 and {d["type"] for d in deltas} == {"text_delta"}
    assert "".join(d["text"] for d in deltas) == block["text"]
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"


def test_anthropic_tool_use_streams_input_json(http: httpx.Client) -> None:
    tool = {"name": "get_weather", "input_schema": WEATHER_FUNCTION["parameters"]}
    body = {
        "model": "claude-3-5-haiku-latest",
        "max_tokens": 64,
        "messages": MESSAGES,
        "tools": [tool],
        "tool_choice": {"type": "any"},
    }
    message = http.post("/v1/messages", json=body, headers=ANTHROPIC_HEADERS).json()
    assert message["stop_reason"] == "tool_use"
    [block] = message["content"]
    assert block["type"] == "tool_use" and block["name"] == "get_weather"
    assert set(block["input"]) == {"city", "days", "unit"}

    response = http.post("/v1/messages", json={**body, "stream": True}, headers=ANTHROPIC_HEADERS)
    events = sse_events(response.text)
    start = next(d for n, d in events if n == "content_block_start")
    assert start["content_block"] == {**block, "input": {}}
    partial = "".join(d["delta"]["partial_json"] for n, d in events if n == "content_block_delta")
    assert orjson.loads(partial) == block["input"]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_anthropic_requires_its_headers(http: httpx.Client) -> None:
    body = {"model": "claude-3-5-haiku-latest", "max_tokens": 64, "messages": MESSAGES}
    no_key = http.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    assert no_key.status_code == 401
    assert no_key.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid x-api-key"},
    }
    no_version = http.post("/v1/messages", json=body, headers={"x-api-key": "k"})
    assert no_version.status_code == 400
    no_max_tokens = {k: v for k, v in body.items() if k != "max_tokens"}
    assert (
        http.post("/v1/messages", json=no_max_tokens, headers=ANTHROPIC_HEADERS).status_code == 400
    )


# ---------------------------------------------------------------- authentication


def test_api_key_is_enforced_when_configured(provider_factory: ProviderFactory) -> None:
    server = provider_factory(ProviderSettings(api_key="sk-right"))
    body = {"model": "gpt-4o-mini", "messages": MESSAGES}
    with httpx.Client(base_url=server.url, trust_env=False) as client:
        missing = client.post("/v1/chat/completions", json=body)
        wrong = client.post(
            "/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-wrong"}
        )
        anthropic = client.post(
            "/v1/messages",
            json={**body, "max_tokens": 8},
            headers={"x-api-key": "sk-wrong", "anthropic-version": "2023-06-01"},
        )
        models = client.get("/v1/models")
    for response in (missing, wrong, models):
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
    assert anthropic.status_code == 401
    assert anthropic.json()["error"]["type"] == "authentication_error"

    sdk = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-right", max_retries=0)
    with sdk:
        reply = sdk.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    assert reply.choices[0].message.content


# ---------------------------------------------------------------- faults


@pytest.mark.parametrize("status", [500, 502, 503])
def test_status_fault(provider: ProviderServer, http: httpx.Client, status: int) -> None:
    provider.control.set_fault("status", status=status)
    response = chat(http)
    assert response.status_code == status
    assert response.json()["error"]["type"] == "server_error"
    assert chat(http).status_code == 200, "count defaults to 1"


def test_status_fault_uses_the_anthropic_error_format(
    provider: ProviderServer, http: httpx.Client
) -> None:
    provider.control.set_fault("status", status=529)
    body = {"model": "claude-3-5-haiku-latest", "max_tokens": 8, "messages": MESSAGES}
    response = http.post("/v1/messages", json=body, headers=ANTHROPIC_HEADERS)
    assert response.status_code == 529
    assert response.json()["error"]["type"] == "overloaded_error"


def test_rate_limit_fault_sends_retry_after(provider: ProviderServer, http: httpx.Client) -> None:
    provider.control.set_fault("rate_limit", retry_after=7)
    response = chat(http)
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    assert response.json()["error"]["code"] == "rate_limit_exceeded"


def test_count_limited_faults_expire_in_order(provider: ProviderServer, http: httpx.Client) -> None:
    provider.control.set_fault("status", count=2, status=503)
    provider.control.set_fault("rate_limit")
    assert [chat(http).status_code for _ in range(4)] == [503, 503, 429, 200]


def test_unlimited_fault_lasts_until_cleared(provider: ProviderServer, http: httpx.Client) -> None:
    provider.control.set_fault("status", count=-1, status=502)
    assert [chat(http).status_code for _ in range(3)] == [502, 502, 502]
    provider.control.clear()
    assert chat(http).status_code == 200


def test_stall_before_first_byte_then_answers(provider: ProviderServer, http: httpx.Client) -> None:
    provider.control.set_fault("stall_before_first_byte", seconds=0.2)
    started = time.monotonic()
    response = chat(http)
    assert time.monotonic() - started >= 0.2
    assert response.status_code == 200 and response.json()["choices"][0]["message"]["content"]


def test_stall_before_first_byte_trips_a_client_read_timeout(
    provider: ProviderServer, http: httpx.Client
) -> None:
    provider.control.set_fault("stall_before_first_byte", seconds=2)
    body = {"model": "gpt-4o-mini", "messages": MESSAGES}
    with pytest.raises(httpx.ReadTimeout):
        http.post("/v1/chat/completions", json=body, timeout=httpx.Timeout(5, read=0.2))


async def test_a_stall_before_the_first_byte_ends_when_released(
    provider: ProviderServer,
) -> None:
    """``release`` ends the stall of every request received before it, JSON or streamed,
    chat or embeddings, even one still on its way to its stall (the minute is never
    waited out); a request received afterwards stalls again."""
    provider.control.set_fault("stall_before_first_byte", count=4, seconds=60)
    chat_body = {"model": "gpt-4o-mini", "messages": MESSAGES}
    bodies = [
        ("/v1/chat/completions", chat_body),
        ("/v1/chat/completions", {**chat_body, "stream": True}),
        ("/v1/embeddings", {"model": "m", "input": "a prism"}),
    ]
    async with httpx.AsyncClient(base_url=provider.url, timeout=30, trust_env=False) as http:
        held = [asyncio.ensure_future(http.post(path, json=body)) for path, body in bodies]

        def received() -> bool:
            paths: dict[str, int] = provider.control.stats()["paths"]
            return paths.get("/v1/chat/completions") == 2 and paths.get("/v1/embeddings") == 1

        await asyncio.to_thread(wait_for, received)
        assert not any(request.done() for request in held)
        await asyncio.to_thread(provider.control.release)
        answers = await asyncio.gather(*held)
        assert [a.status_code for a in answers] == [200, 200, 200]
        assert answers[1].text.endswith("data: [DONE]\n\n")
        # The next stall waits anew: released only by the next release.
        later = asyncio.ensure_future(http.post("/v1/chat/completions", json=chat_body))
        await asyncio.to_thread(wait_for, lambda: provider.control.stats()["chat_requests"] == 3)
        await asyncio.sleep(0.1)  # not a wait for anything: time to answer, were it released
        assert not later.done()
        await asyncio.to_thread(provider.control.release)
        assert (await later).status_code == 200


def test_stall_mid_stream_sends_the_first_chunk_before_stalling(
    provider: ProviderServer, http: httpx.Client
) -> None:
    provider.control.set_fault("stall_mid_stream", seconds=1.5)
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "stream": True}
    started = time.monotonic()
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        lines = response.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        first_at = time.monotonic() - started
        rest = [line[len("data: ") :] for line in lines if line.startswith("data: ")]
    done_at = time.monotonic() - started
    assert orjson.loads(first[len("data: ") :])["choices"][0]["delta"]["role"] == "assistant"
    assert first_at < 1.0, f"first chunk took {first_at:.3f}s, it must come before the stall"
    assert done_at >= 1.5
    assert rest[-1] == "[DONE]"


def test_a_stall_ends_when_released_and_the_stream_goes_on(
    provider: ProviderServer, http: httpx.Client
) -> None:
    """``release`` ends the stalls in progress (the minute is never waited out); a stall
    that starts afterwards waits again."""
    provider.control.set_fault("stall_mid_stream", count=2, seconds=60)
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "stream": True}
    for done in range(2):
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            wait_for(lambda: provider.control.stats()["open_streams"] == 1)
            assert provider.control.stats()["streams_completed"] == done
            provider.control.release()
            rest = [line[len("data: ") :] for line in lines if line.startswith("data: ")]
        assert rest[-1] == "[DONE]"
    assert provider.control.stats()["streams_completed"] == 2


def test_malformed_json_fault(provider: ProviderServer, http: httpx.Client) -> None:
    provider.control.set_fault("malformed_json", count=2)
    response = chat(http)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(response.content)

    data = sse_data(chat(http, stream=True).text)
    with pytest.raises(orjson.JSONDecodeError):
        for payload in data[:-1]:
            orjson.loads(payload)


def test_truncated_stream_ends_without_finish_or_done(
    provider: ProviderServer, http: httpx.Client
) -> None:
    provider.control.set_fault("truncated_stream", after_chunks=3)
    data = sse_data(chat(http, stream=True).text)
    assert len(data) == 3
    assert "[DONE]" not in data
    assert all(orjson.loads(d)["choices"][0]["finish_reason"] is None for d in data)

    provider.control.set_fault("truncated_stream")
    response = chat(http)
    assert response.status_code == 200
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(response.content)


def test_truncated_stream_with_abort_drops_the_connection(
    provider: ProviderServer, http: httpx.Client
) -> None:
    provider.control.set_fault("truncated_stream", after_chunks=3, abort=1)
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "stream": True}
    received: list[str] = []
    with (
        pytest.raises(httpx.RemoteProtocolError),
        http.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        received.extend(response.iter_lines())
    data = [line[len("data: ") :] for line in received if line.startswith("data: ")]
    assert len(data) == 3 and "[DONE]" not in data
    assert all(orjson.loads(d)["choices"][0]["finish_reason"] is None for d in data)

    provider.control.set_fault("truncated_stream", abort=1)
    with pytest.raises(httpx.RemoteProtocolError):
        chat(http)
    assert chat(http).status_code == 200, "the server still answers after a cut"


def test_no_done_finishes_every_choice_and_ends_cleanly(
    provider: ProviderServer, http: httpx.Client
) -> None:
    provider.control.set_fault("no_done")
    data = sse_data(chat(http, stream=True, n=2).text)
    assert "[DONE]" not in data
    finishes = {c["index"]: c["finish_reason"] for d in data for c in orjson.loads(d)["choices"]}
    assert finishes == {0: "stop", 1: "stop"}
    assert chat(http, stream=True).text.endswith("data: [DONE]\n\n"), "one request only"

    provider.control.set_fault("no_done")
    body = {"model": "claude-3-5-haiku-latest", "max_tokens": 8, "messages": MESSAGES}
    response = http.post("/v1/messages", json={**body, "stream": True}, headers=ANTHROPIC_HEADERS)
    names = [name for name, _ in sse_events(response.text)]
    assert names[-2:] == ["content_block_stop", "message_delta"]
    assert "message_stop" not in names


def test_stall_after_headers_sends_headers_then_nothing(
    provider: ProviderServer, http: httpx.Client
) -> None:
    # The stall outlasts the read timeout: the headers arrive, the first byte does not.
    provider.control.set_fault("stall_after_headers", count=2, seconds=5)
    body = {"model": "gpt-4o-mini", "messages": MESSAGES}
    for stream, media in ((True, "text/event-stream"), (False, "application/json")):
        with (
            pytest.raises(httpx.ReadTimeout),
            http.stream(
                "POST",
                "/v1/chat/completions",
                json={**body, "stream": stream},
                timeout=httpx.Timeout(5, read=1.5),
            ) as response,
        ):
            assert response.status_code == 200
            assert response.headers["content-type"].startswith(media)
            response.read()

    # A short stall: then the whole answer.
    provider.control.set_fault("stall_after_headers", seconds=0.3)
    started = time.monotonic()
    response = chat(http, stream=True)
    assert time.monotonic() - started >= 0.3
    assert response.text.startswith("data: ") and response.text.endswith("data: [DONE]\n\n")


def test_probability_hits_a_seeded_share_of_requests(
    provider: ProviderServer, http: httpx.Client
) -> None:
    def run() -> list[int]:
        provider.control.reset()
        provider.control.set_fault("status", count=-1, status=503, probability=0.3, seed=7)
        return [chat(http).status_code for _ in range(200)]

    first = run()
    assert first == run(), "the same seed hits the same requests"
    failed = first.count(503)
    assert 40 <= failed <= 80, failed  # 30 % of 200, well inside the binomial spread
    assert set(first) == {200, 503}
    stats = provider.control.stats()
    assert stats["outcomes"] == {"ok": 200 - failed, "status": failed}
    assert stats["faults_applied"] == failed

    provider.control.reset()
    provider.control.set_fault("status", count=3, status=500, probability=0.5)
    codes = [chat(http).status_code for _ in range(40)]
    assert codes.count(500) == 3, "count counts the requests that got the fault"
    assert http.post("/_control/faults", json={"mode": "status", "probability": 0}).is_error
    assert http.post("/_control/faults", json={"mode": "status", "probability": 1.5}).is_error


def test_log_records_each_chat_request_in_order(
    provider: ProviderServer, http: httpx.Client
) -> None:
    before = time.time()
    provider.control.set_fault("rate_limit")
    chat(http)
    chat(http, stream=True)
    log = provider.control.log()
    assert [(r["outcome"], r["stream"]) for r in log] == [("rate_limit", False), ("ok", True)]
    assert before <= log[0]["t"] <= log[1]["t"] <= time.time()
    provider.control.reset()
    assert provider.control.log() == []


def test_latency_fault_delays_the_answer(provider: ProviderServer, http: httpx.Client) -> None:
    provider.control.set_fault("latency", ms=150)
    started = time.monotonic()
    assert chat(http).status_code == 200
    assert time.monotonic() - started >= 0.15


def test_fault_headers_apply_to_one_request_only(
    provider: ProviderServer, http: httpx.Client
) -> None:
    provider.control.set_fault("status", status=503)
    headers = {"x-fault-mode": "rate_limit", "x-fault-retry-after": "3"}
    direct = chat(http, headers=headers)
    assert direct.status_code == 429 and direct.headers["retry-after"] == "3"
    assert chat(http).status_code == 503, "the queued fault was not consumed"
    assert chat(http).status_code == 200


def test_unknown_fault_is_rejected(provider: ProviderServer, http: httpx.Client) -> None:
    assert http.post("/_control/faults", json={"mode": "explode"}).status_code == 400
    assert http.post("/_control/faults", json={"mode": "status", "count": 0}).status_code == 400
    assert chat(http, headers={"x-fault-mode": "explode"}).status_code == 400
    assert provider.control.stats()["pending_faults"] == []


async def test_faults_are_counted_exactly_under_concurrency(provider: ProviderServer) -> None:
    provider.control.set_fault("status", count=5, status=503)
    body = {"model": "gpt-4o-mini", "messages": MESSAGES}
    async with httpx.AsyncClient(base_url=provider.url, trust_env=False) as client:
        responses = await asyncio.gather(
            *(client.post("/v1/chat/completions", json=body) for _ in range(20))
        )
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] * 15 + [503] * 5
    assert provider.control.stats()["faults_applied"] == 5


def test_faults_are_per_server(provider: ProviderServer, provider_factory: ProviderFactory) -> None:
    other = provider_factory(ProviderSettings())
    other.control.set_fault("status", count=-1, status=500)
    with httpx.Client(base_url=provider.url, trust_env=False) as client:
        assert chat(client).status_code == 200


# ---------------------------------------------------------------- stats and control


def test_stats_count_requests_per_path(provider: ProviderServer, http: httpx.Client) -> None:
    chat(http)
    chat(http, stream=True)
    body = {"model": "claude-3-5-haiku-latest", "max_tokens": 8, "messages": MESSAGES}
    http.post("/v1/messages", json=body, headers=ANTHROPIC_HEADERS)
    http.get("/v1/models")
    http.get("/v1/models", headers=ANTHROPIC_HEADERS)
    stats = provider.control.stats()
    assert stats["chat_requests"] == 3
    # A gateway lists models in the background: counted apart from the API calls.
    assert stats["paths"] == {"/v1/chat/completions": 2, "/v1/messages": 1}
    assert stats["model_lists"] == {"openai": 1, "anthropic": 1}
    assert stats["streams_completed"] == 1 and stats["open_streams"] == 0

    provider.control.reset()
    assert provider.control.stats()["chat_requests"] == 0


def test_stats_track_open_and_aborted_streams(provider: ProviderServer, http: httpx.Client) -> None:
    provider.control.set_fault("stall_mid_stream", seconds=30)
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        # Keep a reference: a dropped line iterator makes httpx close the connection.
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        wait_for(lambda: provider.control.stats()["open_streams"] == 1)
        assert provider.control.stats()["streams_aborted"] == 0
    # Leaving the block closes the connection mid-stream: the server must notice.
    wait_for(lambda: provider.control.stats()["open_streams"] == 0)
    stats = provider.control.stats()
    assert stats["streams_aborted"] == 1 and stats["streams_completed"] == 0


def test_recent_requests_show_what_was_sent(provider: ProviderServer, http: httpx.Client) -> None:
    chat(http, headers={"x-trace": "abc"}, seed=7)
    [seen] = provider.control.requests()
    assert seen["path"] == "/v1/chat/completions"
    assert seen["headers"]["x-trace"] == "abc"
    assert seen["body"]["seed"] == 7


# ---------------------------------------------------------------- settings and runner


def test_tokens_per_second_paces_the_stream(provider_factory: ProviderFactory) -> None:
    server = provider_factory(ProviderSettings(tokens_per_second=100, latency_ms=100))
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "stream": True}
    started = time.monotonic()
    with httpx.Client(trust_env=False) as client:
        text = client.post(server.url + "/v1/chat/completions", json=body).text
    elapsed = time.monotonic() - started
    content = "".join(
        orjson.loads(d)["choices"][0]["delta"].get("content") or "" for d in sse_data(text)[:-1]
    )
    words = len(content.split())
    assert elapsed >= 0.1 + words / 100 * 0.9, f"{words} words streamed in {elapsed:.3f}s"


def test_restart_serves_the_same_state_on_the_same_port(
    provider_factory: ProviderFactory,
) -> None:
    server = provider_factory(ProviderSettings())
    url = server.url
    server.control.set_fault("status", count=-1, status=503)
    with httpx.Client(base_url=url, trust_env=False) as client:
        assert chat(client).status_code == 503
    server.stop()
    with pytest.raises(httpx.ConnectError), httpx.Client(base_url=url, trust_env=False) as client:
        chat(client)
    server.start()
    assert server.url == url
    with httpx.Client(base_url=url, trust_env=False) as client:
        assert chat(client).status_code == 503, "the queued fault survived the restart"
    server.control.clear()
    assert server.control.stats()["chat_requests"] == 2


def test_secondary_provider_is_a_separate_server(
    provider: ProviderServer, secondary_provider: ProviderServer
) -> None:
    assert secondary_provider.url != provider.url
    provider.control.set_fault("status", count=-1, status=500)
    with httpx.Client(base_url=secondary_provider.url, trust_env=False) as client:
        assert chat(client).status_code == 200
    assert provider.control.stats()["chat_requests"] == 0


def test_closed_port_refuses_connections(closed_provider_url: str) -> None:
    with pytest.raises(httpx.ConnectError):
        httpx.get(closed_provider_url + "/v1/models", trust_env=False)


def test_runner_serves_the_app() -> None:
    port = closed_port()
    command = [sys.executable, "-m", "deploy.local.provider", "--port", str(port)]
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:

        def answers() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/v1/models", trust_env=False).is_success
            except httpx.TransportError:
                assert process.poll() is None, "the runner exited"
                return False

        wait_for(answers, timeout=15)
    finally:
        process.terminate()
        process.wait(timeout=10)
