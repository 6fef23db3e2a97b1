"""Messages ⇄ chat completions, in-process: requests, answers and streams."""

from __future__ import annotations

from typing import Any

import pytest

from origin.providers.messages_translate import (
    ChunkTranslator,
    stop_reason,
    to_chat_request,
    to_message,
)
from prism import InvalidRequestError
from prism.messages_sse import MessageAssembler

TOOL = {"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "string"}}}}


def test_a_conversation_with_tools_images_and_results_becomes_chat() -> None:
    body = {
        "model": "m",
        "max_tokens": 10,
        "system": [{"type": "text", "text": "Be brief."}],
        "stop_sequences": ["END"],
        "tools": [TOOL],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "metadata": {"user_id": "u1"},
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look: "},
                    {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "s"},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": "b"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "done"},
                    {"type": "text", "text": "thanks"},
                ],
            },
        ],
    }
    chat = to_chat_request(body, stream=True)
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look: "},
                {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"a":"b"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "done"},
        {"role": "user", "content": "thanks"},
    ]
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert chat["stop"] == ["END"] and chat["user"] == "u1" and chat["max_tokens"] == 10
    assert chat["tools"][0]["function"]["parameters"] == TOOL["input_schema"]
    assert chat["stream_options"] == {"include_usage": True}


def test_what_chat_cannot_carry_is_a_400() -> None:
    body = {
        "model": "m",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}],
    }
    with pytest.raises(InvalidRequestError, match="document"):
        to_chat_request(body)


def test_answers_and_streams_become_the_same_message() -> None:
    assert [stop_reason(r) for r in ("stop", "length", "tool_calls", None)] == [
        "end_turn",
        "max_tokens",
        "tool_use",
        "end_turn",
    ]
    completion = {
        "id": "c1",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Hi",
                    "tool_calls": [
                        {
                            "id": "t",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }
    message = to_message(completion, "m")
    assert message["content"] == [
        {"type": "text", "text": "Hi"},
        {"type": "tool_use", "id": "t", "name": "f", "input": {}},
    ]
    assert message["stop_reason"] == "tool_use"
    assert message["usage"] == {"input_tokens": 3, "output_tokens": 4}

    translator = ChunkTranslator("m")
    base = {"id": "c1", "model": "m"}
    chunks: list[dict[str, Any]] = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {**base, "choices": [{"index": 0, "delta": {"content": "H"}}]},
        {**base, "choices": [{"index": 0, "delta": {"content": "i"}}]},
        {
            **base,
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "t", "function": {"name": "f", "arguments": ""}}
                        ]
                    },
                }
            ],
        },
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {**base, "choices": [], "usage": completion["usage"]},
    ]
    assembler = MessageAssembler()
    for chunk in chunks:
        for event in translator.feed(chunk):
            assembler.add(event)
    assert translator.finished and not assembler.done
    for event in translator.finish():
        assembler.add(event)
    assert assembler.message() == message
