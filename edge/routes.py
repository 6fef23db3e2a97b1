"""The API routes the edge serves: a small explicit table, matched after normalising.

Only these reach the origin. A path is percent-decoded once, its duplicate
slashes and ``.``/``..`` segments resolved, and must then equal a route exactly;
the origin is always sent the route's own spelling, never the client's, so no
encoding trick (``/v1/%2e%2e/metrics``) can name anything else there.
"""

from __future__ import annotations

from urllib.parse import unquote

from prism.routes import CHAT_PATH, EMBEDDINGS_PATH, MESSAGES_PATH, MODELS_PATH

__all__ = ["ROUTES", "canonical_path"]

# path -> the one method it takes
ROUTES: dict[str, str] = {
    CHAT_PATH: "POST",
    EMBEDDINGS_PATH: "POST",
    MESSAGES_PATH: "POST",
    MODELS_PATH: "GET",
}


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
