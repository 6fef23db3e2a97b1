"""What an API's operation offers for carrying on a stream that broke mid-answer
(``Operation.continuation``; ``origin.routing.resume`` drives it): how to read the answer
the client has from the relayed frames, how to ask a target to carry on from it, and how
to splice the continuation's events onto the first part's, so the client sees one answer.

Chat's is ``origin.routing.resume.ChatContinuation``; Anthropic Messages' is
``origin.apis.messages_resume.MessagesContinuation``. An operation without one (None)
never resumes: its broken stream ends in its error event.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, NamedTuple, Protocol

import orjson

from ..providers.base import ChatProvider, UpstreamStream
from ..providers.token_counts import Tokens

__all__ = ["Continuation", "Partial", "Splicer", "asks_afresh", "frame_event"]


class Partial(NamedTuple):
    """The answer the client has so far."""

    text: str  # what the continuing target is asked to carry on from
    meta: Any  # what the API's splice needs of the first part (its id, its blocks, ...)
    usage: Tokens | None = None  # what the first part reported of its usage, if anything


class Splicer(Protocol):
    """The continuation's events rewritten as the rest of the first part's answer."""

    # The usage the continuation reported of its own, once its events carried it: the
    # spliced answer's may be both parts' (``origin.governance.resumed_bill``).
    usage: Tokens | None

    def feed(self, data: bytes) -> list[bytes]:
        """The events (the data of each) to relay for one of the continuation's."""
        ...

    def end(self) -> list[bytes]:
        """What is still held once the continuation's stream has ended."""
        ...


class Continuation(Protocol):
    def partial(self, body: dict[str, Any], frames: list[bytes], usage: set[int]) -> Partial | None:
        """The answer relayed so far; None when it cannot be carried on as text (a tool
        call, a finish already given, the client's own prefill, ...)."""
        ...

    def stream(
        self, provider: ChatProvider, body: dict[str, Any], model: str, text: str
    ) -> Awaitable[UpstreamStream]:
        """``provider``'s stream carrying on from ``text`` (asked afresh when empty)."""
        ...

    def splice(self, partial: Partial, overlap: str, providers: list[str]) -> Splicer:
        """For the continuation's events; ``overlap``: the end of the partial text the
        target was not given (white space an Anthropic prefill may not end in), dropped
        again from the continuation's start."""
        ...


_DATA = b"\ndata: "


def frame_event(frame: bytes) -> dict[str, Any] | None:
    """The JSON object of a relayed ``event: ...\ndata: {...}`` frame (Messages', the
    Responses API's); None when the frame carries none."""
    at = frame.find(_DATA)
    if at < 0:
        return None
    try:
        event = orjson.loads(frame[at + len(_DATA) :])
    except orjson.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None


def asks_afresh(body: dict[str, Any]) -> bool:
    """The request's messages do not end in an assistant turn: a continuation of the
    client's own prefill would be ambiguous."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return False
    last = messages[-1]
    return not (isinstance(last, dict) and last.get("role") == "assistant")
