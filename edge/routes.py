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
from .timings import Timings

__all__ = ["ROUTES", "EdgeRoute", "canonical_path"]

# path -> the one method it takes
ROUTES: dict[str, str] = {
    CHAT_PATH: "POST",
    EMBEDDINGS_PATH: "POST",
    MESSAGES_PATH: "POST",
    MODELS_PATH: "GET",
    RESPONSES_PATH: "POST",
}


class EdgeRoute(Protocol):
    """What the handler needs of a route, once the key is verified and not revoked."""

    method: str  # the one method it takes (``ROUTES``)
    key_header: str | None  # a header that may carry the key instead of a bearer token
    error_body: Callable[[PrismError], bytes]  # how its errors look

    async def serve(
        self,
        request: EdgeRequest,
        platform: Platform,
        identity: KeyIdentity,
        timings: Timings,
        request_id: str,
    ) -> EdgeResponse: ...


def canonical_path(path: str) -> str | None:
    """The known route ``path`` names, or None."""
    if path in ROUTES:  # how every well-behaved client spells it: one dict lookup
        return path
    segments: list[str] = []
    for segment in unquote(path).split("/"):
        if segment == "..":
            if segments:
                segments.pop()
        elif segment and segment != ".":
            segments.append(segment)
    candidate = "/" + "/".join(segments)
    return candidate if candidate in ROUTES else None
