"""A Responses API stream that breaks mid-answer, continued by the route's next target
through its chat API: through a real origin, a real Redis and the provider stand-in on real
HTTP (which continues its own known answer), read with the openai SDK and as raw events."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from deploy.local.provider import ProviderServer
from tests.fixtures.origin import OriginFactory, RunningOrigin
from tests.origin.apis.test_messages_resume import ANTHROPIC, OPENAI, providers_file, resumed

PATH = "/v1/responses"
NATIVE = "responses_api = true"
_questions = itertools.count()


def question() -> str:
    """A new question each time, so no answer comes from the cache."""
    return f"resume responses {next(_questions)}"


@pytest.fixture
def start_origin(
    origin_factory: OriginFactory, tmp_path: Path, provider: ProviderServer
) -> Callable[..., RunningOrigin]:
    def start(first: str = OPENAI, second: str = ANTHROPIC, route: str = "") -> RunningOrigin:
        path = tmp_path / "providers.toml"
        path.write_text(providers_file(provider.url, first, second, route))
        return origin_factory(PRISM_PROVIDERS_FILE=str(path))

    return start


def post(origin: RunningOrigin, api_key: str, text: str) -> httpx.Response:
    body = {"model": "demo", "input": text, "stream": True}
    headers = {"authorization": f"Bearer {api_key}"}
    return httpx.post(origin.url + PATH, json=body, headers=headers, timeout=30)


def events(text: str) -> list[dict[str, Any]]:
    """Each event's data, checked against its ``event:`` line."""
    out = []
    for block in text.split("\n\n"):
        if block:
            kind, data = block.split("\n", 1)
            event = json.loads(data.removeprefix("data: "))
            assert kind == f"event: {event['type']}"
            out.append(event)
    return out


def sdk(origin: RunningOrigin, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=origin.url + "/v1", api_key=api_key, max_retries=0)


def whole(origin: RunningOrigin, api_key: str, text: str) -> str:
    """The second target's whole answer, asked of it directly."""
    return sdk(origin, api_key).responses.create(model="whole", input=text).output_text


@pytest.mark.parametrize(
    ("first", "second", "fault"),
    [
        (OPENAI, ANTHROPIC, {"after_chunks": 3}),
        (OPENAI, ANTHROPIC, {"after_chunks": 3, "abort": 1}),
        (OPENAI, 'continuation = "prefix"', {"after_chunks": 3}),
        # A provider's own Responses stream cut after two text deltas.
        (NATIVE, 'continuation = "continue_final_message"', {"after_chunks": 6}),
    ],
    ids=["to-anthropic", "to-anthropic-dropped", "to-prefix", "from-native"],
)
def test_a_broken_responses_stream_is_finished_by_the_next_target_as_one_response(
    start_origin: Callable[..., RunningOrigin],
    provider: ProviderServer,
    api_key: str,
    first: str,
    second: str,
    fault: dict[str, Any],
) -> None:
    origin = start_origin(first, second)
    text = question()
    provider.control.set_fault("truncated_stream", **fault)
    response = post(origin, api_key, text)
    assert response.status_code == 200
    sequence = events(response.text)
    kinds = [e["type"] for e in sequence]
    assert kinds.count("response.created") == kinds.count("response.completed") == 1
    assert kinds[-1] == "response.completed" and "error" not in kinds
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done")
    assert kinds.count("response.output_item.added") == 1
    assert [e["sequence_number"] for e in sequence] == list(range(len(sequence)))
    answer = whole(origin, api_key, text)
    deltas = [e for e in sequence if e["type"] == "response.output_text.delta"]
    assert "".join(e["delta"] for e in deltas) == answer  # nothing repeated, nothing missing
    created, completed = sequence[0]["response"], sequence[-1]["response"]
    item_ids = {e["item_id"] for e in sequence if "item_id" in e}
    assert item_ids == {completed["output"][0]["id"]}
    assert {e["output_index"] for e in sequence if "output_index" in e} == {0}
    done = next(e for e in sequence if e["type"] == "response.output_text.done")
    assert done["text"] == completed["output"][0]["content"][0]["text"] == answer
    assert (completed["id"], completed["created_at"]) == (created["id"], created["created_at"])
    assert sequence[-1]["prism"] == {
        "providers": ["first provider", "second provider"],
        "resumed": True,
    }
    # The first part's stream reported no usage: the continuation's, whose prompt holds it.
    given = provider.control.requests()[-2]["body"]["messages"][-1]["content"]
    if isinstance(given, list):  # the Anthropic prefill's text block
        given = "".join(block["text"] for block in given)
    cut_words = len(given.split())
    assert cut_words > 0
    assert completed["usage"]["input_tokens"] == len(text.split()) + cut_words
    assert completed["usage"]["output_tokens"] == len(answer.split()) - cut_words
    assert resumed(origin, "resumed") == 1


