"""OpenAI's Responses API on the wire: its event stream replayed from a stored
``response``, and a stream's events assembled back into that ``response``.

Every event is ``event: <type>`` then its JSON data, numbered by ``sequence_number`` from
0: ``response.created``, ``response.in_progress``, then per output item
``response.output_item.added``, its content (a message's parts:
``response.content_part.added``, ``response.output_text.delta``/``.done`` or
``response.refusal.delta``/``.done``, ``response.content_part.done``; a function call's
``response.function_call_arguments.delta``/``.done``), ``response.output_item.done``, and
last ``response.completed`` (``response.incomplete`` when the answer was cut at its token
limit) with the whole response.

Replay and assembly are inverses (``ResponseAssembler`` over ``replay_response(r)`` gives
``r`` back), which is what lets a streamed and a plain request share one cache entry, as
for chat. Errors are OpenAI's (``prism.errors.error_json``); a stream that fails after it
started ends with an ``error`` event (``error_event``).
"""

from __future__ import annotations

import json
from typing import Any

from .errors import PrismError, UpstreamError

__all__ = [
    "ResponseAssembler",
    "error_event",
    "event_frame",
    "replay_events",
    "replay_response",
]

_DUMP = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
# The events that end a stream, each carrying the whole response.
_FINAL = frozenset({"response.completed", "response.incomplete"})
_TEXT_EVENTS = {
    "output_text": ("response.output_text.delta", "response.output_text.done", "text"),
    "refusal": ("response.refusal.delta", "response.refusal.done", "refusal"),
}


def event_frame(event: dict[str, Any]) -> bytes:
    """One server-sent event as OpenAI sends it: ``event: <type>`` then its data."""
    return f"event: {event['type']}\ndata: {_DUMP(event)}\n\n".encode()


def error_event(error: PrismError) -> bytes:
    """The ``error`` event that ends a stream which failed after it started (its place
    in the sequence is not known where it is made, so it has no ``sequence_number``)."""
    event = {"type": "error", "code": error.code, "message": error.message, "param": error.param}
    return event_frame(event)


def _part_events(item_id: str, output: int, index: int, part: dict[str, Any]) -> list[Any]:
    kind = part.get("type")
    where = {"item_id": item_id, "output_index": output, "content_index": index}
    names = _TEXT_EVENTS.get(str(kind))
    if names is None:  # a part with nothing to stream starts whole
        return [
            {"type": "response.content_part.added", **where, "part": part},
            {"type": "response.content_part.done", **where, "part": part},
        ]
    delta_type, done_type, field = names
    text = str(part.get(field) or "")
    events: list[dict[str, Any]] = [
        {"type": "response.content_part.added", **where, "part": {**part, field: ""}}
    ]
    logprobs: dict[str, list[Any]] = {"logprobs": []} if kind == "output_text" else {}
    if text:
        events.append({"type": delta_type, **where, "delta": text, **logprobs})
    events.append({"type": done_type, **where, field: text, **logprobs})
    events.append({"type": "response.content_part.done", **where, "part": part})
    return events


