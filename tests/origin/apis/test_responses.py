"""``POST /v1/responses`` through the origin with the official openai SDK
(``client.responses.create`` / ``.stream`` / ``.parse``), over real HTTP and a real Redis,
towards the local OpenAI-compatible stand-in and the Anthropic one: plain text, a function
call round trip, JSON-schema output, misses then Redis hits replayed identically (as JSON
and as the event stream), stateful requests bypassed, bad input refused with its param."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
from pathlib import Path
from typing import Any

import httpx
import httpx2
import openai
import pytest
from openai.types.responses import FunctionToolParam, ResponseFunctionToolCall
from pydantic import BaseModel

from deploy.local.provider import ProviderServer
from origin.providers.base import ProviderSpec
from origin.providers.openai import OpenAICompatibleProvider
from prism import KeyRing
from tests.fixtures.origin import OriginFactory, RunningOrigin
from tests.fixtures.provider import claude_and_local

PATH = "/v1/responses"
OPENAI_MODEL = "gpt-4o-mini"  # routed to the OpenAI-compatible stand-in
CLAUDE_MODEL = "claude-prism-test"  # routed to the Anthropic stand-in, through its adapter
MODELS = [OPENAI_MODEL, CLAUDE_MODEL]
WEATHER: FunctionToolParam = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": False,
}


class Weather(BaseModel):
    city: str
    celsius: int


@pytest.fixture
def origin(
    origin_factory: OriginFactory, provider: ProviderServer, tmp_path: Path
) -> RunningOrigin:
    return origin_factory(PRISM_PROVIDERS_FILE=str(claude_and_local(provider, tmp_path)))


def sdk(origin: RunningOrigin, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=origin.url + "/v1", api_key=api_key, max_retries=0)


def layer(response: httpx.Response | httpx2.Response) -> str:
    return response.headers["x-prism-edge-cache-layer"]


def upstream_calls(provider: ProviderServer) -> int:
    paths: dict[str, int] = provider.control.stats()["paths"]
    return sum(paths.values())


def unique(text: str) -> str:
    return f"{text} {secrets.token_hex(4)}"


def events_of(body: str) -> list[dict[str, Any]]:
    """The data of each event of an event stream, checked against its ``event:`` line."""
    events = []
    for frame in body.strip().split("\n\n"):
        kind, data = frame.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        events.append(event)
    return events


@pytest.mark.parametrize("model", MODELS)
def test_plain_text_miss_then_a_redis_hit_replayed_byte_for_byte(
    origin: RunningOrigin, api_key: str, provider: ProviderServer, model: str
) -> None:
    client = sdk(origin, api_key)
    question = unique("tell me about prisms")
    args: dict[str, Any] = {
        "model": model,
        "input": question,
        "instructions": "Be brief.",
        "max_output_tokens": 64,
        "temperature": 0,
    }
    first = client.responses.with_raw_response.create(**args)
    origin.wait_stored()
    second = client.responses.with_raw_response.create(**args)
    assert (layer(first.http_response), layer(second.http_response)) == ("miss", "redis")
    assert first.http_response.content == second.http_response.content
    response = first.parse()
    assert response.object == "response" and response.status == "completed"
    assert response.id.startswith("resp_") and response.instructions == "Be brief."
    assert response.output_text.startswith("Echo: " + question[:20])
    assert response.output[0].type == "message" and response.output[0].role == "assistant"
    assert response.usage is not None
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert upstream_calls(provider) == 1
    sent = provider.control.requests()[-1]
    if model == OPENAI_MODEL:  # translated to a chat completion
        assert sent["path"] == "/v1/chat/completions"
        assert sent["body"]["messages"] == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": question},
        ]
        assert sent["body"]["max_tokens"] == 64 and sent["body"]["temperature"] == 0
    else:  # and on through the Anthropic adapter
        assert sent["path"] == "/v1/messages" and sent["body"]["system"] == "Be brief."


@pytest.mark.parametrize("model", MODELS)
def test_a_streamed_miss_then_stream_and_plain_hits_from_the_same_entry(
    origin: RunningOrigin, api_key: str, provider: ProviderServer, model: str
) -> None:
    client = sdk(origin, api_key)
    question = unique("stream me")
    with client.responses.stream(model=model, input=question) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") > 1  # streamed as it came
    assert {
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    } <= set(kinds)
    assert streamed.output_text.startswith("Echo: stream me")
    origin.wait_stored()
    with client.responses.stream(model=model, input=question) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        replayed = stream.get_final_response()
    assert deltas == streamed.output_text
    assert replayed.model_dump() == streamed.model_dump()
    plain = client.responses.with_raw_response.create(model=model, input=question)
    assert layer(plain.http_response) == "redis"
    hit = plain.parse()
    assert (hit.id, hit.output_text, hit.usage) == (
        streamed.id,
        streamed.output_text,
        streamed.usage,
    )
    # Each replay of the entry is the same event stream, numbered from 0.
    body = {"model": model, "input": question, "stream": True}
    headers = {"authorization": f"Bearer {api_key}"}
    again = [httpx.post(origin.url + PATH, json=body, headers=headers) for _ in range(2)]
    assert [layer(r) for r in again] == ["redis", "redis"]
    assert again[0].content == again[1].content
    events = events_of(again[0].text)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["response"] == json.loads(plain.http_response.content)
    assert upstream_calls(provider) == 1


@pytest.mark.parametrize("model", MODELS)
def test_a_function_call_round_trip_streamed_plain_and_replayed(
    origin: RunningOrigin, api_key: str, model: str
) -> None:
    client = sdk(origin, api_key)
    question = unique("what does get_weather say for Paris?")
    with client.responses.stream(model=model, input=question, tools=[WEATHER]) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    assert "response.function_call_arguments.done" in kinds
    call = streamed.output[-1]
    assert isinstance(call, ResponseFunctionToolCall) and call.name == "get_weather"
    assert set(json.loads(call.arguments)) == {"city"} and call.call_id
    origin.wait_stored()
    with client.responses.stream(model=model, input=question, tools=[WEATHER]) as stream:
        assert stream.get_final_response().output == streamed.output  # replayed from Redis
    plain = client.responses.create(model=model, input=question, tools=[WEATHER]).output[-1]
    assert isinstance(plain, ResponseFunctionToolCall)
    assert (plain.id, plain.call_id, plain.arguments) == (call.id, call.call_id, call.arguments)
    # the call's output goes back as an input item, and the model answers in text
    answer = client.responses.create(
        model=model,
        tools=[WEATHER],
        input=[
            {"role": "user", "content": question},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21C"},
        ],
    )
    assert answer.output[0].type == "message" and answer.output_text.startswith("Echo:")


@pytest.mark.parametrize("model", MODELS)
def test_json_schema_output_parses_into_its_model_and_hits_redis(
    origin: RunningOrigin, api_key: str, provider: ProviderServer, model: str
) -> None:
    client = sdk(origin, api_key)
    question = unique("weather in Paris as JSON")
    first = client.responses.parse(model=model, input=question, text_format=Weather)
    assert isinstance(first.output_parsed, Weather)
    sent = provider.control.requests()[-1]["body"]
    if model == OPENAI_MODEL:
        assert sent["response_format"]["type"] == "json_schema"
        assert sent["response_format"]["json_schema"]["name"] == "Weather"
        assert sent["response_format"]["json_schema"]["strict"] is True
    else:  # Anthropic's: the schema is the one tool it must call
        assert sent["tool_choice"] == {"type": "tool", "name": "prism_structured_output"}
    origin.wait_stored()
    with client.responses.stream(model=model, input=question, text_format=Weather) as s:
        replayed = s.get_final_response()
    assert replayed.output_parsed == first.output_parsed
    assert upstream_calls(provider) == 1


@pytest.mark.parametrize(
    "stateful",
    [{"store": True}, {"previous_response_id": "resp_abc"}],
    ids=["store", "previous_response_id"],
)
def test_stateful_requests_bypass_the_cache(
    origin: RunningOrigin, api_key: str, provider: ProviderServer, stateful: dict[str, Any]
) -> None:
    body = {"model": OPENAI_MODEL, "input": unique("keep this"), **stateful}
    headers = {"authorization": f"Bearer {api_key}"}
    answers = [httpx.post(origin.url + PATH, json=body, headers=headers) for _ in range(2)]
    assert [layer(r) for r in answers] == ["bypass", "bypass"]
    if "store" in stateful:  # answered, never stored
        assert [r.status_code for r in answers] == [200, 200]
        assert upstream_calls(provider) == 2
    else:  # Prism has no response to continue from
        assert [r.status_code for r in answers] == [400, 400]
        assert answers[0].json()["error"]["param"] == "previous_response_id"
        assert upstream_calls(provider) == 0
    stateless = {"model": OPENAI_MODEL, "input": body["input"], "store": False}
    assert layer(httpx.post(origin.url + PATH, json=stateless, headers=headers)) == "miss"


def good(**extra: Any) -> dict[str, Any]:
    return {"model": OPENAI_MODEL, "input": "hello", **extra}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": OPENAI_MODEL}, "input"),
        (good(input=42), "input"),
        (good(input=[]), "input"),
        (good(input=["hi"]), "input[0]"),
        (
            good(input=[{"role": "user", "content": "a"}, {"type": "web_search_call"}]),
            "input[1].type",
        ),
        (good(input=[{"type": "message", "role": "robot", "content": "a"}]), "input[0].role"),
        (
            good(input=[{"role": "user", "content": [{"type": "input_video"}]}]),
            "input[0].content[0].type",
        ),
        (
            good(input=[{"type": "function_call", "name": "f", "arguments": "{}"}]),
            "input[0].call_id",
        ),
        (
            good(input=[{"type": "function_call_output", "call_id": "c", "output": 5}]),
            "input[0].output",
        ),
        (good(tools={"type": "function"}), "tools"),
        (good(tools=[{"type": "function", "parameters": {}}]), "tools[0].name"),
        (good(tools=[{"type": "function", "name": "f", "parameters": "x"}]), "tools[0].parameters"),
        (good(tools=[{"name": "f"}]), "tools[0]"),
        (good(tool_choice="sometimes"), "tool_choice"),
        (good(text={"format": {"type": "yaml"}}), "text.format.type"),
        (good(text={"format": {"type": "json_schema", "name": "x"}}), "text.format.schema"),
        (good(max_output_tokens=0), "max_output_tokens"),
        (good(temperature=3), "temperature"),
        (good(instructions=["x"]), "instructions"),
        (good(store="yes"), "store"),
        (good(model=""), "model"),
    ],
)
def test_bad_bodies_are_400s_naming_the_param_and_nothing_is_called(
    origin: RunningOrigin, api_key: str, provider: ProviderServer, body: dict[str, Any], param: str
) -> None:
    headers = {"authorization": f"Bearer {api_key}"}
    response = httpx.post(origin.url + PATH, json=body, headers=headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert param in error["message"]
    assert upstream_calls(provider) == 0


def test_what_chat_cannot_carry_is_a_400_and_the_sdk_raises_it(
    origin: RunningOrigin, api_key: str, provider: ProviderServer
) -> None:
    client = sdk(origin, api_key)
    with pytest.raises(openai.BadRequestError) as hosted:
        client.responses.create(
            model=OPENAI_MODEL, input="search", tools=[{"type": "web_search_preview"}]
        )
    assert hosted.value.status_code == 400
    assert isinstance(hosted.value.body, dict) and hosted.value.body["param"] == "tools[0].type"
    with pytest.raises(openai.BadRequestError):
        client.responses.create(
            model=OPENAI_MODEL, input=[{"type": "item_reference", "id": "msg_1"}]
        )
    assert upstream_calls(provider) == 0


def test_stored_responses_are_404s_in_openai_format(origin: RunningOrigin, api_key: str) -> None:
    client = sdk(origin, api_key)
    with pytest.raises(openai.NotFoundError) as read:
        client.responses.retrieve("resp_123")
    assert read.value.status_code == 404
    assert isinstance(read.value.body, dict) and read.value.body["code"] == "response_not_found"
    assert "resp_123" in read.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.responses.delete("resp_123")
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_123")
    with pytest.raises(openai.AuthenticationError):
        sdk(origin, "sk-prism-v1.acme.nope.nope").responses.retrieve("resp_123")
    wrong = httpx.get(origin.url + PATH, headers={"authorization": f"Bearer {api_key}"})
    assert wrong.status_code == 405 and wrong.json()["error"]["type"] == "invalid_request_error"


def test_a_stream_cut_midway_ends_in_an_error_event_and_is_not_cached(
    origin: RunningOrigin, api_key: str, provider: ProviderServer
) -> None:
    provider.control.set_fault("truncated_stream", after_chunks=3)
    body = {"model": OPENAI_MODEL, "input": unique("cut"), "stream": True}
    headers = {"authorization": f"Bearer {api_key}"}
    cut = httpx.post(origin.url + PATH, json=body, headers=headers, timeout=30)
    assert cut.status_code == 200 and layer(cut) == "miss"
    events = events_of(cut.text)
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "error"
    assert "response.completed" not in cut.text
    origin.wait_stored()
    again = httpx.post(origin.url + PATH, json=body, headers=headers, timeout=30)
    assert layer(again) == "miss" and events_of(again.text)[-1]["type"] == "response.completed"


# -- passed through to a provider that serves the Responses API itself -----------------


@pytest.fixture
def native(
    origin_factory: OriginFactory, provider: ProviderServer, tmp_path: Path
) -> RunningOrigin:
    config = tmp_path / "native.toml"
    config.write_text(
        f"""
