"""The Responses event stream: a stored response replayed as events, numbered, that the
openai SDK's own stream accumulator reads, and that assembles back to the response."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.lib.streaming.responses import ResponseStreamState
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseStreamEvent,
)
from pydantic import TypeAdapter

from prism import UpstreamError
from prism.responses_sse import ResponseAssembler, error_event, replay_events, replay_response
from prism.sse import SSEDecoder

RESPONSE: dict[str, Any] = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1764400000,
    "status": "completed",
    "error": None,
    "incomplete_details": None,
    "instructions": None,
    "max_output_tokens": None,
    "model": "gpt-4o-mini",
    "output": [
        {"id": "rs_1", "type": "reasoning", "summary": []},
        {
            "id": "msg_1",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "Checking.", "annotations": [], "logprobs": []},
                {"type": "refusal", "refusal": "Not that."},
            ],
        },
        {
            "id": "fc_1",
            "type": "function_call",
            "status": "completed",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city":"Oslo"}',
        },
    ],
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "temperature": None,
    "text": {"format": {"type": "text"}},
    "tool_choice": "auto",
    "tools": [],
    "top_p": None,
    "truncation": "disabled",
    "metadata": {},
    "usage": {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 30,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 42,
    },
}


def events(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(data) for data in SSEDecoder().feed(body)]


def assemble(body: bytes) -> dict[str, Any] | None:
    assembler = ResponseAssembler()
    for event in events(body):
        assembler.add(event)
    return assembler.response()


def test_replay_is_openais_event_sequence_numbered_and_assembles_back() -> None:
    body = replay_response(RESPONSE)
    assert body.startswith(b"event: response.created\ndata: ")
    sent = events(body)
    kinds = [event["type"] for event in sent]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed" and sent[-1]["response"] == RESPONSE
    assert [event["sequence_number"] for event in sent] == list(range(len(sent)))
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done")
    assert {"response.output_text.delta", "response.refusal.delta"} <= set(kinds)
    assert "response.function_call_arguments.done" in kinds
    assert sent[0]["response"]["output"] == [] and sent[0]["response"]["status"] == "in_progress"
    assert assemble(body) == RESPONSE


def test_the_sdks_own_accumulator_reads_the_replay() -> None:
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=[], text_format=openai.omit)
    adapter: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
    seen = []
    for event in events(replay_response(RESPONSE)):
        seen += state.handle_event(adapter.validate_python(event))  # each event validates
    last = seen[-1]
    assert isinstance(last, ResponseCompletedEvent)
    call = last.response.output[2]
    assert last.response.output_text == "Checking."
    assert isinstance(call, ResponseFunctionToolCall) and call.arguments == '{"city":"Oslo"}'


def test_an_incomplete_response_ends_in_response_incomplete() -> None:
    cut = {
        **RESPONSE,
        "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"},
    }
    sent = events(replay_response(cut))
    assert sent[-1]["type"] == "response.incomplete"
    assert assemble(replay_response(cut)) == cut


def test_an_unfinished_failed_or_disordered_stream_is_never_a_response() -> None:
    sent = events(replay_response(RESPONSE))
    assembler = ResponseAssembler("p")
    for event in sent[:-1]:
        assembler.add(event)
    assert not assembler.done and assembler.response() is None
    with pytest.raises(UpstreamError, match="server_error"):
        assembler.add({"type": "error", "code": "server_error", "message": "busy"})
    failed = {"type": "response.failed", "response": {"error": {"code": "rate_limit_exceeded"}}}
    with pytest.raises(UpstreamError, match="rate_limit_exceeded"):
        ResponseAssembler().add(failed)
    with pytest.raises(UpstreamError, match=r"before response\.created"):
        ResponseAssembler().add(sent[3])
    backwards = ResponseAssembler()
    backwards.add(sent[0])
    backwards.add(sent[2])
    with pytest.raises(UpstreamError, match="sequence"):
        backwards.add(sent[1])
    skipping = ResponseAssembler()
    skipping.add(sent[0])
    with pytest.raises(UpstreamError, match="out of order"):
        skipping.add({**sent[2], "output_index": 5})


def test_the_error_event_is_openais() -> None:
    frame = error_event(UpstreamError("cut", code="upstream_truncated"))
    assert frame.startswith(b"event: error\ndata: ")
    assert events(frame) == [
        {"type": "error", "code": "upstream_truncated", "message": "cut", "param": None}
    ]


_TEXT = st.text(max_size=20)
_PART = st.one_of(
    st.builds(
        lambda t: {"type": "output_text", "text": t, "annotations": [], "logprobs": []}, _TEXT
    ),
    st.builds(lambda t: {"type": "refusal", "refusal": t}, _TEXT),
)
_ITEM = st.one_of(
    st.builds(
        lambda i, parts: {
            "id": f"msg_{i}",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": parts,
        },
        st.integers(0, 99),
        st.lists(_PART, max_size=3),
    ),
    st.builds(
        lambda i, args: {
            "id": f"fc_{i}",
            "type": "function_call",
            "status": "completed",
            "call_id": f"call_{i}",
            "name": "f",
            "arguments": args,
        },
        st.integers(0, 99),
        _TEXT,
    ),
)


@settings(max_examples=200, deadline=None)
@given(output=st.lists(_ITEM, max_size=4))
def test_replay_and_assembly_are_inverses(output: list[dict[str, Any]]) -> None:
    response = {**RESPONSE, "output": output}
    assert assemble(replay_response(response)) == response
    numbers = [event["sequence_number"] for event in replay_events(response)]
    assert numbers == sorted(set(numbers))
