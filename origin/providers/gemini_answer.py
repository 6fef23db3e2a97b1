"""Gemini ``generateContent`` answers → OpenAI chat completions, as pure functions (no I/O).

``to_chat_completion``: a ``GenerateContentResponse`` → an OpenAI ``chat.completion``. Its
finish reason, usage, tool-call and safety forms are shared with the stream translator
(``gemini_stream``), so a streamed and a non-streamed answer to one request are the same
cache entry. A blocked answer (``promptFeedback.blockReason``, or a candidate stopped by a
filter before it said anything) is never a completion: it raises the content-policy error,
so it is never stored. Apart from the request's translation (``gemini_request``).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import orjson

from prism import InvalidRequestError, PrismError, UpstreamError

from .token_counts import token_count

__all__ = [
    "FILTERED",
    "FINISH_REASONS",
    "blocked_prompt",
    "chat_usage",
    "empty_answer",
    "finish_reason",
    "parts_of",
    "to_chat_completion",
    "tool_call_of",
]

# Gemini finishReason -> OpenAI finish_reason (a call's STOP becomes tool_calls)
FINISH_REASONS = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "LANGUAGE": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
    "IMAGE_PROHIBITED_CONTENT": "content_filter",
    "MODEL_ARMOR": "content_filter",
}
FILTERED = "content_filter"
# Reasons that mean the model failed to answer at all: with nothing said, another try
# (or another target) may do better, and an empty answer must not be stored.
_FAILED = frozenset({"MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL", "MALFORMED_RESPONSE"})


def finish_reason(reason: Any, calls: bool) -> str:
    """OpenAI's ``finish_reason`` for a Gemini ``finishReason`` (``calls``: it made tool calls)."""
    finish = FINISH_REASONS.get(reason, "stop") if isinstance(reason, str) else "stop"
    return "tool_calls" if calls and finish == "stop" else finish


def chat_usage(usage: Any) -> dict[str, Any]:
    """OpenAI usage for ``usageMetadata``: tool-use prompt tokens count as prompt tokens and
    thinking tokens as completion tokens (both billed so); the cached share of the prompt
    stays visible as ``cached_tokens``."""
    usage = usage if isinstance(usage, dict) else {}
    prompt = token_count(usage.get("promptTokenCount")) + token_count(
        usage.get("toolUsePromptTokenCount")
    )
    thoughts = token_count(usage.get("thoughtsTokenCount"))
    completion = token_count(usage.get("candidatesTokenCount")) + thoughts
    result: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    cached = token_count(usage.get("cachedContentTokenCount"))
    if cached:
        result["prompt_tokens_details"] = {"cached_tokens": cached}
    if thoughts:
        result["completion_tokens_details"] = {"reasoning_tokens": thoughts}
    return result


def tool_call_of(call: dict[str, Any], index: int) -> dict[str, Any]:
    """A ``functionCall`` as an OpenAI tool call. Without an id from Gemini, one made of
    the call itself, so the streamed and the whole answer name it alike."""
    arguments = orjson.dumps(call.get("args") or {}).decode()
    name = str(call.get("name") or "")
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        digest = hashlib.sha256(f"{index}\0{name}\0{arguments}".encode()).hexdigest()
        call_id = f"call_{digest[:24]}"
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def blocked_prompt(provider: str, answer: dict[str, Any]) -> InvalidRequestError | None:
    """The error for a prompt Gemini refused to answer (``promptFeedback.blockReason``)."""
    feedback = answer.get("promptFeedback")
    reason = feedback.get("blockReason") if isinstance(feedback, dict) else None
    if not reason or answer.get("candidates"):
        return None
    return InvalidRequestError(
        f"Provider '{provider}' blocked the prompt ({reason}).", code="content_policy_violation"
    )


def empty_answer(provider: str, reason: Any) -> PrismError:
    """The error for a candidate that stopped for ``reason`` before it said anything."""
    if FINISH_REASONS.get(reason) == FILTERED:
        return InvalidRequestError(
            f"Provider '{provider}' blocked the answer ({reason}).",
            code="content_policy_violation",
        )
    if reason in _FAILED:
        return UpstreamError(
            f"Provider '{provider}' failed to answer ({reason}).", code="upstream_malformed"
        )
    return UpstreamError(f"Provider '{provider}' sent an empty answer.", code="upstream_malformed")


def _candidate(answer: dict[str, Any]) -> dict[str, Any]:
    candidates = answer.get("candidates")
    first = candidates[0] if isinstance(candidates, list) and candidates else None
    return first if isinstance(first, dict) else {}


def parts_of(candidate: dict[str, Any]) -> list[dict[str, Any]]:
    content = candidate.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


def to_chat_completion(
    answer: dict[str, Any], model: str, *, provider: str = "gemini", created: int | None = None
) -> dict[str, Any]:
    """The OpenAI ``chat.completion`` for a Gemini answer, reported as ``model``; raises the
    content-policy error for a blocked one."""
    blocked = blocked_prompt(provider, answer)
    if blocked is not None:
        raise blocked
    candidate = _candidate(answer)
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for part in parts_of(candidate):
        if part.get("thought"):
            continue  # a thought summary is not the answer
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(part.get("functionCall"), dict):
            calls.append(tool_call_of(part["functionCall"], len(calls)))
        # inline data, executable code and the like have no chat form
    text = "".join(texts)
    reason = candidate.get("finishReason")
    if not text and not calls:
        raise empty_answer(provider, reason)
    reply: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        reply["tool_calls"] = calls
    return {
        "id": str(answer.get("responseId") or ""),
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [
            {"index": 0, "message": reply, "finish_reason": finish_reason(reason, bool(calls))}
        ],
        "usage": chat_usage(answer.get("usageMetadata")),
    }