[providers.openai]
base_url = "{provider.url}/v1"
api_key = "provider-test-key"
responses_api = true

[models]
"*" = ["openai"]
"""
    )
    return origin_factory(PRISM_PROVIDERS_FILE=str(config))


def test_a_native_provider_gets_the_body_as_sent_and_its_answer_is_cached(
    native: RunningOrigin, api_key: str, provider: ProviderServer
) -> None:
    client = sdk(native, api_key)
    question = unique("pass me through")
    args: dict[str, Any] = {"model": OPENAI_MODEL, "input": question, "metadata": {"k": "v"}}
    first = client.responses.with_raw_response.create(**args)
    sent = provider.control.requests()[-1]
    assert sent["path"] == "/v1/responses"
    # as sent, but told not to store what Prism treats as stateless
    assert sent["body"] == {**args, "stream": False, "store": False}
    native.wait_stored()
    second = client.responses.with_raw_response.create(**args)
    assert (layer(first.http_response), layer(second.http_response)) == ("miss", "redis")
    assert first.http_response.content == second.http_response.content
    assert first.parse().output_text.startswith("Echo: pass me through")
    with client.responses.stream(model=OPENAI_MODEL, input=question) as stream:
        replayed = stream.get_final_response()  # the stored answer, as the event stream
    assert replayed.output_text == first.parse().output_text
    assert upstream_calls(provider) == 1


def test_a_native_stream_is_relayed_and_assembled_then_replayed(
    native: RunningOrigin, api_key: str, provider: ProviderServer
) -> None:
    client = sdk(native, api_key)
    question = unique("what does get_weather say for Oslo?")
    with client.responses.stream(model=OPENAI_MODEL, input=question, tools=[WEATHER]) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_response()
    assert kinds.count("response.function_call_arguments.delta") > 1
    call = streamed.output[-1]
    assert isinstance(call, ResponseFunctionToolCall) and call.name == "get_weather"
    assert provider.control.requests()[-1]["body"]["stream"] is True
    native.wait_stored()
    plain = client.responses.with_raw_response.create(
        model=OPENAI_MODEL, input=question, tools=[WEATHER]
    )
    assert layer(plain.http_response) == "redis"
    hit = plain.parse().output[-1]
    assert isinstance(hit, ResponseFunctionToolCall) and hit.arguments == call.arguments
    assert upstream_calls(provider) == 1


@pytest.mark.parametrize(
    "stateful",
    [{"store": True}, {"previous_response_id": "resp_abc", "store": True}],
    ids=["store", "previous_response_id"],
)
def test_stateful_requests_pass_through_to_a_native_provider_uncached(
    native: RunningOrigin, api_key: str, provider: ProviderServer, stateful: dict[str, Any]
) -> None:
    body = {"model": OPENAI_MODEL, "input": unique("remember this"), **stateful}
    headers = {"authorization": f"Bearer {api_key}"}
    answers = [httpx.post(native.url + PATH, json=body, headers=headers) for _ in range(2)]
    assert [(r.status_code, layer(r)) for r in answers] == [(200, "bypass"), (200, "bypass")]
    assert provider.control.requests()[-1]["body"] == {**body, "stream": False}
    assert upstream_calls(provider) == 2


def test_a_response_kept_with_store_is_read_and_deleted_through_its_provider_by_its_project(
    native: RunningOrigin, api_key: str, key_ring: KeyRing, provider: ProviderServer
) -> None:
    """``store: true`` reaches a native provider, which keeps the response; Prism notes
    whose it is, so GET and DELETE reach that provider for that project, and another
    project's key gets the same 404 as for an id nobody kept."""

    def kept_by_provider(ident: str) -> bool:
        return httpx.get(f"{provider.url}/v1/responses/{ident}").status_code == 200

    client = sdk(native, api_key)
    kept = client.responses.create(model=OPENAI_MODEL, input=unique("keep me"), store=True)
    native.wait_stored()
    assert kept_by_provider(kept.id)
    read = client.responses.retrieve(kept.id)
    assert read.id == kept.id and read.output_text == kept.output_text
    stranger = sdk(native, key_ring.mint("globex"))
    for attempt in (stranger.responses.retrieve, stranger.responses.delete):
        with pytest.raises(openai.NotFoundError) as refused:
            attempt(kept.id)
        assert isinstance(refused.value.body, dict)
        assert refused.value.body["code"] == "response_not_found"
    assert kept_by_provider(kept.id)  # the stranger's DELETE never reached it
    client.responses.delete(kept.id)
    assert not kept_by_provider(kept.id)
    native.wait_stored()
    with pytest.raises(openai.NotFoundError):  # deleted: the provider's own 404 now
        client.responses.retrieve(kept.id)
    unkept = client.responses.create(model=OPENAI_MODEL, input=unique("not kept"))
    with pytest.raises(openai.NotFoundError):  # store not asked: the provider was told not to
        client.responses.retrieve(unkept.id)


