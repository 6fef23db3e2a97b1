"""Bedrock Converse answers → OpenAI chat completions, as pure functions (no I/O).

``to_chat_completion``: a ``ConverseResponse`` (``output.message.content``, ``stopReason``,
``usage``) → an OpenAI ``chat.completion``. Its stop reason and usage forms are shared
with the stream translator (``bedrock_stream``), so a streamed and a non-streamed answer
to one request are the same cache entry. Apart from the request's translation
(``bedrock_request``): the other direction.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from .anthropic_answer import chat_usage as anthropic_chat_usage

__all__ = ["FINISH_REASONS", "chat_usage", "completion_id", "finish_reason", "to_chat_completion"]

# Converse stopReason -> OpenAI finish_reason
FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "guardrail_intervened": "content_filter",
    "content_filtered": "content_filter",
}


def finish_reason(stop_reason: Any) -> str:
    """OpenAI's ``finish_reason`` for a Converse ``stopReason`` (``malformed_model_output``
    and other reasons with no OpenAI form: ``stop``)."""
    return FINISH_REASONS.get(stop_reason, "stop") if isinstance(stop_reason, str) else "stop"


def chat_usage(usage: Any) -> dict[str, Any]:
    """OpenAI usage for Converse's ``TokenUsage``. Like Anthropic's, ``inputTokens`` leaves
    out the prompt-cache reads and writes, so the same folding applies."""
    usage = usage if isinstance(usage, dict) else {}
    return anthropic_chat_usage(
        {
            "input_tokens": usage.get("inputTokens"),
            "output_tokens": usage.get("outputTokens"),
            "cache_read_input_tokens": usage.get("cacheReadInputTokens"),
            "cache_creation_input_tokens": usage.get("cacheWriteInputTokens"),
        }
    )


def completion_id() -> str:
    """Converse answers carry no id; OpenAI's have one (``chatcmpl-…``)."""
    return f"chatcmpl-{uuid.uuid4().hex}"


def tool_call_of(block: dict[str, Any]) -> dict[str, Any]:
    """A Converse ``toolUse`` block as an OpenAI tool call."""
    arguments = orjson.dumps(block.get("input") or {}).decode()
    return {
        "id": block.get("toolUseId"),
        "type": "function",
        "function": {"name": block.get("name"), "arguments": arguments},
    }


def to_chat_completion(
    response: dict[str, Any],
    model: str,
    *,
    answer_id: str | None = None,
    created: int | None = None,
) -> dict[str, Any]:
    """The OpenAI ``chat.completion`` for a ``ConverseResponse``, reported as ``model``."""
    output = response.get("output")
    message = output.get("message") if isinstance(output, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        if isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif isinstance(block.get("toolUse"), dict):
            calls.append(tool_call_of(block["toolUse"]))
        # reasoningContent, citationsContent and the like have no OpenAI form
    text = "".join(texts)
    reply: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        reply["tool_calls"] = calls
    return {
        "id": answer_id or completion_id(),
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": reply,
                "finish_reason": finish_reason(response.get("stopReason")),
            }
        ],
        "usage": chat_usage(response.get("usage")),
    }
