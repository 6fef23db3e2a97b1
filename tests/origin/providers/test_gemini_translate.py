"""The Gemini adapter's translation, in-process: OpenAI chat → ``generateContent`` and
back, answers and streams alike, safety blocks and finish reasons."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from origin.providers.gemini_answer import to_chat_completion
from origin.providers.gemini_request import SKIP_SIGNATURE, to_gemini_request
from origin.providers.gemini_stream import StreamTranslator
from prism import InvalidRequestError, PrismError, StreamAssembler, UpstreamError

MODEL = "gemini-2.5-flash"
CREATED = 1_700_000_000
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "get_time"}}


# ---------------------------------------------------------------- requests


def test_roles_system_instruction_and_sampling_map() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Answer in French."}]},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Bonjour."},
            {"role": "user", "content": "Again"},
        ],
        "max_tokens": 50,
        "max_completion_tokens": 70,
        "temperature": 0.2,
        "top_p": 0.9,
        "stop": "END",
        "seed": 7,
        "presence_penalty": 0.1,
        "user": "u-1",
        "logit_bias": {"1": 2},
    }
    assert to_gemini_request(body, MODEL) == {
        "systemInstruction": {"parts": [{"text": "Be brief.\n\nAnswer in French."}]},
        "contents": [
            {"role": "user", "parts": [{"text": "Hi"}]},
            {"role": "model", "parts": [{"text": "Bonjour."}]},
            {"role": "user", "parts": [{"text": "Again"}]},
        ],
        "generationConfig": {
            "maxOutputTokens": 70,  # max_completion_tokens wins, as in OpenAI
            "temperature": 0.2,
            "topP": 0.9,
            "seed": 7,
            "presencePenalty": 0.1,
            "stopSequences": ["END"],
        },
    }


def test_image_audio_and_file_parts_become_inline_or_file_data() -> None:
    content = [
        {"type": "text", "text": "Compare"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg?x=1"}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0="}},
    ]
    request = to_gemini_request({"messages": [{"role": "user", "content": content}]}, MODEL)
    assert request["contents"][0]["parts"] == [
        {"text": "Compare"},
        {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
        {"fileData": {"fileUri": "https://example.com/cat.jpg?x=1", "mimeType": "image/jpeg"}},
        {"inlineData": {"mimeType": "audio/wav", "data": "UklGRg=="}},
        {"inlineData": {"mimeType": "application/pdf", "data": "JVBERi0="}},
    ]


def _tool_conversation(model: str) -> dict[str, Any]:
    body = {
        "messages": [
            {"role": "user", "content": "Weather in Pune, and the time?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_0123456789abcdef01234567",  # made up by the adapter
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Pune"}'},
                    },
                    {
                        "id": "gemini-own-id",
                        "type": "function",
                        "function": {"name": "get_time", "arguments": ""},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_0123456789abcdef01234567", "content": "31C"},
            {
                "role": "tool",
                "tool_call_id": "gemini-own-id",
                "content": [{"type": "text", "text": "14:05"}],
            },
            {"role": "user", "content": "Thanks."},
        ],
        "tools": [WEATHER_TOOL, TIME_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
    }
    return to_gemini_request(body, model)


def test_tools_calls_and_results_become_declarations_calls_and_responses() -> None:
    request = _tool_conversation("gemini-3-flash")
    assert request["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "get_weather",
                    "description": "Weather for a city",
                    "parametersJsonSchema": WEATHER_TOOL["function"]["parameters"],
                },
                {"name": "get_time"},
            ]
        }
    ]
    assert request["toolConfig"] == {
        "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}
    }
    assert request["contents"][1:] == [
        {
            "role": "model",
            "parts": [
                {
                    "functionCall": {"name": "get_weather", "args": {"city": "Pune"}},
                    "thoughtSignature": SKIP_SIGNATURE,  # only the turn's first call
                },
                {"functionCall": {"name": "get_time", "args": {}, "id": "gemini-own-id"}},
            ],
        },
        {
            # Both results in one turn, as many as the calls; the next user text apart.
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "get_weather", "response": {"output": "31C"}}},
                {
                    "functionResponse": {
                        "name": "get_time",
                        "response": {"output": "14:05"},
                        "id": "gemini-own-id",
                    }
                },
            ],
        },
        {"role": "user", "parts": [{"text": "Thanks."}]},
    ]


def test_models_before_thought_signatures_get_none() -> None:
    parts = _tool_conversation("gemini-2.0-flash")["contents"][1]["parts"]
    assert all("thoughtSignature" not in part for part in parts)


@pytest.mark.parametrize(
    ("choice", "expected"),
    [("auto", {"mode": "AUTO"}), ("required", {"mode": "ANY"}), ("none", {"mode": "NONE"})],
)
def test_tool_choice_maps_to_the_calling_mode(choice: str, expected: dict[str, Any]) -> None:
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": [TIME_TOOL],
        "tool_choice": choice,
    }
    assert to_gemini_request(body, MODEL)["toolConfig"] == {"functionCallingConfig": expected}


def test_response_formats_map_to_json_mime_and_schema() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    base = {"messages": [{"role": "user", "content": "Hi"}]}
    as_schema = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    config = to_gemini_request({**base, "response_format": as_schema}, MODEL)["generationConfig"]
    assert config == {"responseMimeType": "application/json", "responseJsonSchema": schema}
    json_object = to_gemini_request({**base, "response_format": {"type": "json_object"}}, MODEL)
    assert json_object["generationConfig"] == {"responseMimeType": "application/json"}
    assert "generationConfig" not in to_gemini_request(
        {**base, "response_format": {"type": "text"}}, MODEL
    )


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"n": 2}, "n"),
        (
            {"messages": [{"role": "user", "content": [{"type": "video", "video": {}}]}]},
            "messages[0].content[0]",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "data:image/png,raw"}}
                        ],
                    }
                ]
            },
            "messages[0].content[0].image_url",
        ),
        ({"messages": [{"role": "function", "name": "f", "content": "x"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "tool", "tool_call_id": "nope", "content": "x"}]},
            "messages[0].tool_call_id",
        ),
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0]"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
        ),
    ],
)
def test_requests_gemini_cannot_express_are_rejected(change: dict[str, Any], param: str) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], **change}
    with pytest.raises(InvalidRequestError) as caught:
        to_gemini_request(body, MODEL)
    assert (caught.value.status, caught.value.param) == (400, param)


# ---------------------------------------------------------------- answers

USAGE = {
    "promptTokenCount": 20,
    "cachedContentTokenCount": 8,
    "toolUsePromptTokenCount": 2,
    "candidatesTokenCount": 10,
    "thoughtsTokenCount": 5,
    "totalTokenCount": 37,
}


def _answer(parts: list[dict[str, Any]], reason: str = "STOP", **extra: Any) -> dict[str, Any]:
    candidate = {"content": {"role": "model", "parts": parts}, "finishReason": reason, "index": 0}
    return {"candidates": [candidate], "usageMetadata": USAGE, "responseId": "resp-1", **extra}


def test_text_answer_becomes_a_chat_completion_with_its_usage() -> None:
    answer = _answer(
        [{"text": "thinking...", "thought": True}, {"text": "Hello "}, {"text": "there."}]
    )
    assert to_chat_completion(answer, "gem", created=CREATED) == {
        "id": "resp-1",
        "object": "chat.completion",
        "created": CREATED,
        "model": "gem",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello there."},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 22,  # tool-use prompt tokens are prompt tokens
            "completion_tokens": 15,  # thinking is billed as output
            "total_tokens": 37,
            "prompt_tokens_details": {"cached_tokens": 8},
            "completion_tokens_details": {"reasoning_tokens": 5},
        },
    }


def test_function_calls_become_tool_calls_with_stable_ids() -> None:
    parts: list[dict[str, Any]] = [
        {
            "functionCall": {"name": "get_weather", "args": {"city": "Pune"}},
            "thoughtSignature": "c2ln",
        },
        {"functionCall": {"name": "get_time", "args": {}, "id": "own-id"}},
    ]
    first = to_chat_completion(_answer(parts), MODEL)["choices"][0]
    again = to_chat_completion(_answer(parts), MODEL)["choices"][0]
    assert first == again
    assert first["finish_reason"] == "tool_calls"
    assert first["message"]["content"] is None
    calls = first["message"]["tool_calls"]
    assert calls[0]["id"].startswith("call_") and len(calls[0]["id"]) == 29
    assert calls[0]["function"] == {"name": "get_weather", "arguments": '{"city":"Pune"}'}
    assert calls[1] == {
        "id": "own-id",
        "type": "function",
        "function": {"name": "get_time", "arguments": "{}"},
    }


@pytest.mark.parametrize(
    ("reason", "finish"),
    [("STOP", "stop"), ("MAX_TOKENS", "length"), ("SAFETY", "content_filter"),
     ("RECITATION", "content_filter"), ("PROHIBITED_CONTENT", "content_filter"), ("OTHER", "stop")],
)  # fmt: skip
def test_finish_reasons_map(reason: str, finish: str) -> None:
    completion = to_chat_completion(_answer([{"text": "partial"}], reason), MODEL)
    assert completion["choices"][0]["finish_reason"] == finish


@pytest.mark.parametrize(
    ("answer", "error_type", "code"),
    [
        (
            {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": USAGE},
            InvalidRequestError,
            "content_policy_violation",
        ),
        (_answer([], "SAFETY"), InvalidRequestError, "content_policy_violation"),
        (
            _answer([{"text": ""}], "PROHIBITED_CONTENT"),
            InvalidRequestError,
            "content_policy_violation",
        ),
        (_answer([], "MALFORMED_FUNCTION_CALL"), UpstreamError, "upstream_malformed"),
        (_answer([], "STOP"), UpstreamError, "upstream_malformed"),
    ],
    ids=["prompt-blocked", "answer-blocked", "prohibited", "malformed-call", "empty"],
)
def test_answers_with_nothing_to_serve_raise(
    answer: dict[str, Any], error_type: type[PrismError], code: str
) -> None:
    with pytest.raises(error_type) as caught:
        to_chat_completion(answer, MODEL, provider="gem")
    assert caught.value.code == code and "gem" in caught.value.message


# ---------------------------------------------------------------- streams


def _assembled(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    translator = StreamTranslator(MODEL, created=CREATED)
    chunks = [chunk for event in events for chunk in translator.feed(event)]
    assert translator.done
    assembler = StreamAssembler()
    for chunk in orjson.loads(orjson.dumps(chunks)):
        assembler.add(chunk)
    assembler.finish()
    assert assembler.complete
    return chunks, assembler.completion()


def test_text_stream_assembles_to_the_whole_answer() -> None:
    partial = {"promptTokenCount": 20}
    events = [
        {**_answer([{"text": "Hello "}], ""), "usageMetadata": partial},
        {**_answer([{"text": "there."}], ""), "usageMetadata": partial},
        _answer([{"text": "", "thoughtSignature": "c2ln"}]),
    ]
    for event in events[:2]:
        del event["candidates"][0]["finishReason"]
    chunks, streamed = _assembled(events)
    whole = to_chat_completion(_answer([{"text": "Hello there."}]), MODEL, created=CREATED)
    assert streamed["choices"] == whole["choices"] and streamed["usage"] == whole["usage"]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]


def test_call_stream_assembles_to_the_whole_answer() -> None:
    parts = [{"functionCall": {"name": "get_weather", "args": {"city": "Pune"}}}]
    _, streamed = _assembled([_answer(parts)])
    whole = to_chat_completion(_answer(parts), MODEL, created=CREATED)
    assert streamed["choices"] == whole["choices"]


def test_a_blocked_stream_raises_before_any_chunk() -> None:
    for event in ({"promptFeedback": {"blockReason": "OTHER"}}, _answer([], "SAFETY")):
        with pytest.raises(InvalidRequestError) as caught:
            StreamTranslator(MODEL).feed(event)
        assert caught.value.code == "content_policy_violation"


def test_a_stream_filtered_after_text_finishes_as_content_filter() -> None:
    first = _answer([{"text": "Once upon"}])
    del first["candidates"][0]["finishReason"]
    _, streamed = _assembled([first, _answer([], "SAFETY")])
    assert streamed["choices"][0]["finish_reason"] == "content_filter"
    assert streamed["choices"][0]["message"]["content"] == "Once upon"
