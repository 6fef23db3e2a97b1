"""An Anthropic Messages stream broken mid-answer, carried on by another target of its route
(``origin.routing.resume`` drives it; this is the Messages API's part).

The client has a ``message_start`` and text blocks, the last maybe still open. The
continuing target is asked with that text as the final assistant turn: a native Anthropic
one as its prefill (the Messages body), an OpenAI-compatible one as its chat request's
continued last message (``continuation_body``), its chunks translated back. Its events are
spliced on (``MessagesSplice``) so the client sees one event sequence: its
``message_start`` goes, its first text block carries on the open one (its
``content_block_start`` goes), later blocks are numbered after the first part's, and its
``message_delta`` carries the whole answer's usage (the input tokens as the first part
reported them, the output tokens of both parts) and which providers answered
(``"prism": {"providers": [...], "resumed": true}``, a field Anthropic's SDKs ignore).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import orjson

from ..providers.anthropic import AnthropicProvider
from ..providers.base import ChatProvider, UpstreamStream
from ..providers.messages_translate import to_chat_request
from ..providers.token_counts import Tokens, token_count, tokens_of
from ..routing.continuation import Partial, asks_afresh, frame_event
from ..routing.resume import continuation_body, prefill, trim_overlap

__all__ = ["FirstPart", "MessagesContinuation", "MessagesSplice", "partial_message"]


class FirstPart(NamedTuple):
    """What the splice needs of the part the client has."""

    blocks: int  # content blocks started
    open: int | None  # the text block still open: the continuation's text carries it on
    input_tokens: int  # as its message_start reported them
    output_tokens: int


def partial_message(frames: list[bytes]) -> Partial | None:
    """The text of the relayed events; None when it cannot be carried on as text (a block
    other than text, the message's end already given, an event that is not one)."""
    text: list[str] = []
    blocks, open_block, usage = 0, None, None
    for frame in frames:
        event = frame_event(frame)
        if event is None:
            return None
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            usage = usage if isinstance(usage, dict) else {}
        elif kind == "content_block_start":
            block = event.get("content_block")
            if not isinstance(block, dict) or block.get("type") != "text":
                return None
            text.append(str(block.get("text") or ""))
            open_block, blocks = blocks, blocks + 1
        elif kind == "content_block_delta":
            delta = event.get("delta")
            if not isinstance(delta, dict) or delta.get("type") != "text_delta":
                return None
            text.append(str(delta.get("text") or ""))
        elif kind == "content_block_stop":
            open_block = None
        elif kind != "ping":
            return None
    if usage is None:
        return None
    first = FirstPart(
        blocks,
        open_block,
        token_count(usage.get("input_tokens")),
        token_count(usage.get("output_tokens")),
    )
    # Its prompt as message_start reported it; its output there is only a start's count.
    return Partial("".join(text), first, tokens_of({**usage, "output_tokens": 0}))


class MessagesSplice:
    """The continuation's events as the rest of the first part's message."""

    __slots__ = ("_extension", "_first", "_input", "_offset", "_open", "_overlap", "usage")

    def __init__(self, first: FirstPart, overlap: str, providers: list[str]) -> None:
        self._first = first
        self._overlap = overlap
        self._extension = {"providers": providers, "resumed": True}
        self._open = first.open  # still to close, unless the continuation carries it on
        self._offset: int | None = None  # the continuation's block i is the client's i + this
        self._input: dict[str, Any] = {}  # the continuation's message_start usage
        self.usage: Tokens | None = None  # the continuation's own, from its message_delta

    def feed(self, data: bytes) -> list[bytes]:
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            return [data]  # the builder says what is wrong with it
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == "message_start":
            message = event.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            if isinstance(usage, dict):
                self._input = usage
            return []
        if kind == "content_block_start":
            out: list[bytes] = []
            if self._offset is None:
                block = event.get("content_block")
                if (
                    self._open is not None
                    and isinstance(block, dict)
                    and block.get("type") == "text"
                    and not block.get("text")
                ):
                    self._offset, self._open = self._open, None  # the open block goes on
                    return []
                out = self._number()
            return [*out, self._renumbered(event)]
        if kind in ("content_block_delta", "content_block_stop"):
            out = self._number() if self._offset is None else []
            delta = event.get("delta")
            if self._overlap and isinstance(delta, dict) and delta.get("type") == "text_delta":
                self._overlap, text = trim_overlap(self._overlap, str(delta.get("text") or ""))
                if not text:
                    return out
                delta["text"] = text
            return [*out, self._renumbered(event)]
        if kind == "message_delta":
            out = self._number() if self._offset is None else []
            usage = event.get("usage")
            usage = usage if isinstance(usage, dict) else {}
            # The continuation's own: its message_delta's counts, its start's where unsaid.
            own = {**self._input, **{k: v for k, v in usage.items() if v}}
            self.usage = tokens_of(own)
            first = self._first
            event["usage"] = {
                **usage,
                "input_tokens": first.input_tokens or token_count(own.get("input_tokens")),
                "output_tokens": first.output_tokens + token_count(usage.get("output_tokens")),
            }
            event["prism"] = self._extension
            return [*out, orjson.dumps(event)]
        return [data]  # message_stop, ping, an error: as they came

    def end(self) -> list[bytes]:
        return []  # nothing is held: a continuation without message_stop is cut short

    def _number(self) -> list[bytes]:
        """The continuation's first block is a new one: after the client's, which closes."""
        self._offset = self._first.blocks
        return self._close()

    def _close(self) -> list[bytes]:
        index, self._open = self._open, None
        if index is None:
            return []
        return [orjson.dumps({"type": "content_block_stop", "index": index})]

    def _renumbered(self, event: dict[str, Any]) -> bytes:
        index = event.get("index")
        if isinstance(index, int) and self._offset is not None:
            event["index"] = index + self._offset
        return orjson.dumps(event)


Translated = Callable[[ChatProvider, dict[str, Any], str], Awaitable[UpstreamStream]]


class MessagesContinuation:
    """The Messages API's: the text blocks so far, carried on by either kind of target."""

    __slots__ = ("_translated",)

    def __init__(self, translated: Translated) -> None:
        self._translated = translated  # a chat request's stream as Messages events

    def partial(self, body: dict[str, Any], frames: list[bytes], usage: set[int]) -> Partial | None:
        return partial_message(frames) if asks_afresh(body) else None

    def stream(
        self, provider: ChatProvider, body: dict[str, Any], model: str, text: str
    ) -> Awaitable[UpstreamStream]:
        if isinstance(provider, AnthropicProvider):
            given = prefill(provider.spec, text)
            if given:
                turn = {"role": "assistant", "content": given}
                body = {**body, "messages": [*body["messages"], turn]}
            return provider.messages_stream(body, model)
        chat = continuation_body(provider.spec, to_chat_request(body, stream=True), text)
        return self._translated(provider, chat, model)

    def splice(self, partial: Partial, overlap: str, providers: list[str]) -> MessagesSplice:
        return MessagesSplice(partial.meta, overlap, providers)
