"""Anthropic's Messages API on the wire: its error format, its event stream replayed from
a stored ``message``, and a stream's events assembled back into that ``message``.

Replay and assembly are inverses (``MessageAssembler`` over ``replay_message(m)``
gives ``m`` back for what a client sees: content blocks, stop reason, usage), which is
what lets a streamed and a plain request share one cache entry, as for chat.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import PrismError, UpstreamError

__all__ = [
    "MessageAssembler",
    "anthropic_error_body",
    "anthropic_error_json",
    "event_frame",
    "replay_message",
]

_DUMP = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
# HTTP status -> Anthropic's error type (its SDK picks the exception class by status).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_error_body(error: PrismError) -> dict[str, Any]:
    """``error`` in Anthropic's format: ``{"type": "error", "error": {type, message}}``."""
    kind = _ERROR_TYPES.get(error.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def anthropic_error_json(error: PrismError) -> bytes:
    return _DUMP(anthropic_error_body(error)).encode()


def event_frame(event: dict[str, Any]) -> bytes:
    """One server-sent event as Anthropic sends it: ``event: <type>`` then its data."""
    return f"event: {event['type']}\ndata: {_DUMP(event)}\n\n".encode()


def _block_events(index: int, block: dict[str, Any]) -> list[dict[str, Any]]:
    kind = block.get("type")
    deltas: list[dict[str, Any]] = []
    start = dict(block)
    if kind == "text":
        start["text"] = ""
        if block.get("text"):
            deltas.append({"type": "text_delta", "text": block["text"]})
    elif kind == "tool_use":
        start["input"] = {}
        deltas.append({"type": "input_json_delta", "partial_json": _DUMP(block.get("input", {}))})
    elif kind == "thinking":
        start["thinking"] = ""
        start.pop("signature", None)
        if block.get("thinking"):
            deltas.append({"type": "thinking_delta", "thinking": block["thinking"]})
        if "signature" in block:
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
    # Any other block (redacted thinking, server tool results) starts whole.
    return [
        {"type": "content_block_start", "index": index, "content_block": start},
        *({"type": "content_block_delta", "index": index, "delta": d} for d in deltas),
        {"type": "content_block_stop", "index": index},
    ]


def replay_message(message: dict[str, Any]) -> bytes:
    """The whole ``text/event-stream`` body for a stored ``message``."""
    usage = message.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 0},
    }
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(message.get("content") or ()):
        if isinstance(block, dict):
            events += _block_events(index, block)
    delta = {
        "stop_reason": message.get("stop_reason"),
        "stop_sequence": message.get("stop_sequence"),
    }
    events.append(
        {
            "type": "message_delta",
            "delta": delta,
            "usage": {"output_tokens": usage.get("output_tokens", 0)},
        }
    )
    events.append({"type": "message_stop"})
    return b"".join(event_frame(event) for event in events)


class MessageAssembler:
    """Rebuilds a ``message`` from Messages API stream events (parsed JSON objects).

    ``done`` once ``message_stop`` came; an ``error`` event or one out of order raises
    ``UpstreamError`` (the answer is then never cached).
    """

    def __init__(self, provider: str = "") -> None:
        self._provider = provider
        self._message: dict[str, Any] | None = None
        self._json: dict[int, list[str]] = {}  # tool inputs as they stream, by block index
        self.done = False

    def _fail(self, what: str) -> UpstreamError:
        return UpstreamError(f"Provider '{self._provider}' sent {what}.", code="upstream_malformed")

    def _block(self, event: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        index = event.get("index")
        content = self._message["content"] if self._message is not None else None
        if not isinstance(index, int) or content is None or not 0 <= index < len(content):
            raise self._fail(f"a {event.get('type')} event for no open content block")
        block: dict[str, Any] = content[index]
        return index, block

    def add(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message")
            if not isinstance(message, dict) or self._message is not None:
                raise self._fail("a malformed message_start event")
            self._message = {**message, "content": []}
        elif kind == "content_block_start":
            block = event.get("content_block")
            if self._message is None or not isinstance(block, dict):
                raise self._fail("a malformed content_block_start event")
            if event.get("index") != len(self._message["content"]):
                raise self._fail("content blocks out of order")
            self._message["content"].append(dict(block))
        elif kind == "content_block_delta":
            index, block = self._block(event)
            delta = event.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            what = delta.get("type")
            if what == "text_delta":
                block["text"] = block.get("text", "") + str(delta.get("text", ""))
            elif what == "input_json_delta":
                self._json.setdefault(index, []).append(str(delta.get("partial_json", "")))
            elif what == "thinking_delta":
                block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
            elif what == "signature_delta":
                block["signature"] = delta.get("signature")
            elif what == "citations_delta":
                block.setdefault("citations", []).append(delta.get("citation"))
        elif kind == "content_block_stop":
            index, block = self._block(event)
            parts = self._json.pop(index, None)
            if parts is not None:
                text = "".join(parts)
                try:
                    block["input"] = json.loads(text) if text else {}
                except ValueError:
                    raise self._fail("a tool input that is not JSON") from None
        elif kind == "message_delta":
            if self._message is None:
                raise self._fail("a message_delta event before message_start")
            delta = event.get("delta")
            if isinstance(delta, dict):
                for name in ("stop_reason", "stop_sequence"):
                    if name in delta:
                        self._message[name] = delta[name]
            usage = event.get("usage")
            if isinstance(usage, dict):
                # Counts in message_delta are cumulative: they replace, not add.
                current = self._message.get("usage")
                current = dict(current) if isinstance(current, dict) else {}
                current.update({k: v for k, v in usage.items() if v is not None})
                self._message["usage"] = current
        elif kind == "message_stop":
            if self._message is None:
                raise self._fail("a message_stop event before message_start")
            self.done = True
        elif kind == "error":
            error = event.get("error")
            what = error.get("type") if isinstance(error, dict) else None
            raise UpstreamError(
                f"Provider '{self._provider}' reported an error mid-stream"
                + (f": {str(what)[:100]}." if what else "."),
                code="upstream_stream_error",
            )
        # ping and unknown events carry nothing of the answer

    def message(self) -> dict[str, Any] | None:
        """The assembled message once whole (``message_stop`` came), else None."""
        return self._message if self.done else None
