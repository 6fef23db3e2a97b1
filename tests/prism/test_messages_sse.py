"""Anthropic's stream: a stored message replayed as events assembles back to itself."""

from __future__ import annotations

import json
from typing import Any

import pytest

from prism import InvalidRequestError, UpstreamError
from prism.messages_sse import (
    MessageAssembler,
    anthropic_error_body,
    replay_message,
)
from prism.sse import SSEDecoder

MESSAGE: dict[str, Any] = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-x",
    "content": [
        {"type": "thinking", "thinking": "Let me see.", "signature": "sig"},
        {"type": "text", "text": "Checking the weather."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 12, "output_tokens": 30, "cache_read_input_tokens": 4},
}


def events(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(data) for data in SSEDecoder().feed(body)]


def test_replay_is_anthropics_event_sequence_and_assembles_back() -> None:
    body = replay_message(MESSAGE)
    assert body.startswith(b"event: message_start\ndata: ")
    kinds = [event["type"] for event in events(body)]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 3
    assembler = MessageAssembler()
    for event in events(body):
        assembler.add(event)
    assert assembler.done and assembler.message() == MESSAGE


def test_an_unfinished_or_failed_stream_is_never_a_message() -> None:
    assembler = MessageAssembler("p")
    for event in events(replay_message(MESSAGE))[:-1]:
        assembler.add(event)
    assert not assembler.done and assembler.message() is None
    with pytest.raises(UpstreamError, match="overloaded_error"):
        assembler.add({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
    with pytest.raises(UpstreamError):
        MessageAssembler().add({"type": "content_block_delta", "index": 0, "delta": {}})


def test_errors_in_anthropics_format_by_status() -> None:
    body = anthropic_error_body(InvalidRequestError("max_tokens: required"))
    assert body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: required"},
    }
    assert anthropic_error_body(UpstreamError("x"))["error"]["type"] == "api_error"
