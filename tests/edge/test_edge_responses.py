"""``POST /v1/responses`` through the edge Worker in the real local Workers runtime, with
the official openai SDK: KV hits at the PoP, as JSON and as the event stream; stateful
requests forwarded every time; bad input refused at the PoP in OpenAI's format."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import httpx2
import openai
import pytest
from openai.types.responses import FunctionToolParam, ResponseFunctionToolCall
from pydantic import BaseModel

from deploy.local.provider import ProviderServer
from deploy.local.redis import RedisServer
from prism import KeyRing
from tests.fixtures.edge import EdgeStack, edge_with_providers
from tests.fixtures.provider import claude_and_local
from tests.fixtures.workers import WorkersRuntimeFactory
from tests.polling import wait_for

PATH = "/v1/responses"
MODEL = "gpt-4o-mini"
WEATHER: FunctionToolParam = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": False,
}


def layer(response: httpx.Response | httpx2.Response) -> str:
    return response.headers["x-prism-edge-cache-layer"]


def sdk(edge: EdgeStack, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=edge.url + "/v1", api_key=api_key, max_retries=0)


def test_the_sdk_misses_then_hits_kv_plain_and_streamed(edge: EdgeStack, api_key: str) -> None:
    client = sdk(edge, api_key)
    question = f"edge responses {secrets.token_hex(4)}"
    with client.responses.with_streaming_response.create(
        model=MODEL, input=question, stream=True
    ) as response:
        assert layer(response.http_response) == "miss"
        events = list(response.parse())
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert events[-1].type == "response.completed"
    streamed = events[-1].response
    assert text.startswith("Echo: edge responses") and streamed.output_text == text

    def from_kv() -> bool:
        plain = client.responses.with_raw_response.create(model=MODEL, input=question)
        return layer(plain.http_response) == "kv"

    wait_for(from_kv)  # the origin's KV writer replicated the streamed answer
    before = edge.origin_requests()
    with client.responses.with_streaming_response.create(
        model=MODEL, input=question, stream=True
    ) as response:
        assert layer(response.http_response) == "kv"
    with client.responses.stream(model=MODEL, input=question) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert final.id == streamed.id and final.output_text == text
    assert final.usage is not None and final.usage.output_tokens > 0
    # the same entry's replay is the same bytes every time, at the PoP as at the origin
    body = {"model": MODEL, "input": question, "stream": True}
    headers = {"authorization": f"Bearer {api_key}"}
    replays = [httpx.post(edge.url + PATH, json=body, headers=headers, timeout=30) for _ in "ab"]
    assert [layer(r) for r in replays] == ["kv", "kv"]
    assert replays[0].content == replays[1].content
    assert replays[0].headers["content-type"].startswith("text/event-stream")
    assert edge.origin_requests() == before
    assert edge.provider.control.stats()["chat_requests"] == 1


def test_stateful_requests_are_forwarded_every_time(edge: EdgeStack, api_key: str) -> None:
    body = {"model": MODEL, "input": f"keep {secrets.token_hex(4)}", "store": True}
    headers = {"authorization": f"Bearer {api_key}"}
    before = edge.origin_requests()
    answers = [httpx.post(edge.url + PATH, json=body, headers=headers, timeout=30) for _ in "ab"]
    assert [(r.status_code, layer(r)) for r in answers] == [(200, "bypass"), (200, "bypass")]
    assert edge.origin_requests() == before + 2
    assert edge.provider.control.stats()["chat_requests"] == 2
    assert json.loads(answers[0].content)["object"] == "response"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "input": 7}, "input"),
        ({"model": MODEL, "input": [{"type": "computer_call"}]}, "input[0].type"),
        ({"model": MODEL, "input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
    ],
)
def test_bad_bodies_are_refused_at_the_pop(
    edge: EdgeStack, api_key: str, body: dict[str, Any], param: str
) -> None:
    before = edge.origin_requests()
    headers = {"authorization": f"Bearer {api_key}"}
    response = httpx.post(edge.url + PATH, json=body, headers=headers, timeout=30)
    assert response.status_code == 400 and layer(response) == "bypass"
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert edge.origin_requests() == before


def test_an_unknown_stored_response_is_the_origins_404_in_openai_format(
    edge: EdgeStack, api_key: str
) -> None:
    """Passed on (only the origin knows what is kept): its 404, not the edge's own."""
    with pytest.raises(openai.NotFoundError) as missing:
        sdk(edge, api_key).responses.retrieve("resp_123")
    assert isinstance(missing.value.body, dict) and missing.value.body["type"] == "not_found_error"
    assert missing.value.body["code"] == "response_not_found"
    with pytest.raises(openai.NotFoundError) as deleted:
        sdk(edge, api_key).responses.delete("resp_123")
    assert isinstance(deleted.value.body, dict)
    assert deleted.value.body["code"] == "response_not_found"
    headers = {"authorization": f"Bearer {api_key}"}
    bad = httpx.get(edge.url + PATH + "/resp 1", headers=headers)  # no such route at the PoP
    assert bad.status_code == 404 and "Unknown route" in bad.json()["error"]["message"]
    assert httpx.post(edge.url + PATH + "/resp_1", headers=headers).status_code == 405


