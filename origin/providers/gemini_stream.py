"""Gemini ``streamGenerateContent`` events → OpenAI ``chat.completion.chunk`` dicts (no I/O).

Each SSE event of the stream is a whole ``GenerateContentResponse`` holding the next
piece of the answer; the one with a ``finishReason`` is the last. ``StreamTranslator``
emits exactly the chunks ``prism.sse.StreamAssembler`` rebuilds into what
``gemini_answer.to_chat_completion`` makes of the same answer, whose finish reason, usage,
tool-call and safety forms it shares. Apart from the answer because it is a state
machine over events (started or not, tool calls counted, the end seen).
"""

from __future__ import annotations

import time
from typing import Any

from .gemini_answer import (
    blocked_prompt,
    chat_usage,
    empty_answer,
    finish_reason,
    parts_of,
    tool_call_of,
)

__all__ = ["StreamTranslator"]


class StreamTranslator:
    """Gemini stream events in, OpenAI ``chat.completion.chunk`` dicts out.

    Nothing is emitted before the answer's first text or call: a stream Gemini blocks
    (the prompt, or the answer before it said anything) raises the content-policy error
    instead, before the client is committed to a 200. The finish chunk and the usage
    chunk (``choices: []``) are emitted together at the event with a ``finishReason``;
    ``done`` turns true there and anything after it is ignored.
    """

    def __init__(self, model: str, *, created: int | None = None, provider: str = "gemini") -> None:
        self._model = model
        self._provider = provider  # named in error messages
        self._created = int(time.time()) if created is None else created
        self._id: str | None = None
        self._usage: Any = None
        self._started = False
        self._calls = 0
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": self._id or "",
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    def feed(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        if self._done:
            return []
        blocked = blocked_prompt(self._provider, event)
        if blocked is not None:
            raise blocked
        if self._id is None and isinstance(event.get("responseId"), str):
            self._id = event["responseId"]
        if isinstance(event.get("usageMetadata"), dict):
            self._usage = event["usageMetadata"]  # cumulative: the latest is the whole
        candidates = event.get("candidates")
        candidate = candidates[0] if isinstance(candidates, list) and candidates else None
        if not isinstance(candidate, dict):
            return []
        out: list[dict[str, Any]] = []
        for part in parts_of(candidate):
            if part.get("thought"):
                continue
            text = part.get("text")
            if isinstance(text, str):
                if text:
                    out.append(self._chunk({"content": text}))
            elif isinstance(part.get("functionCall"), dict):
                call = {"index": self._calls, **tool_call_of(part["functionCall"], self._calls)}
                self._calls += 1
                out.append(self._chunk({"tool_calls": [call]}))
        if out and not self._started:
            self._started = True
            out.insert(0, self._chunk({"role": "assistant", "content": ""}))
        reason = candidate.get("finishReason")
        if reason and reason != "FINISH_REASON_UNSPECIFIED":
            if not self._started:
                raise empty_answer(self._provider, reason)
            self._done = True
            usage_chunk = {**self._chunk({}), "choices": [], "usage": chat_usage(self._usage)}
            out += [self._chunk({}, finish_reason(reason, self._calls > 0)), usage_chunk]
        return out
