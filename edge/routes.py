"""The API routes the edge serves: a small explicit table, matched after normalising.

Only these reach the origin. A path is percent-decoded once, its duplicate
slashes and ``.``/``..`` segments resolved, and must then equal a route exactly;
the origin is always sent the route's own spelling, never the client's, so no
encoding trick (``/v1/%2e%2e/metrics``) can name anything else there.

Each route is served by an ``EdgeRoute`` (``edge.pipeline.CachedApiRoute`` for the cached
APIs, ``edge.models.ModelsRoute`` for the model list), built once per isolate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol
from urllib.parse import unquote

from prism import KeyIdentity, PrismError
from prism.routes import CHAT_PATH, EMBEDDINGS_PATH, MESSAGES_PATH, MODELS_PATH, RESPONSES_PATH

from .platform import EdgeRequest, EdgeResponse, Platform
from .request_log import RequestNote

__all__ = [
    "ROUTES",
    "STORED_RESPONSES",
    "EdgeRoute",
    "canonical_path",
    "normal_path",
    "stored_response_methods",
    "stored_response_path",
]

# A response a provider keeps (``store: true``): ``/v1/responses/{id}`` (GET, DELETE) and
# its ``input_items`` (GET) and ``cancel`` (POST), all one route, passed to the origin.
STORED_RESPONSES = RESPONSES_PATH + "/"
_STORED = {"": frozenset({"GET", "DELETE"}), "input_items": frozenset({"GET"}),
           "cancel": frozenset({"POST"})}  # fmt: skip
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")

# path -> the methods it takes
ROUTES: dict[str, frozenset[str]] = {
    CHAT_PATH: frozenset({"POST"}),
    EMBEDDINGS_PATH: frozenset({"POST"}),
    MESSAGES_PATH: frozenset({"POST"}),
    MODELS_PATH: frozenset({"GET"}),
    RESPONSES_PATH: frozenset({"POST"}),
    STORED_RESPONSES: frozenset({"GET", "DELETE", "POST"}),
}


class EdgeRoute(Protocol):
    """What the handler needs of a route, once the key is verified and not revoked."""

    methods: frozenset[str]  # the methods it takes (``ROUTES``)
    key_header: str | None  # a header that may carry the key instead of a bearer token
    error_body: Callable[[PrismError], bytes]  # how its errors look

    async def serve(
        self,
        request: EdgeRequest,
        platform: Platform,
        identity: KeyIdentity,
        note: RequestNote,  # the request's id and stages, and what its record needs
    ) -> EdgeResponse: ...


def canonical_path(path: str) -> str | None:
    """The known route ``path`` names, or None."""
    if path in ROUTES and path != STORED_RESPONSES:  # how clients spell it: one lookup
        return path
    candidate = normal_path(path)
    if candidate in ROUTES and candidate != STORED_RESPONSES:
        return candidate
    return STORED_RESPONSES if stored_response_path(candidate) is not None else None


def stored_response_path(path: str) -> str | None:
    """``path`` (already normal) when it names a stored response or a part of one, else None."""
    if not path.startswith(STORED_RESPONSES):
        return None
    ident, _, part = path[len(STORED_RESPONSES) :].partition("/")
    if not (0 < len(ident) <= 200 and _ID_CHARS.issuperset(ident)) or part not in _STORED:
        return None
    return path


def stored_response_methods(path: str) -> frozenset[str]:
    """The methods a stored response's ``path`` (``stored_response_path``'s) takes."""
    return _STORED[path[len(STORED_RESPONSES) :].partition("/")[2]]


def normal_path(path: str) -> str:
    """Percent-decoded once, duplicate slashes and dot segments resolved."""
    segments: list[str] = []
    for segment in unquote(path).split("/"):
        if segment == "..":
            if segments:
                segments.pop()
        elif segment and segment != ".":
            segments.append(segment)
    return "/" + "/".join(segments)
