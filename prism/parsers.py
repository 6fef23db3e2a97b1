"""Each cached API's body parser, by its path: what the shared vectors (and anything else
that must parse a body of any API the same way in both halves) look up."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from .embeddings_request import parse_embeddings_request
from .fingerprint import ParsedBody
from .messages_request import parse_messages_request
from .request import DEFAULT_LIMITS, Limits, parse_chat_request
from .responses_request import parse_responses_request
from .routes import CHAT_PATH, EMBEDDINGS_PATH, MESSAGES_PATH, RESPONSES_PATH

__all__ = ["PARSERS", "ParsedRequest", "parse_for_path"]


class ParsedRequest(ParsedBody, Protocol):
    """What both halves' cache paths read of any API's parsed request."""

    @property
    def model(self) -> str: ...
    @property
    def stream(self) -> bool: ...


PARSERS: dict[str, Callable[[bytes | str, Limits], ParsedBody]] = {
    CHAT_PATH: parse_chat_request,
    EMBEDDINGS_PATH: parse_embeddings_request,
    MESSAGES_PATH: parse_messages_request,
    RESPONSES_PATH: parse_responses_request,
}


def parse_for_path(path: str, raw: bytes | str, limits: Limits = DEFAULT_LIMITS) -> ParsedBody:
    """``raw`` parsed as the body of the API at ``path`` (a ``KeyError`` for no such API)."""
    return PARSERS[path](raw, limits)
