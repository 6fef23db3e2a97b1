"""ConverseStream's answer → OpenAI ``chat.completion.chunk`` dicts (no I/O).

A ConverseStream body is the AWS event stream (``application/vnd.amazon.eventstream``):
binary messages, each a prelude (total and header lengths, the prelude's CRC32), headers
(``:message-type``, ``:event-type``, ``:content-type``), a JSON payload and the message's
CRC32. ``EventDecoder`` cuts the bytes into messages as they arrive, with botocore's own
parser (it checks both CRCs). ``StreamTranslator`` turns the events (``messageStart``,
``contentBlockStart`` / ``Delta`` / ``Stop``, ``messageStop``, ``metadata``) into the chunks
``prism.sse.StreamAssembler`` rebuilds into what ``bedrock_answer.to_chat_completion``
makes of the same answer; an ``exception`` message is raised as the error it names.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import orjson
from botocore.eventstream import EventStreamBuffer, ParserError

from prism import UpstreamError

from .base import ProviderSpec
from .bedrock_answer import chat_usage, completion_id, finish_reason
from .bedrock_errors import error_of_event

__all__ = ["EventDecoder", "StreamTranslator"]

# The events after messageStart that carry the answer
_EVENTS = frozenset(
    {"contentBlockStart", "contentBlockDelta", "contentBlockStop", "messageStop", "metadata"}
)


def _malformed(spec: ProviderSpec, what: str) -> UpstreamError:
    return UpstreamError(
        f"Provider '{spec.name}' sent a malformed stream: {what}.", code="upstream_malformed"
    )


class EventDecoder:
    """Event-stream bytes in, ``(event type, payload)`` out, message by message; an
    ``exception`` or ``error`` message is raised as the gateway's error."""

    def __init__(self, spec: ProviderSpec) -> None:
        self._spec = spec
        self._buffer = EventStreamBuffer()

    def feed(self, data: bytes) -> list[tuple[str, dict[str, Any]]]:
        self._buffer.add_data(data)
        events: list[tuple[str, dict[str, Any]]] = []
        try:
            for message in self._buffer:
                parts = message.to_response_dict()  # typed, where .headers is not (stubs)
                events.append(self._event(parts["headers"], parts["body"]))
        except ParserError as error:  # a bad length or CRC: the bytes cannot be trusted
            raise _malformed(self._spec, type(error).__name__) from None
        return events

    def _event(self, headers: Mapping[str, Any], payload: bytes) -> tuple[str, dict[str, Any]]:
        kind = headers.get(":message-type")
        if kind in ("exception", "error"):
            raise error_of_event(self._spec, headers, payload)
        if kind != "event":
            raise _malformed(self._spec, f"a message of type {kind!r}")
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise _malformed(self._spec, "an event that is not JSON") from None
        if not isinstance(event, dict):
            raise _malformed(self._spec, "an event that is not an object")
        return str(headers.get(":event-type") or ""), event


class StreamTranslator:
    """Converse stream events in, OpenAI ``chat.completion.chunk`` dicts out.

    The finish chunk is emitted at ``messageStop``; the usage chunk at ``metadata``, the
    last event, which proves the answer complete: ``done`` turns true there.
    """

    def __init__(self, spec: ProviderSpec, model: str, *, created: int | None = None) -> None:
        self._spec = spec
        self._model = model
        self._id = completion_id()
        self._created = int(time.time()) if created is None else created
        self._started = False
        self._stopped = False
        # Converse block index -> OpenAI tool-call index (None for a text block)
        self._blocks: dict[int, int | None] = {}
        self._with_arguments: set[int] = set()  # tool calls that got an input fragment
        self._tool_count = 0
        self.done = False

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    def feed(self, kind: str, event: dict[str, Any]) -> list[dict[str, Any]]:
        if self.done:
            return []
        if kind == "messageStart":
            if self._started:
                raise _malformed(self._spec, "a repeated messageStart")
            self._started = True
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind not in _EVENTS:
            return []  # Bedrock may add event types; unknown ones carry nothing we serve
        if not self._started:
            raise _malformed(self._spec, f"{kind} before messageStart")
        if kind == "contentBlockStart":
            return self._block_start(event)
        if kind == "contentBlockDelta":
            return self._block_delta(event)
        if kind == "contentBlockStop":
            return self._block_stop(event)
        if kind == "messageStop":
            self._stopped = True
            return [self._chunk({}, finish_reason(event.get("stopReason")))]
        if not self._stopped:
            raise _malformed(self._spec, "metadata before messageStop")
        self.done = True
        return [{**self._chunk({}), "choices": [], "usage": chat_usage(event.get("usage"))}]

    def _index(self, event: dict[str, Any]) -> int:
        index = event.get("contentBlockIndex")
        if not isinstance(index, int) or isinstance(index, bool):
            raise _malformed(self._spec, "a content block event without contentBlockIndex")
        return index

    def _block_start(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        index = self._index(event)
        if index in self._blocks:
            raise _malformed(self._spec, f"content block {index} started twice")
        start = event.get("start")
        tool = start.get("toolUse") if isinstance(start, dict) else None
        if not isinstance(tool, dict):
            self._blocks[index] = None
            return []
        position = self._blocks[index] = self._tool_count
        self._tool_count += 1
        call = {
            "index": position,
            "id": tool.get("toolUseId"),
            "type": "function",
            "function": {"name": tool.get("name"), "arguments": ""},
        }
        return [self._chunk({"tool_calls": [call]})]

    def _block_delta(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        index = self._index(event)
        delta = event.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        # A text block has no contentBlockStart: its first delta opens it.
        position = self._blocks.setdefault(index, None)
        text = delta.get("text")
        if isinstance(text, str):
            if position is not None:
                raise _malformed(self._spec, f"text in tool block {index}")
            return [self._chunk({"content": text})] if text else []
        tool = delta.get("toolUse")
        if isinstance(tool, dict):
            if position is None:
                raise _malformed(self._spec, f"tool input in text block {index}")
            fragment = tool.get("input")
            if not isinstance(fragment, str) or not fragment:
                return []
            self._with_arguments.add(position)
            call = {"index": position, "function": {"arguments": fragment}}
            return [self._chunk({"tool_calls": [call]})]
        return []  # reasoningContent, citations and the like have no chunk form

    def _block_stop(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        position = self._blocks.get(self._index(event))
        if position is None or position in self._with_arguments:
            return []
        # A tool without parameters may stream no input at all; the non-stream answer
        # says "{}", and both must assemble to the same completion.
        self._with_arguments.add(position)
        call = {"index": position, "function": {"arguments": "{}"}}
        return [self._chunk({"tool_calls": [call]})]
