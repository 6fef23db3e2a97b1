"""Responses ⇄ chat completions: requests translated (and refused where chat cannot carry
them), answers and streams translated back into shapes the openai SDK validates strictly,
and a translated stream assembling to what its replay would give."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from origin.providers.responses_stream import ChunkTranslator
from origin.providers.responses_translate import to_chat_request, to_response
from prism import InvalidRequestError, PrismError
from prism.responses_request import parse_responses_request
from prism.responses_sse import ResponseAssembler, replay_events

EVENTS: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}


def test_a_conversation_becomes_chat_messages() -> None:
    body = {
        "model": "m",
        "instructions": "Be brief.",
        "input": [
            {"role": "developer", "content": "Use metric units."},
            {"role": "user", "content": [
                {"type": "input_text", "text": "Weather here?"},
                {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "low"},
            ]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
            {"type": "function_call_output", "call_id": "c2",
             "output": [{"type": "input_text", "text": "Rain"}]},
        ],
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 50,
        "temperature": 0,
        "parallel_tool_calls": False,
        "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
        "metadata": {"a": "b"},
        "store": False,
        "reasoning": {"effort": "low", "summary": "auto"},
    }  # fmt: skip
    chat = to_chat_request(body, stream=True)
    call = {"type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use metric units."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Weather here?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA", "detail": "low"}},
            ],
        },
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "c1", **call}, {"id": "c2", **call}
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "Rain"},
    ]  # fmt: skip
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER["parameters"],
                "description": "Weather",
                "strict": True,
            },
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "w", "schema": {"type": "object"}},
    }
    assert (chat["max_tokens"], chat["temperature"], chat["parallel_tool_calls"]) == (50, 0, False)
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert chat["reasoning_effort"] == "low"
    assert "metadata" not in chat and "store" not in chat and "reasoning" not in chat
    plain = to_chat_request(
        {"model": "m", "input": "hi", "text": {"format": {"type": "json_object"}}}
    )
    assert plain["messages"] == [{"role": "user", "content": "hi"}]
    assert plain["response_format"] == {"type": "json_object"} and "stream" not in plain


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "web_search_preview"}]}, "tools[0].type"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
         "input[0].content[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
         "input[0].content[0].type"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"tools": [WEATHER], "tool_choice": {"type": "file_search"}}, "tool_choice.type"),
    ],
)  # fmt: skip
def test_what_chat_cannot_carry_is_a_400_naming_it(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        to_chat_request({"model": "m", "input": "hi", **extra})
    assert refused.value.param == param and refused.value.code == "unsupported_parameter"


COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-abc",
    "object": "chat.completion",
    "created": 1764400000,
    "model": "gpt-4o-mini-2024",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Looking it up.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 4},
    },
}
BODY = {"model": "gpt-4o-mini", "input": "weather?", "tools": [WEATHER], "metadata": {"a": "b"}}


def test_a_completion_becomes_a_response_the_sdk_validates() -> None:
    response = to_response(COMPLETION, BODY, "gpt-4o-mini-2024")
    parsed = Response.model_validate(response)  # strict: every required field there
    assert parsed.id == "resp_abc" and parsed.status == "completed"
    assert parsed.output_text == "Looking it up."
    assert [item.type for item in parsed.output] == ["message", "function_call"]
    call = response["output"][1]
    assert (call["call_id"], call["arguments"]) == ("call_1", '{"city":"Oslo"}')
    assert parsed.usage is not None and parsed.usage.input_tokens_details.cached_tokens == 4
    assert (parsed.usage.input_tokens, parsed.usage.output_tokens, parsed.usage.total_tokens) == (
        10,
        5,
        15,
    )
    assert response["tools"] == [WEATHER] and response["metadata"] == {}  # not one caller's
    cut = {**COMPLETION, "choices": [{**COMPLETION["choices"][0], "finish_reason": "length"}]}
    incomplete = to_response(cut, BODY, "m")
    assert incomplete["status"] == "incomplete"
    assert incomplete["incomplete_details"] == {"reason": "max_output_tokens"}


def chunks() -> list[dict[str, Any]]:
    base = {"id": "chatcmpl-abc", "object": "chat.completion.chunk", "created": 1764400000}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    call = {"index": 0, "id": "call_1", "type": "function"}
    return [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Looking "}),
        chunk({"content": "it up."}),
        chunk({"tool_calls": [{**call, "function": {"name": "get_weather", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]}),
        chunk({}, "tool_calls"),
        {**base, "choices": [], "usage": COMPLETION["usage"]},
    ]


def test_a_chat_stream_becomes_responses_events_that_assemble_to_the_response() -> None:
    translator = ChunkTranslator(BODY, "gpt-4o-mini-2024")
    sent: list[dict[str, Any]] = []
    for chunk in chunks():
        sent += translator.feed(chunk)
    assert translator.finished
    sent += translator.finish()
    for event in sent:
        EVENTS.validate_python(event)  # strict, as the SDK's types say
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
    kinds = [e["type"] for e in sent]
    assert kinds.count("response.output_text.delta") == 2
    assert kinds.count("response.function_call_arguments.delta") == 2
    assert kinds[-1] == "response.completed"
    assembler = ResponseAssembler()
    for event in sent:
        assembler.add(json.loads(json.dumps(event)))
    final = assembler.response()
    assert final == to_response(COMPLETION, BODY, "gpt-4o-mini-2024")
    # its replay is the same sequence but for the deltas, whole
    assert final is not None
    replayed = [e["type"] for e in replay_events(final)]
    assert [k for k in kinds if not k.endswith(".delta")] == [
        k for k in replayed if not k.endswith(".delta")
    ]


_TEXT = st.text(max_size=4)
_PART = st.fixed_dictionaries(
    {
        "type": st.sampled_from(
            ["input_text", "output_text", "refusal", "input_image", "input_file"]
        )
    },
    optional={
        "text": _TEXT,
        "refusal": _TEXT,
        "image_url": _TEXT,
        "file_id": _TEXT,
        "detail": _TEXT,
    },
)
_CONTENT = _TEXT | st.lists(_PART, max_size=3)
_ITEM = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "developer"]), "content": _CONTENT},
        optional={"type": st.just("message")},
    ),
    st.fixed_dictionaries(
        {"type": st.just("function_call"), "call_id": st.just("c"), "name": st.just("f"),
         "arguments": _TEXT},
    ),
    st.fixed_dictionaries(
        {"type": st.just("function_call_output"), "call_id": st.just("c"), "output": _CONTENT}
    ),
    st.fixed_dictionaries({"type": st.sampled_from(["reasoning", "item_reference"]), "id": st.just("x")}),
)  # fmt: skip
_EXTRA = st.fixed_dictionaries(
    {},
    optional={
        "tools": st.lists(
            st.sampled_from([WEATHER, {"type": "web_search_preview"}, {"type": "function", "name": "g"}]),
            max_size=2,
        ),
        "tool_choice": st.sampled_from(
            ["auto", "none", "required", {"type": "function", "name": "f"}, {"type": "mcp"}]
        ),
        "text": st.sampled_from(
            [{}, {"format": {"type": "text"}}, {"format": {"type": "json_object"}},
             {"format": {"type": "json_schema", "name": "n", "schema": {}}}]
        ),
        "instructions": _TEXT,
        "previous_response_id": st.just("resp_1"),
        "reasoning": st.sampled_from([{"effort": "low"}, {}, None]),
    },
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(items=_TEXT | st.lists(_ITEM, min_size=1, max_size=4), extra=_EXTRA)
def test_every_valid_body_translates_or_is_a_400(items: Any, extra: dict[str, Any]) -> None:
    try:
        request = parse_responses_request(json.dumps({"model": "m", "input": items, **extra}))
    except PrismError:
        return  # the parser's to refuse, tested with it
    try:
        chat = to_chat_request(request.body, stream=True)
    except InvalidRequestError as refused:
        assert refused.status == 400 and refused.param
        return
    assert chat["model"] == "m" and chat["messages"]
    assert all(m["role"] in ("system", "user", "assistant", "tool") for m in chat["messages"])