@pytest.fixture(scope="module")
def native_edge(
    tmp_path_factory: pytest.TempPathFactory,
    workers_runtime_factory: WorkersRuntimeFactory,
    edge_redis: RedisServer,
    provider_server: ProviderServer,
    key_ring: KeyRing,
) -> Iterator[EdgeStack]:
    """Its own edge and origin, whose provider serves the Responses API itself."""
    folder = tmp_path_factory.mktemp("native-responses-edge")
    config = folder / "providers.toml"
    config.write_text(
        f"""
[providers.openai]
base_url = "{provider_server.url}/v1"
api_key = "provider-test-key"
responses_api = true

[models]
"*" = ["openai"]
"""
    )
    with edge_with_providers(
        folder, workers_runtime_factory, edge_redis, provider_server, key_ring, config
    ) as stack:
        yield stack


def test_a_kept_response_is_read_and_deleted_through_the_edge_by_its_project_only(
    native_edge: EdgeStack, api_key: str, key_ring: KeyRing
) -> None:
    client = sdk(native_edge, api_key)
    kept = client.responses.create(model=MODEL, input=f"keep {secrets.token_hex(4)}", store=True)
    read = client.responses.retrieve(kept.id)
    assert read.id == kept.id and read.output_text == kept.output_text
    with pytest.raises(openai.NotFoundError):
        sdk(native_edge, key_ring.mint("globex")).responses.delete(kept.id)
    assert client.responses.retrieve(kept.id).id == kept.id  # still there
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)


@pytest.fixture(scope="module")
def claude_edge(
    tmp_path_factory: pytest.TempPathFactory,
    workers_runtime_factory: WorkersRuntimeFactory,
    edge_redis: RedisServer,
    provider_server: ProviderServer,
    key_ring: KeyRing,
) -> Iterator[EdgeStack]:
    """Its own edge and origin, routing ``claude-*`` to the Anthropic stand-in."""
    folder = tmp_path_factory.mktemp("claude-responses-edge")
    config = claude_and_local(provider_server, folder)
    with edge_with_providers(
        folder, workers_runtime_factory, edge_redis, provider_server, key_ring, config
    ) as stack:
        yield stack


def test_through_the_edge_to_anthropic_a_function_call_round_trip_then_kv_hits(
    claude_edge: EdgeStack, api_key: str
) -> None:
    """The SDK's stream and create, translated to Anthropic's Messages and back: the tool
    call streamed, then replayed at the PoP (as the event stream and as JSON), then its
    output sent back and answered in text."""
    client = sdk(claude_edge, api_key)
    model = "claude-prism-test"
    question = f"what does get_weather say for Rome? {secrets.token_hex(4)}"
    with client.responses.stream(model=model, input=question, tools=[WEATHER]) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    call = streamed.output[-1]
    assert isinstance(call, ResponseFunctionToolCall) and call.name == "get_weather"

    def from_kv() -> bool:
        plain = client.responses.with_raw_response.create(
            model=model, input=question, tools=[WEATHER]
        )
        return layer(plain.http_response) == "kv"

    wait_for(from_kv)  # the origin's KV writer replicated the streamed answer
    before = claude_edge.origin_requests()
    with client.responses.stream(model=model, input=question, tools=[WEATHER]) as stream:
        assert stream.get_final_response().output == streamed.output  # replayed at the PoP
    assert claude_edge.origin_requests() == before
    answer = client.responses.create(
        model=model,
        tools=[WEATHER],
        input=[
            {"role": "user", "content": question},
            {"type": "function_call", "call_id": call.call_id, "name": call.name,
             "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21C"},
        ],
    )  # fmt: skip
    assert answer.output[0].type == "message" and answer.output_text.startswith("Echo:")
    assert claude_edge.provider.control.requests()[-1]["path"] == "/v1/messages"


class Weather(BaseModel):
    city: str
    celsius: int


def test_json_schema_output_through_the_edge_parses_then_replays_from_kv(
    claude_edge: EdgeStack, api_key: str
) -> None:
    client = sdk(claude_edge, api_key)
    question = f"weather in Lima as JSON {secrets.token_hex(4)}"
    for model in (MODEL, "claude-prism-test"):  # the OpenAI stand-in, then Anthropic's
        first = client.responses.parse(model=model, input=question, text_format=Weather)
        assert isinstance(first.output_parsed, Weather)

        def from_kv(model: str = model) -> bool:
            again = client.responses.with_raw_response.parse(
                model=model, input=question, text_format=Weather
            )
            return layer(again.http_response) == "kv"

        wait_for(from_kv)
        with client.responses.stream(model=model, input=question, text_format=Weather) as s:
            assert s.get_final_response().output_parsed == first.output_parsed
