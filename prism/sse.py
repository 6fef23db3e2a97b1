"""Server-sent events for chat completions: replay a stored completion as a stream,
assemble a stream back into a completion, and decode SSE bytes incrementally.

Replay and assembly are inverses: ``assemble(replay(c)) == c`` for the fields a
client sees (content, role, refusal, tool calls, finish_reason, usage), which is
what lets a streamed and a non-streamed request share one cache entry.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["DONE", "SSEDecoder", "StreamAssembler", "replay"]

DONE = b"data: [DONE]\n\n"
_DUMP = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + _DUMP(chunk).encode() + b"\n\n"


def replay(completion: dict[str, Any], include_usage: bool = False) -> bytes:
    """The whole ``text/event-stream`` body for a stored ``chat.completion``."""
    base = {
        "id": completion.get("id", ""),
        "object": "chat.completion.chunk",
        "created": completion.get("created", 0),
        "model": completion.get("model", ""),
    }
    if "system_fingerprint" in completion:
        base["system_fingerprint"] = completion["system_fingerprint"]
    out: list[bytes] = []
    # Asked for usage, OpenAI gives every chunk a null "usage" and always ends with one
    # chunk of no choices carrying the totals; a stored answer without usage (a stream
    # whose first client did not ask) still ends with that chunk, its usage null.
    usage_field = {"usage": None} if include_usage else {}

    def emit(index: int, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> None:
        choice = {"index": index, "delta": delta, "finish_reason": finish, **extra}
        out.append(_event({**base, "choices": [choice], **usage_field}))

    for choice in completion.get("choices") or ():
        index = choice.get("index", 0)
        message = choice.get("message") or {}
        emit(index, {"role": message.get("role", "assistant"), "content": ""})
        content = message.get("content")
        if content:
            extra = {"logprobs": choice["logprobs"]} if choice.get("logprobs") else {}
            emit(index, {"content": content}, **extra)
        if message.get("refusal"):
            emit(index, {"refusal": message["refusal"]})
        for position, call in enumerate(message.get("tool_calls") or ()):
            function = call.get("function") or {}
            emit(
                index,
                {
                    "tool_calls": [
                        {
                            "index": position,
                            "id": call.get("id"),
                            "type": call.get("type", "function"),
                            "function": {
                                "name": function.get("name"),
                                "arguments": function.get("arguments", ""),
                            },
                        }
                    ]
                },
            )
        emit(index, {}, choice.get("finish_reason") or "stop")
    if include_usage:
        out.append(_event({**base, "choices": [], "usage": completion.get("usage")}))
    out.append(DONE)
    return b"".join(out)


class StreamAssembler:
    """Rebuilds a ``chat.completion`` from ``chat.completion.chunk`` objects.

    ``complete`` is the rule for whether a stream that has ended (``[DONE]``, or a
    clean close without it, which some providers do) holds a whole answer that may be
    relayed as such and cached. ``choices`` is how many the request asked for (``n``);
    ``usage`` whether it asked for a usage chunk.
    """

    def __init__(self, choices: int = 1, usage: bool = False) -> None:
        self._meta: dict[str, Any] = {}
        self._choices: dict[int, dict[str, Any]] = {}
        self._usage: dict[str, Any] | None = None
        self._expected_choices = choices
        # OpenAI puts ``"usage": null`` on every chunk when a usage chunk will follow.
        self._usage_promised = usage
        self.done = False

    def add(self, chunk: dict[str, Any]) -> None:
        if not self._meta:
            self._meta = {
                k: chunk[k] for k in ("id", "created", "model", "system_fingerprint") if k in chunk
            }
        if "usage" in chunk:
            self._usage_promised = True
            if chunk["usage"]:
                self._usage = chunk["usage"]
        for part in chunk.get("choices") or ():
            index = part.get("index", 0)
            state = self._choices.setdefault(
                index,
                {"role": "assistant", "content": [], "refusal": [], "tools": {}, "finish": None},
            )
            delta = part.get("delta") or {}
            if delta.get("role"):
                state["role"] = delta["role"]
            if delta.get("content"):
                state["content"].append(delta["content"])
            if delta.get("refusal"):
                state["refusal"].append(delta["refusal"])
            for call in delta.get("tool_calls") or ():
                slot = state["tools"].setdefault(
                    call.get("index", 0), {"id": None, "type": "function", "name": "", "args": []}
                )
                if call.get("id"):
                    slot["id"] = call["id"]
                if call.get("type"):
                    slot["type"] = call["type"]
                function = call.get("function") or {}
                if function.get("name"):
                    slot["name"] += function["name"]
                if function.get("arguments"):
                    slot["args"].append(function["arguments"])
            if part.get("finish_reason"):
                state["finish"] = part["finish_reason"]

    def finish(self) -> None:
        """Record the terminal ``[DONE]`` event."""
        self.done = True

    @property
    def finished(self) -> bool:
        """Every choice has its ``finish_reason``."""
        return bool(self._choices) and all(c["finish"] for c in self._choices.values())

    @property
    def complete(self) -> bool:
        """Every choice finished, and either ``[DONE]`` came, or (for a stream that closed
        cleanly without it) every choice asked for and the usage chunk promised did.
        Ask only once the stream has ended: before that, more may be on its way."""
        return (
            self.finished
            and len(self._choices) >= self._expected_choices
            and (self._usage is not None or not self._usage_promised)
        )

    def completion(self) -> dict[str, Any]:
        choices = []
        for index in sorted(self._choices):
            state = self._choices[index]
            message: dict[str, Any] = {
                "role": state["role"],
                "content": "".join(state["content"]) if state["content"] else None,
            }
            if state["refusal"]:
                message["refusal"] = "".join(state["refusal"])
            if state["tools"]:
                message["tool_calls"] = [
                    {
                        "id": slot["id"],
                        "type": slot["type"],
                        "function": {"name": slot["name"], "arguments": "".join(slot["args"])},
                    }
                    for _, slot in sorted(state["tools"].items())
                ]
            choices.append({"index": index, "message": message, "finish_reason": state["finish"]})
        result: dict[str, Any] = {
            "id": self._meta.get("id", ""),
            "object": "chat.completion",
            "created": self._meta.get("created", 0),
            "model": self._meta.get("model", ""),
            "choices": choices,
        }
        if "system_fingerprint" in self._meta:
            result["system_fingerprint"] = self._meta["system_fingerprint"]
        if self._usage is not None:
            result["usage"] = self._usage
        return result


class SSEDecoder:
    """Incremental SSE decoder: feed bytes as they arrive, get each event's data."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buffer += chunk
        events: list[bytes] = []
        while True:
            newline = self._buffer.find(b"\n")
            if newline < 0:
                return events
            line = self._buffer[:newline].rstrip(b"\r")
            self._buffer = self._buffer[newline + 1 :]
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            # comments (":"), "event:", "id:" and "retry:" lines carry nothing we need
