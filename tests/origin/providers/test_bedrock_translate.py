"""The Bedrock adapter's translations, in-process: OpenAI chat -> Converse, a
ConverseResponse -> a chat completion, ConverseStream's event stream -> chunks, and
Bedrock's errors -> the gateway's."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from deploy.local.provider_bedrock import encode_message
from origin.providers.base import ProviderSpec
from origin.providers.bedrock_answer import to_chat_completion
from origin.providers.bedrock_errors import raise_for_bedrock
from origin.providers.bedrock_request import to_converse_request
from origin.providers.bedrock_stream import EventDecoder, StreamTranslator
from prism import (
    InvalidRequestError,
    NotFoundError,
    PrismError,
    RateLimitError,
    StreamAssembler,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)

SPEC = ProviderSpec(
    name="bedrock", kind="bedrock", base_url="https://x", options={"region": "us-east-1"}
)
MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
PIXEL = "iVBORw0KGgo="


# ---------------------------------------------------------------- requests


def test_roles_system_tools_and_results_become_converse_turns() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Answer in French."}]},
            {"role": "user", "content": [
                {"type": "text", "text": "Weather here?"},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}},
            ]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "t1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Pune"}'}},
                {"id": "t2", "type": "function", "function": {"name": "get_time", "arguments": ""}},
            ]},
            {"role": "tool", "tool_call_id": "t1", "content": "31 C"},
            {"role": "tool", "tool_call_id": "t2", "content": ""},
            {"role": "user", "content": "Thanks"},
        ],
        "tools": [WEATHER_TOOL],
    }  # fmt: skip
    request = to_converse_request(body)
    assert request["system"] == [{"text": "Be brief."}, {"text": "Answer in French."}]
    assert request["messages"] == [
        {"role": "user", "content": [
            {"text": "Weather here?"},
            {"image": {"format": "png", "source": {"bytes": PIXEL}}},
        ]},
        {"role": "assistant", "content": [
            {"toolUse": {"toolUseId": "t1", "name": "get_weather", "input": {"city": "Pune"}}},
            {"toolUse": {"toolUseId": "t2", "name": "get_time", "input": {}}},
        ]},
        # parallel results and the next user text: one user turn, as Converse requires
        {"role": "user", "content": [
            {"toolResult": {"toolUseId": "t1", "content": [{"text": "31 C"}]}},
            {"toolResult": {"toolUseId": "t2", "content": [{"json": {}}]}},
            {"text": "Thanks"},
        ]},
    ]  # fmt: skip
    assert request["toolConfig"] == {
        "tools": [
            {
                "toolSpec": {
                    "name": "get_weather",
                    "description": "Weather for a city",
                    "inputSchema": {"json": WEATHER_TOOL["function"]["parameters"]},
                }
            }
        ]
    }
    assert "inferenceConfig" not in request and "modelId" not in request


def test_sampling_parameters_go_to_inference_config_and_the_rest_is_dropped() -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_completion_tokens": 64,
        "max_tokens": 999,
        "temperature": 0.2,
        "top_p": 0.9,
        "stop": "END",
        "seed": 3,
        "presence_penalty": 1,
        "user": "u-1",
        "response_format": {"type": "text"},
    }
    request = to_converse_request(body)
    assert request == {
        "messages": [{"role": "user", "content": [{"text": "hi"}]}],
        "inferenceConfig": {"maxTokens": 64, "temperature": 0.2, "topP": 0.9,
                            "stopSequences": ["END"]},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (None, None),
        ("auto", {"auto": {}}),
        ("required", {"any": {}}),
        (
            {"type": "function", "function": {"name": "get_weather"}},
            {"tool": {"name": "get_weather"}},
        ),
    ],
)
def test_tool_choice_maps_to_converse(choice: Any, expected: Any) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER_TOOL]}
    if choice is not None:
        body["tool_choice"] = choice
    config = to_converse_request(body)["toolConfig"]
    assert config.get("toolChoice") == expected


def test_tool_choice_none_sends_no_tools_unless_the_conversation_used_them() -> None:
    plain = {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER_TOOL],
             "tool_choice": "none"}  # fmt: skip
    assert "toolConfig" not in to_converse_request(plain)
    used = {
        **plain,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "tool_calls": [
                {"id": "t1", "function": {"name": "get_weather", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "t1", "content": "sunny"},
        ],
    }  # fmt: skip
    config = to_converse_request(used)["toolConfig"]
    assert "toolChoice" not in config and len(config["tools"]) == 1


def test_cache_control_parts_become_cache_points() -> None:
    body = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "long context", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "question"},
    ]}]}  # fmt: skip
    assert to_converse_request(body)["messages"][0]["content"] == [
        {"text": "long context"},
        {"cachePoint": {"type": "default"}},
        {"text": "question"},
    ]


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"n": 2}, "n"),
        ({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]},
         "messages[0].content[0].image_url"),
        ({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/tiff;base64,AAAA"}}]}]},
         "messages[0].content[0].image_url"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
         "messages[0].content[0]"),
        ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "assistant", "tool_calls": [
            {"id": "t", "function": {"name": "f", "arguments": "[1]"}}]}]},
         "messages[0].tool_calls[0]"),
    ],
    ids=["n", "image-url", "image-format", "audio", "role", "arguments"],
)  # fmt: skip
def test_requests_converse_cannot_express_are_rejected(change: dict[str, Any], param: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], **change}
    with pytest.raises(InvalidRequestError) as caught:
        to_converse_request(body)
    assert caught.value.param == param and caught.value.status == 400


# ---------------------------------------------------------------- answers


def _response(content: list[dict[str, Any]], stop: str, **usage: int) -> dict[str, Any]:
    tokens = {"inputTokens": 11, "outputTokens": 5, "totalTokens": 16, **usage}
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop,
        "usage": tokens,
        "metrics": {"latencyMs": 120},
    }


def test_text_answer_becomes_a_chat_completion() -> None:
    response = _response(
        [{"text": "Hello "}, {"reasoningContent": {}}, {"text": "there"}], "end_turn"
    )
    completion = to_chat_completion(response, MODEL, answer_id="chatcmpl-1", created=7)
    assert completion == {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 7,
        "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 5, "total_tokens": 16},
    }  # fmt: skip


def test_tool_use_becomes_tool_calls_and_cache_tokens_count_as_prompt() -> None:
    tool = {"toolUse": {"toolUseId": "tooluse_1", "name": "get_weather", "input": {"city": "Pune"}}}
    response = _response([tool], "tool_use", cacheReadInputTokens=100, cacheWriteInputTokens=20)
    completion = to_chat_completion(response, MODEL)
    choice = completion["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "tooluse_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Pune"}'}}],
    }  # fmt: skip
    assert completion["usage"] == {
        "prompt_tokens": 131,
        "completion_tokens": 5,
        "total_tokens": 136,
        "prompt_tokens_details": {"cached_tokens": 100, "cache_creation_tokens": 20},
    }
    assert completion["id"].startswith("chatcmpl-")


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("tool_use", "tool_calls"),
        ("guardrail_intervened", "content_filter"),
        ("content_filtered", "content_filter"),
        ("malformed_model_output", "stop"),
    ],
)
def test_stop_reasons_map_to_finish_reasons(stop: str, finish: str) -> None:
    completion = to_chat_completion(_response([{"text": "x"}], stop), MODEL)
    assert completion["choices"][0]["finish_reason"] == finish


# ---------------------------------------------------------------- the event stream


def _message(kind: str, data: dict[str, Any]) -> bytes:
    headers = {":event-type": kind, ":content-type": "application/json", ":message-type": "event"}
    return encode_message(headers, orjson.dumps({**data, "p": "abc"}))


def _exception(kind: str, message: str) -> bytes:
    headers = {":exception-type": kind, ":content-type": "application/json",
               ":message-type": "exception"}  # fmt: skip
    return encode_message(headers, orjson.dumps({"message": message}))


TOOL_EVENTS = [
    _message("messageStart", {"role": "assistant"}),
    _message("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Let me check. "}}),
    _message("contentBlockStop", {"contentBlockIndex": 0}),
    _message("contentBlockStart", {"contentBlockIndex": 1, "start": {
        "toolUse": {"toolUseId": "tooluse_1", "name": "get_weather"}}}),
    _message("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": '{"ci'}}}),
    _message("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": 'ty": "Pune"}'}}}),
    _message("contentBlockStop", {"contentBlockIndex": 1}),
    _message("contentBlockStart", {"contentBlockIndex": 2, "start": {
        "toolUse": {"toolUseId": "tooluse_2", "name": "get_time"}}}),
    _message("contentBlockStop", {"contentBlockIndex": 2}),
    _message("messageStop", {"stopReason": "tool_use"}),
    _message("metadata", {"usage": {"inputTokens": 11, "outputTokens": 5, "totalTokens": 16},
                          "metrics": {"latencyMs": 9}}),
]  # fmt: skip
TOOL_ANSWER = _response(
    [
        {"text": "Let me check. "},
        {"toolUse": {"toolUseId": "tooluse_1", "name": "get_weather", "input": {"city": "Pune"}}},
        {"toolUse": {"toolUseId": "tooluse_2", "name": "get_time", "input": {}}},
    ],
    "tool_use",
)


def _translate(raw: bytes, sizes: int) -> tuple[list[dict[str, Any]], StreamTranslator]:
    """The chunks of ``raw`` fed ``sizes`` bytes at a time (messages split anywhere)."""
    decoder, translator = EventDecoder(SPEC), StreamTranslator(SPEC, MODEL, created=7)
    chunks = []
    for start in range(0, len(raw), sizes):
        for kind, event in decoder.feed(raw[start : start + sizes]):
            chunks += translator.feed(kind, event)
    return chunks, translator


@pytest.mark.parametrize("sizes", [1, 7, 100_000])
def test_stream_events_assemble_to_the_non_stream_translation(sizes: int) -> None:
    chunks, translator = _translate(b"".join(TOOL_EVENTS), sizes)
    assert translator.done
    assembler = StreamAssembler()
    for chunk in chunks:
        assembler.add(chunk)
    assembler.finish()
    assert assembler.complete
    streamed = assembler.completion()
    answer = to_chat_completion(TOOL_ANSWER, MODEL)
    # The stream says "{}" for the tool that streamed no input, as the answer does; the
    # arguments' JSON spacing is the model's in a stream, ours in an answer.
    calls = streamed["choices"][0]["message"]["tool_calls"]
    assert [orjson.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Pune"}, {}]
    for call in answer["choices"][0]["message"]["tool_calls"]:
        call["function"]["arguments"] = orjson.loads(call["function"]["arguments"])
    for call in calls:
        call["function"]["arguments"] = orjson.loads(call["function"]["arguments"])
    assert streamed["choices"] == answer["choices"]
    assert streamed["usage"] == answer["usage"]


def test_usage_comes_only_with_metadata_after_message_stop() -> None:
    chunks, translator = _translate(b"".join(TOOL_EVENTS[:-1]), 100_000)
    assert not translator.done
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all("usage" not in chunk for chunk in chunks)


@pytest.mark.parametrize(
    ("kind", "error_type", "status"),
    [
        ("throttlingException", RateLimitError, 429),
        ("serviceUnavailableException", UpstreamUnavailableError, 503),
        ("internalServerException", UpstreamError, 502),
        ("modelStreamErrorException", UpstreamError, 502),
        ("validationException", InvalidRequestError, 400),
    ],
)
def test_exception_events_are_errors(kind: str, error_type: type[PrismError], status: int) -> None:
    raw = TOOL_EVENTS[0] + _exception(kind, "it went wrong")
    with pytest.raises(error_type) as caught:
        _translate(raw, 100_000)
    assert caught.value.status == status and "it went wrong" in caught.value.message


def test_a_bad_crc_is_a_malformed_stream() -> None:
    raw = bytearray(TOOL_EVENTS[1])
    raw[-5] ^= 0xFF  # a payload byte: the message CRC no longer matches
    with pytest.raises(UpstreamError) as caught:
        _translate(TOOL_EVENTS[0] + bytes(raw), 100_000)
    assert caught.value.code == "upstream_malformed"


def test_events_before_message_start_are_malformed() -> None:
    with pytest.raises(UpstreamError) as caught:
        _translate(TOOL_EVENTS[1], 100_000)
    assert caught.value.code == "upstream_malformed"


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("status", "kind", "message", "error_type", "code"),
    [
        (429, "ThrottlingException", "Too many requests", RateLimitError, "upstream_rate_limited"),
        (400, "ValidationException", "maxTokens must be positive", InvalidRequestError,
         "invalid_request"),
        (400, "ValidationException", "Input is too long for requested model.",
         InvalidRequestError, "context_length_exceeded"),
        (429, "ModelNotReadyException", "Model is not ready", UpstreamUnavailableError,
         "upstream_unavailable"),
        (503, "ServiceUnavailableException", "Try later", UpstreamUnavailableError,
         "upstream_unavailable"),
        (500, "InternalServerException", "Oops", UpstreamError, "bad_gateway"),
        (408, "ModelTimeoutException", "Slow", UpstreamTimeoutError, "upstream_timeout"),
        (404, "ResourceNotFoundException", "No such model", NotFoundError, "not_found"),
        (403, "AccessDeniedException", "User arn:aws:iam::123:role/x is not authorized",
         UpstreamError, "upstream_auth_failed"),
        (403, "UnrecognizedClientException", "bad token", UpstreamError, "upstream_auth_failed"),
    ],
    ids=["throttle", "validation", "context", "not-ready", "unavailable", "internal", "timeout",
         "not-found", "access-denied", "unrecognized"],
)  # fmt: skip
def test_bedrock_errors_keep_their_meaning(
    status: int, kind: str, message: str, error_type: type[PrismError], code: str
) -> None:
    headers = {"x-amzn-errortype": f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/"}
    with pytest.raises(error_type) as caught:
        raise_for_bedrock(SPEC, status, orjson.dumps({"message": message}), headers)
    error = caught.value
    assert type(error) is error_type and error.code == code
    if code == "upstream_auth_failed":
        assert error.status == 502 and "arn:aws" not in error.message and kind in error.message
    else:
        assert message in error.message


def test_an_error_type_in_the_body_is_read_when_the_header_is_missing() -> None:
    body = orjson.dumps(
        {"__type": "com.amazon.bedrock#ThrottlingException", "message": "slow down"}
    )
    with pytest.raises(RateLimitError):
        raise_for_bedrock(SPEC, 400, body, {})
