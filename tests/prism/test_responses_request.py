"""The Responses API's parser: what it accepts, the param it names for what it refuses,
which requests are stateful (never cached), and that nothing but a ``PrismError`` ever
escapes it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism import InvalidRequestError, PrismError, fingerprint
from prism.parsers import parse_for_path
from prism.responses_request import (
    INPUT_ITEM_TYPES,
    ResponsesRequest,
    classify_responses,
    parse_responses_request,
)
from prism.routes import RESPONSES_PATH


def parse(**body: Any) -> ResponsesRequest:
    return parse_responses_request(json.dumps({"model": "gpt-4o", **body}))


def refused(**body: Any) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as caught:
        parse(**body)
    assert caught.value.status == 400 and caught.value.param is not None
    assert f"'{caught.value.param}'" in caught.value.message
    return caught.value


def test_a_whole_conversation_is_accepted_as_sent() -> None:
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "What is in this image?"},
            {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "low"},
        ]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "a prism"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "A prism."}]},
    ]  # fmt: skip
    request = parse(
        input=items,
        instructions="Answer in English.",
        tools=[{"type": "function", "name": "look", "parameters": {"type": "object"}}],
        tool_choice={"type": "function", "name": "look"},
        text={"format": {"type": "json_schema", "name": "x", "schema": {}, "strict": True}},
        max_output_tokens=100,
        temperature=0.5,
        top_p=1,
        metadata={"a": "b"},
        user="u",
        stream=True,
        store=False,
        reasoning={"effort": "low"},  # unknown to the parser: kept and forwarded
    )
    assert request.model == "gpt-4o" and request.stream and not request.stateful
    assert request.body["input"] == items and request.body["reasoning"] == {"effort": "low"}
    assert parse_for_path(RESPONSES_PATH, json.dumps(request.body)) == request


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "input"),
        ({"input": None}, "input"),
        ({"input": {"role": "user"}}, "input"),
        ({"input": [1]}, "input[0]"),
        ({"input": ["a", {"type": "file_search_call"}]}, "input[0]"),
        ({"input": [{"content": "no role, no type"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": "a"}, {"type": "x"}]}, "input[1].type"),
        ({"input": [{"role": "tool", "content": "a"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": 3}]}, "input[0].content"),
        ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0].text"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0].image_url"),
        ({"input": [{"role": "user", "content": ["a"]}]}, "input[0].content[0]"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "", "arguments": ""}]}, "input[0].name"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"input": [{"type": "item_reference"}]}, "input[0].id"),
        ({"input": "a", "tools": [{"type": "function", "name": "f", "strict": "yes"}]}, "tools[0].strict"),
        ({"input": "a", "tools": [{"type": "function", "name": "f", "description": 1}]}, "tools[0].description"),
        ({"input": "a", "tool_choice": {"type": "function"}}, "tool_choice.name"),
        ({"input": "a", "tool_choice": 1}, "tool_choice"),
        ({"input": "a", "text": "json"}, "text"),
        ({"input": "a", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
        ({"input": "a", "text": {"format": {"type": "json_schema", "name": "n", "schema": {}, "strict": 1}}}, "text.format.strict"),
        ({"input": "a", "top_p": 2}, "top_p"),
        ({"input": "a", "max_output_tokens": 1.5}, "max_output_tokens"),
        ({"input": "a", "stream": "yes"}, "stream"),
        ({"input": "a", "previous_response_id": 5}, "previous_response_id"),
        ({"input": "a", "metadata": []}, "metadata"),
        ({"input": "a", "user": 5}, "user"),
        ({"input": "a", "parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ],
)  # fmt: skip
def test_bad_input_names_the_offending_param(body: dict[str, Any], param: str) -> None:
    assert refused(**body).param == param


def test_hosted_tools_pass_the_parser_for_the_provider_to_judge() -> None:
    assert parse(input="a", tools=[{"type": "web_search_preview"}]).body["tools"]


@pytest.mark.parametrize(
    ("extra", "stateful"),
    [
        ({}, False),
        ({"store": False}, False),
        ({"store": None}, False),
        ({"store": True}, True),
        ({"previous_response_id": "resp_1"}, True),
        ({"conversation": "conv_1"}, True),
        ({"background": True}, True),
        ({"background": False}, False),
    ],
)
def test_stateful_requests_are_never_read_or_written(extra: dict[str, Any], stateful: bool) -> None:
    request = parse(input="a", **extra)
    assert request.stateful is stateful
    decision = classify_responses(request)
    assert decision.bypass is stateful and decision.read is not stateful
    # the cache-control directives still apply to a stateless one
    assert classify_responses(request, "no-store").write is False


def test_store_and_metadata_are_not_in_the_fingerprint_but_the_input_is() -> None:
    base = fingerprint("p", RESPONSES_PATH, parse(input="a"))
    assert fingerprint("p", RESPONSES_PATH, parse(input="a", store=False, metadata={})) == base
    assert fingerprint("p", RESPONSES_PATH, parse(input="b")) != base
    assert fingerprint("p", "/v1/chat/completions", parse(input="a")) != base


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
_ITEM = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(sorted(INPUT_ITEM_TYPES)) | st.text(max_size=6),
        "role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]),
        "content": _JSON,
        "call_id": _JSON,
        "name": _JSON,
        "arguments": _JSON,
        "output": _JSON,
        "id": _JSON,
    },
)


@settings(max_examples=300, deadline=None)
@given(
    items=st.lists(_ITEM, max_size=4) | _JSON,
    extra=st.dictionaries(
        st.sampled_from(["tools", "tool_choice", "text", "instructions", "max_output_tokens"]),
        _JSON,
        max_size=2,
    ),
)
def test_any_body_parses_or_is_a_prism_error(items: Any, extra: dict[str, Any]) -> None:
    try:
        request = parse(input=items, **extra)
    except PrismError as error:
        assert error.status == 400 and error.param
        return
    assert request.body["input"] == items
