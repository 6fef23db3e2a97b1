"""The event streams of the local provider, whatever the API: a reply's stream as a plan
of events, their SSE framing, and the streams (and the body) a fault spoils.

``provider_openai`` and ``provider_anthropic`` fill a ``StreamPlan``; the server
(``provider_app``) paces and cuts it. Apart from either API's format because both
share it, and the faults' variants (``malformed_stream``, ``error_event``,
``without_done``) are written once for both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from deploy.local.provider_faults import Api

__all__ = [
    "MALFORMED_JSON",
    "StreamPlan",
    "error_event",
    "fragments",
    "malformed_stream",
    "sse",
    "sse_event",
    "without_done",
    "word_pieces",
]

_WORDS = re.compile(r"\s*\S+\s*")
# The body a non-streamed reply gets under the ``malformed_json`` fault.
MALFORMED_JSON = b'{"id": "malformed", "object": "chat.completion", "choices": [<<not json>>'


def word_pieces(text: str, count: int) -> list[tuple[str, int]]:
    """Split at word boundaries into at most ``count`` (piece, words); joins back to text."""
    words = _WORDS.findall(text)
    if not words:
        return [(text, 0)] if text else []
    size = -(-len(words) // max(1, count))
    return [
        ("".join(words[i : i + size]), len(words[i : i + size])) for i in range(0, len(words), size)
    ]


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """The events of one streamed reply, in order."""

    events: list[tuple[bytes, int]]  # (SSE bytes, words it carries, for pacing)
    terminal: int  # index of the first event that says the reply is complete


def sse(data: Any) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def sse_event(data: dict[str, Any]) -> bytes:
    kind: str = data["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def fragments(text: str, parts: int = 3) -> list[str]:
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


def malformed_stream(api: Api, plan: StreamPlan) -> StreamPlan:
    """The first event, then one whose data is not JSON, then the usual end marker."""
    if api == "anthropic":
        bad = b'event: content_block_delta\ndata: {"type": "content_block_delta", <<not json>>\n\n'
        return StreamPlan([plan.events[0], (bad, 0)], 2)
    bad = b'data: {"id": "malformed", "choices": [<<not json>>\n\n'
    return StreamPlan([plan.events[0], (bad, 0), (b"data: [DONE]\n\n", 0)], 2)


def error_event(api: Api, message: str) -> StreamPlan:
    """A stream that is only the API's error event (Anthropic: an overload after the 200)."""
    if api == "anthropic":
        error = {"type": "error", "error": {"type": "overloaded_error", "message": message}}
        return StreamPlan([(sse_event(error), 0)], 0)
    return StreamPlan([(sse({"error": {"message": message, "type": "server_error"}}), 0)], 0)


def without_done(plan: StreamPlan) -> StreamPlan:
    """Every choice finished, then a clean end but no end marker (``[DONE]``, ``message_stop``)."""
    return StreamPlan(plan.events[:-1], plan.terminal)
