"""A Responses API stream broken mid-answer, carried on by another target of its route
(``origin.routing.resume`` drives it; this is the Responses API's part).

The client has a ``response.created`` and at most one output item, a message whose text is
still streaming. The Responses API has no way to continue a partial answer, so the
continuing target is always asked through its chat API: the request translated to chat
with the text as its continued last message (``continuation_body``: an Anthropic target's
prefill, an OpenAI-compatible one's ``continuation``), its chunks translated back to
Responses events. They are spliced on (``ResponsesSplice``) so the client sees one
response: its ``response.created`` and ``response.in_progress`` go, its message item
carries on the open one (its ``output_item.added`` and ``content_part.added`` go; the item's
id is the first part's, its ``.done`` events carry the whole text), later items are
numbered after it, every ``sequence_number`` follows on from the first part's, and
``response.completed`` carries the whole response (the first part's id and creation
time, the usage the continuation reported: the first part's stream reported none) and
which providers answered (``"prism": {"providers": [...], "resumed": true}``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import orjson

from prism import PrismError

from ..providers.base import ChatProvider, UpstreamStream
from ..providers.responses_translate import to_chat_request
from ..providers.token_counts import Tokens, tokens_of
from ..routing.continuation import Partial, asks_afresh, frame_event
from ..routing.resume import continuation_body, trim_overlap

__all__ = ["FirstResponse", "ResponsesContinuation", "ResponsesSplice", "partial_response"]


class FirstResponse(NamedTuple):
    """What the splice needs of the part the client has."""

    response: dict[str, Any]  # as response.created gave it
    item: dict[str, Any] | None  # the open message item (None: no output yet)
    part: bool  # its output_text part was added
    text: str
    sequence: int  # the last sequence_number the client had


def partial_response(frames: list[bytes]) -> Partial | None:
    """The text of the relayed events; None when it cannot be carried on as text (an item
    other than one message, a part other than text, a finished item or response)."""
    response: dict[str, Any] | None = None
    item: dict[str, Any] | None = None
    part = False
    text: list[str] = []
    sequence = -1
    for frame in frames:
        event = frame_event(frame)
        if event is None:
            return None
        number = event.get("sequence_number")
        sequence = number if isinstance(number, int) else sequence
        kind = event.get("type")
        if kind == "response.created" and isinstance(event.get("response"), dict):
            response = event["response"]
        elif kind == "response.output_item.added" and item is None:
            added = event.get("item")
            if not isinstance(added, dict) or added.get("type") != "message":
                return None
            item = added
        elif kind == "response.content_part.added" and item is not None and not part:
            added = event.get("part")
            if not isinstance(added, dict) or added.get("type") != "output_text":
                return None
            part = True
            text.append(str(added.get("text") or ""))
        elif kind == "response.output_text.delta" and part:
            text.append(str(event.get("delta") or ""))
        elif kind != "response.in_progress":
            return None
    if response is None:
        return None
    return Partial("".join(text), FirstResponse(response, item, part, "".join(text), sequence))


class ResponsesSplice:
    """The continuation's events as the rest of the first part's response."""

    __slots__ = (
        "_extension",
        "_first",
        "_merged",
        "_offset",
        "_overlap",
        "_sequence",
        "_text",
        "usage",
    )

    def __init__(self, first: FirstResponse, overlap: str, providers: list[str]) -> None:
        self._first = first
        self._overlap = overlap
        self._extension = {"providers": providers, "resumed": True}
        self._sequence = first.sequence
        self._merged = False  # the continuation's first item carries on the open one
        self._offset: int | None = None  # its item i is the client's i + this
        self._text = first.text  # the open item's whole text
        self.usage: Tokens | None = None  # the continuation's, from its final event

    def feed(self, data: bytes) -> list[bytes]:
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            return [data]  # the builder says what is wrong with it
        if not isinstance(event, dict):
            return [data]
        kind = event.get("type")
        if kind in ("response.created", "response.in_progress"):
            return []
        out: list[dict[str, Any]] = []
        if self._offset is None and kind != "error":
            item = event.get("item")
            open_item = self._first.item
            if (
                kind == "response.output_item.added"
                and open_item is not None
                and isinstance(item, dict)
                and item.get("type") == "message"
            ):
                self._merged, self._offset = True, 0
                return []
            self._offset = 0 if open_item is None else 1
            out = self._close_first()
        merged = self._merged and event.get("output_index") == 0
        if merged:
            if kind == "response.content_part.added" and self._first.part:
                return self._numbered(out)
            if not self._rewrite_merged(event):
                return self._numbered(out)
        if kind in ("response.completed", "response.incomplete"):
            self._finish(event)
        elif isinstance(event.get("output_index"), int) and not merged:
            event["output_index"] += self._offset or 0
        return self._numbered([*out, event])

    def end(self) -> list[bytes]:
        return []  # nothing is held: a continuation without its final event is cut short

    def _rewrite_merged(self, event: dict[str, Any]) -> bool:
        """An event of the item that carries on the open one, as that item's; False when
        nothing of it is left to relay."""
        first = self._first.item
        assert first is not None
        kind = event.get("type")
        if "item_id" in event:
            event["item_id"] = first["id"]
        if kind == "response.output_text.delta":
            delta = str(event.get("delta") or "")
            if self._overlap:
                self._overlap, delta = trim_overlap(self._overlap, delta)
            if not delta:
                return False
            event["delta"] = delta
            self._text += delta
        elif kind == "response.output_text.done":
            event["text"] = self._text
        elif kind == "response.content_part.done" and isinstance(event.get("part"), dict):
            event["part"] = {**event["part"], "text": self._text}
        elif kind == "response.output_item.done" and isinstance(event.get("item"), dict):
            event["item"] = self._whole_item(event["item"])
        return True

    def _whole_item(self, item: dict[str, Any]) -> dict[str, Any]:
        """The continuation's message item as the open one, with the whole text."""
        first = self._first.item
        assert first is not None
        content = [dict(part) for part in item.get("content") or () if isinstance(part, dict)]
        if content and content[0].get("type") == "output_text":
            content[0]["text"] = self._text
        return {**item, "id": first["id"], "content": content}

    def _close_first(self) -> list[dict[str, Any]]:
        """The open item's end, when the continuation does not carry it on."""
        item = self._first.item
        if item is None:
            return []
        where = {"item_id": item["id"], "output_index": 0}
        part = {"type": "output_text", "text": self._text, "annotations": [], "logprobs": []}
        done = {**item, "status": "completed", "content": [part] if self._first.part else []}
        events: list[dict[str, Any]] = []
        if self._first.part:
            at = {**where, "content_index": 0}
            events.append(
                {"type": "response.output_text.done", **at, "text": self._text, "logprobs": []}
            )
            events.append({"type": "response.content_part.done", **at, "part": part})
        events.append({"type": "response.output_item.done", "output_index": 0, "item": done})
        return events

    def _finish(self, event: dict[str, Any]) -> None:
        """The final event: the whole response, the first part's, and who answered it."""
        response = event.get("response")
        if isinstance(response, dict):
            self.usage = tokens_of(response.get("usage"))
            output = [o for o in response.get("output") or () if isinstance(o, dict)]
            first = self._first.item
            if self._merged and output and output[0].get("type") == "message":
                output[0] = self._whole_item(output[0])
            elif first is not None:
                part = {"type": "output_text", "text": self._text, "annotations": []}
                output.insert(0, {**first, "status": "completed", "content": [part]})
            shell = self._first.response
            event["response"] = {
                **response,
                "id": shell.get("id", response.get("id")),
                "created_at": shell.get("created_at", response.get("created_at")),
                "output": output,
            }
        event["prism"] = self._extension

    def _numbered(self, events: list[dict[str, Any]]) -> list[bytes]:
        out = []
        for event in events:
            self._sequence += 1
            event["sequence_number"] = self._sequence
            out.append(orjson.dumps(event))
        return out


Translated = Callable[
    [ChatProvider, dict[str, Any], dict[str, Any], str], Awaitable[UpstreamStream]
]


class ResponsesContinuation:
    """The Responses API's: the open message's text, carried on through the chat API."""

    __slots__ = ("_translated",)

    def __init__(self, translated: Translated) -> None:
        self._translated = translated  # a chat request's stream as Responses events

    def partial(self, body: dict[str, Any], frames: list[bytes], usage: set[int]) -> Partial | None:
        try:
            chat = to_chat_request(body)
        except PrismError:
            return None  # only a native Responses provider could take this request
        return partial_response(frames) if asks_afresh(chat) else None

    def stream(
        self, provider: ChatProvider, body: dict[str, Any], model: str, text: str
    ) -> Awaitable[UpstreamStream]:
        chat = continuation_body(provider.spec, to_chat_request(body, stream=True), text)
        return self._translated(provider, body, chat, model)

    def splice(self, partial: Partial, overlap: str, providers: list[str]) -> ResponsesSplice:
        return ResponsesSplice(partial.meta, overlap, providers)
