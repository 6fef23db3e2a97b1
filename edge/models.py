"""``GET /v1/models`` at the PoP: the list the origin publishes to Workers KV, filtered by
the project's model policy, with no trip to the origin.

The list is read at most once per ``ttl`` per isolate, like the revoked set; while KV
has none (an origin without KV replication, or not yet published) or cannot be read,
the request is forwarded to the origin as before.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from prism import Policy
from prism import headers as h
from prism.routes import MODELS_KEY

from .platform import EdgeResponse

__all__ = ["ModelList", "models_response"]

_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


class ModelList:
    """The origin's published model list, memoized per isolate, rendered once per policy."""

    def __init__(self, ttl: float) -> None:
        self._ttl = ttl
        self._fetched_at = float("-inf")
        self._raw: str | None = None
        self._entries: list[dict[str, Any]] = []
        self._bodies: dict[Policy | None, bytes] = {}

    async def _refresh(self, now: float, kv_get: Callable[[str], Awaitable[str | None]]) -> None:
        self._fetched_at = now  # also on failure: a broken KV is not asked again per request
        raw = await kv_get(MODELS_KEY)
        if raw == self._raw:
            return
        entries: list[dict[str, Any]] = []
        if raw:
            data = json.loads(raw)
            listed = data.get("data") if isinstance(data, dict) else None
            if not isinstance(listed, list):
                raise ValueError("the published model list is not an OpenAI model list")
            entries = [e for e in listed if isinstance(e, dict) and isinstance(e.get("id"), str)]
        self._raw, self._entries, self._bodies = raw, entries, {}

    async def body(
        self,
        now: float,
        kv_get: Callable[[str], Awaitable[str | None]],
        policy: Policy | None,
    ) -> bytes | None:
        """The list as ``policy`` allows it, or None when KV has no list (or a refresh
        failed before any was read): then the origin answers."""
        if now - self._fetched_at >= self._ttl:
            await self._refresh(now, kv_get)
        if self._raw is None:
            return None
        body = self._bodies.get(policy)
        if body is None:
            allowed = [e for e in self._entries if policy is None or policy.allows(e["id"])]
            if len(self._bodies) >= 64:
                self._bodies.clear()
            body = self._bodies[policy] = _ENCODE({"object": "list", "data": allowed}).encode()
        return body


def models_response(body: bytes) -> EdgeResponse:
    return EdgeResponse(200, {"content-type": "application/json", h.CACHE_LAYER: "kv"}, body)
