"""Anthropic Messages answers → OpenAI chat completions, as pure functions (no I/O).

``to_chat_completion``: an Anthropic ``message`` → an OpenAI ``chat.completion``. Its
stop reason and usage forms are shared with the stream translator (``anthropic_stream``),
so a streamed and a non-streamed answer to one request are the same cache entry (the
shape ``prism.sse.StreamAssembler`` rebuilds). Apart from the request's translation
(``anthropic_request``): the other direction, and read backwards by
``messages_translate``.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from .token_counts import token_count

__all__ = [
    "FINISH_REASONS",
    "STRUCTURED_TOOL",
    "chat_usage",
    "finish_reason",
    "to_chat_completion",
    "tool_call_of",
]

# The tool a structured-output request (``response_format``) is answered through: Anthropic
# is made to call it (``anthropic_request``), and its input is the answer's JSON text.
STRUCTURED_TOOL = "prism_structured_output"

# Anthropic stop_reason -> OpenAI finish_reason (``messages_translate`` reads it in reverse)
FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}


def finish_reason(stop_reason: Any) -> str:
    """OpenAI's ``finish_reason`` for an Anthropic ``stop_reason``."""
    return FINISH_REASONS.get(stop_reason, "stop") if isinstance(stop_reason, str) else "stop"


def chat_usage(usage: Any) -> dict[str, Any]:
    """OpenAI usage; Anthropic counts cached prompt tokens apart from ``input_tokens``.
    Cache writes (billed above the input price) stay visible as ``cache_creation_tokens``
    in ``prompt_tokens_details`` so their cost can be right (``origin/providers/pricing.py``)."""
    usage = usage if isinstance(usage, dict) else {}
    cache_read = token_count(usage.get("cache_read_input_tokens"))
    cache_write = token_count(usage.get("cache_creation_input_tokens"))
    prompt = token_count(usage.get("input_tokens")) + cache_write + cache_read
    completion = token_count(usage.get("output_tokens"))
    result: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cache_read or cache_write:
        result["prompt_tokens_details"] = {"cached_tokens": cache_read}
        if cache_write:
            result["prompt_tokens_details"]["cache_creation_tokens"] = cache_write
    return result


def tool_call_of(block: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic ``tool_use`` block as an OpenAI tool call."""
    arguments = orjson.dumps(block.get("input") or {}).decode()
    return {
        "id": block.get("id"),
        "type": "function",
        "function": {"name": block.get("name"), "arguments": arguments},
    }


def to_chat_completion(
    message: dict[str, Any], model: str, *, created: int | None = None, structured: bool = False
) -> dict[str, Any]:
    """The OpenAI ``chat.completion`` for an Anthropic ``message``, reported as ``model``;
    ``structured``: the request asked for JSON, answered through ``STRUCTURED_TOOL``."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    stop = message.get("stop_reason")
    for block in message.get("content") or ():
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and structured and block.get("name") == STRUCTURED_TOOL:
            texts.append(orjson.dumps(block.get("input") or {}).decode())
            stop = "end_turn"  # the JSON is the answer, not a call to make
        elif kind == "tool_use":
            calls.append(tool_call_of(block))
        # thinking, redacted_thinking and server-tool blocks have no OpenAI form
    text = "".join(texts)
    reply: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        reply["tool_calls"] = calls
    return {
        "id": str(message.get("id") or ""),
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": reply,
                "finish_reason": finish_reason(stop),
            }
        ],
        "usage": chat_usage(message.get("usage")),
    }