def test_the_responses_api_option_must_be_a_boolean() -> None:
    spec = ProviderSpec("openai", "openai", "http://127.0.0.1:9", options={"responses_api": "yes"})
    with pytest.raises(ValueError, match="responses_api must be true or false"):
        OpenAICompatibleProvider(spec)
    assert not OpenAICompatibleProvider(dataclasses.replace(spec, options={})).responses_api


def test_identical_concurrent_requests_make_one_provider_call(
    origin: RunningOrigin, api_key: str, provider: ProviderServer
) -> None:
    provider.control.set_fault("latency", ms=300)
    body = {"model": OPENAI_MODEL, "input": unique("together")}

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=origin.url, headers={"authorization": f"Bearer {api_key}"}, timeout=30
        ) as http:
            return await asyncio.gather(
                *[http.post(PATH, json={**body, "stream": i % 2 == 1}) for i in range(10)]
            )

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * 10
    plain = [r for r in responses if r.headers["content-type"] == "application/json"]
    streamed = [r for r in responses if r.headers["content-type"].startswith("text/event")]
    assert len(plain) == len(streamed) == 5 and len({r.content for r in plain}) == 1
    answer = json.loads(plain[0].content)
    for response in streamed:  # each stream ends with the one answer, whole
        assert events_of(response.text)[-1]["response"]["output"] == answer["output"]
    assert upstream_calls(provider) == 1