def test_the_sdk_stream_reads_the_spliced_response(
    start_origin: Callable[..., RunningOrigin], provider: ProviderServer, api_key: str
) -> None:
    origin = start_origin()
    text = question()
    provider.control.set_fault("truncated_stream", after_chunks=3, abort=1)
    with sdk(origin, api_key).responses.stream(model="demo", input=text) as stream:
        streamed = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    answer = whole(origin, api_key, text)
    assert streamed == final.output_text == answer
    assert final.status == "completed"


def test_a_stalled_responses_stream_is_continued(
    start_origin: Callable[..., RunningOrigin], provider: ProviderServer, api_key: str
) -> None:
    origin = start_origin(first="first_byte_timeout = 0.5")
    text = question()
    provider.control.set_fault("stall_mid_stream", after_chunks=3, seconds=10)
    try:
        sequence = events(post(origin, api_key, text).text)
    finally:
        provider.control.release()
    completed = sequence[-1]["response"]
    assert completed["output"][0]["content"][0]["text"] == whole(origin, api_key, text)
    assert resumed(origin, "resumed") == 1


@pytest.mark.parametrize(
    ("second", "route", "outcome"),
    [(OPENAI, "", "unavailable"), (ANTHROPIC, "resume = false", None)],
    ids=["no-target-can-continue", "resume-off"],
)
def test_without_a_continuation_the_stream_ends_in_its_error_event(
    start_origin: Callable[..., RunningOrigin],
    provider: ProviderServer,
    api_key: str,
    second: str,
    route: str,
    outcome: str | None,
) -> None:
    origin = start_origin(second=second, route=route)
    provider.control.set_fault("truncated_stream", after_chunks=3)
    sequence = events(post(origin, api_key, question()).text)
    assert sequence[0]["type"] == "response.created" and sequence[-1]["type"] == "error"
    assert "response.completed" not in [e["type"] for e in sequence]
    assert [r["path"] for r in provider.control.requests()] == ["/v1/chat/completions"]
    assert resumed(origin, "resumed") == 0
    if outcome is not None:
        assert resumed(origin, outcome) == 1


def test_a_spliced_response_is_not_stored_by_default(
    start_origin: Callable[..., RunningOrigin], provider: ProviderServer, api_key: str
) -> None:
    origin = start_origin()
    text = question()
    provider.control.set_fault("truncated_stream", after_chunks=3)
    assert events(post(origin, api_key, text).text)[-1]["type"] == "response.completed"
    origin.wait_stored()
    assert post(origin, api_key, text).headers["x-prism-edge-cache-layer"] == "miss"


def test_an_item_the_continuation_does_not_carry_on_is_closed_first() -> None:
    from origin.apis.responses_resume import ResponsesSplice, partial_response
    from prism.responses_sse import ResponseAssembler, event_frame

    item = {"id": "msg_a", "type": "message", "role": "assistant", "content": []}
    part = {"type": "output_text", "text": "", "annotations": []}
    first: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": "resp_a", "created_at": 1}},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.content_part.added", "item_id": "msg_a", "output_index": 0}
        | {"content_index": 0, "part": part},
        {"type": "response.output_text.delta", "item_id": "msg_a", "output_index": 0}
        | {"content_index": 0, "delta": "Hi"},
    ]
    for number, event in enumerate(first):
        event["sequence_number"] = number
    partial = partial_response([event_frame(event) for event in first])
    assert partial is not None and partial.text == "Hi"
    call = {"id": "fc_1", "type": "function_call", "call_id": "1", "name": "f", "arguments": ""}
    rest: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": "resp_b", "created_at": 2}},
        {"type": "response.output_item.added", "output_index": 0, "item": call},
        {"type": "response.output_item.done", "output_index": 0, "item": call},
        {"type": "response.completed", "response": {"id": "resp_b", "output": [call]}},
    ]
    splice = ResponsesSplice(partial.meta, "", ["a", "b"])
    out = [json.loads(d) for event in rest for d in splice.feed(json.dumps(event).encode())]
    assembler = ResponseAssembler("test")
    for event in [*first, *out]:
        assembler.add(event)
    response = assembler.response()
    assert response is not None and response["id"] == "resp_a"
    assert [o["type"] for o in response["output"]] == ["message", "function_call"]
    assert response["output"][0]["content"][0]["text"] == "Hi"
    assert [e["sequence_number"] for e in out] == list(range(4, 4 + len(out)))
    assert out[-1]["prism"]["resumed"] is True