def _item_events(output: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    kind = item.get("type")
    item_id = str(item.get("id") or "")
    events: list[dict[str, Any]] = []
    if kind == "message":
        start = {**item, "status": "in_progress", "content": []}
        events.append({"type": "response.output_item.added", "output_index": output, "item": start})
        for index, part in enumerate(item.get("content") or ()):
            if isinstance(part, dict):
                events += _part_events(item_id, output, index, part)
    elif kind == "function_call":
        start = {**item, "status": "in_progress", "arguments": ""}
        events.append({"type": "response.output_item.added", "output_index": output, "item": start})
        arguments = str(item.get("arguments") or "")
        where = {"item_id": item_id, "output_index": output}
        if arguments:
            events.append(
                {"type": "response.function_call_arguments.delta", **where, "delta": arguments}
            )
        events.append(
            {"type": "response.function_call_arguments.done", **where, "arguments": arguments}
        )
    else:  # reasoning and the rest: whole at once
        events.append({"type": "response.output_item.added", "output_index": output, "item": item})
    events.append({"type": "response.output_item.done", "output_index": output, "item": item})
    return events


def replay_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The whole event sequence for a stored ``response``, numbered."""
    start = {**response, "status": "in_progress", "output": [], "usage": None}
    start.update(incomplete_details=None, error=None)
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": start},
        {"type": "response.in_progress", "response": start},
    ]
    for output, item in enumerate(response.get("output") or ()):
        if isinstance(item, dict):
            events += _item_events(output, item)
    final = (
        "response.incomplete" if response.get("status") == "incomplete" else "response.completed"
    )
    events.append({"type": final, "response": response})
    for number, event in enumerate(events):
        event["sequence_number"] = number
    return events


def replay_response(response: dict[str, Any]) -> bytes:
    """The whole ``text/event-stream`` body for a stored ``response``."""
    return b"".join(event_frame(event) for event in replay_events(response))


class ResponseAssembler:
    """Rebuilds a ``response`` from Responses stream events (parsed JSON objects).

    ``done`` once ``response.completed`` (or ``response.incomplete``) came; a
    ``response.failed`` or ``error`` event, or one out of order, raises ``UpstreamError``
    (the answer is then never cached).
    """

    def __init__(self, provider: str = "") -> None:
        self._provider = provider
        self._response: dict[str, Any] | None = None
        self._items: list[dict[str, Any]] = []
        self._sequence = -1
        self.done = False

    def _fail(self, what: str) -> UpstreamError:
        return UpstreamError(f"Provider '{self._provider}' sent {what}.", code="upstream_malformed")

    def _item(self, event: dict[str, Any]) -> dict[str, Any]:
        index = event.get("output_index")
        if not isinstance(index, int) or not 0 <= index < len(self._items):
            raise self._fail(f"a {event.get('type')} event for no open output item")
        return self._items[index]

    def _part(self, event: dict[str, Any]) -> dict[str, Any]:
        content = self._item(event).get("content")
        index = event.get("content_index")
        if not isinstance(content, list) or not isinstance(index, int):
            raise self._fail(f"a {event.get('type')} event for no content part")
        if not 0 <= index < len(content) or not isinstance(content[index], dict):
            raise self._fail(f"a {event.get('type')} event for no content part")
        part: dict[str, Any] = content[index]
        return part

    def add(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        number = event.get("sequence_number")
        if isinstance(number, int) and not isinstance(number, bool):
            if number <= self._sequence:
                raise self._fail("events out of sequence")
            self._sequence = number
        if kind == "error" or kind == "response.failed":
            raise self._error(event)
        if kind == "response.created":
            response = event.get("response")
            if not isinstance(response, dict) or self._response is not None:
                raise self._fail("a malformed response.created event")
            self._response = response
            return
        if self._response is None:
            raise self._fail(f"a {kind} event before response.created")
        if kind == "response.output_item.added":
            item = event.get("item")
            if not isinstance(item, dict) or event.get("output_index") != len(self._items):
                raise self._fail("output items out of order")
            self._items.append(
                {**item, "content": []} if item.get("type") == "message" else dict(item)
            )
        elif kind == "response.content_part.added":
            content = self._item(event).setdefault("content", [])
            part = event.get("part")
            if not isinstance(part, dict) or event.get("content_index") != len(content):
                raise self._fail("content parts out of order")
            content.append(dict(part))
        elif kind in ("response.output_text.delta", "response.refusal.delta"):
            part = self._part(event)
            field = "text" if kind == "response.output_text.delta" else "refusal"
            part[field] = str(part.get(field) or "") + str(event.get("delta") or "")
        elif kind == "response.content_part.done":
            part = event.get("part")
            if isinstance(part, dict):
                self._part(event).update(part)
        elif kind == "response.function_call_arguments.delta":
            item = self._item(event)
            item["arguments"] = str(item.get("arguments") or "") + str(event.get("delta") or "")
        elif kind == "response.output_item.done":
            item = event.get("item")
            if not isinstance(item, dict):
                raise self._fail("a malformed response.output_item.done event")
            self._item(event)
            self._items[event["output_index"]] = item
        elif kind in _FINAL:
            response = event.get("response")
            if not isinstance(response, dict):
                raise self._fail(f"a malformed {kind} event")
            if not response.get("output") and self._items:
                response = {**response, "output": self._items}
            self._response = response
            self.done = True
        # in_progress, the .done events of text and arguments (their deltas already
        # added up) and unknown events carry nothing more of the answer

    def _error(self, event: dict[str, Any]) -> UpstreamError:
        error = event
        if event.get("type") == "response.failed":
            response = event.get("response")
            found = response.get("error") if isinstance(response, dict) else None
            error = found if isinstance(found, dict) else {}
        code = error.get("code")
        return UpstreamError(
            f"Provider '{self._provider}' reported an error mid-stream"
            + (f": {str(code)[:100]}." if code else "."),
            code="upstream_stream_error",
        )

    def response(self) -> dict[str, Any] | None:
        """The assembled response once whole (its final event came), else None."""
        return self._response if self.done else None
