"""The edge's view of revoked keys: a JSON list in Workers KV, read at most once a minute."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from prism import REVOKED_KEY

__all__ = ["RevocationSet"]


class RevocationSet:
    """Memoized per isolate, so revocation costs one KV read a minute, not one per request.

    A revoked key keeps working at a PoP for at most ``ttl`` seconds (plus KV's own
    propagation delay); the origin checks Redis on every request it sees.
    """

    def __init__(self, ttl: float) -> None:
        self._ttl = ttl
        self._ids: frozenset[str] = frozenset()
        self._fetched_at = float("-inf")

    async def contains(
        self, key_id: str, now: float, kv_get: Callable[[str], Awaitable[str | None]]
    ) -> bool:
        """Whether ``key_id`` is revoked; a failed refresh raises after keeping the last
        known set, so the caller can say so (it is not retried for ``ttl`` seconds)."""
        if now - self._fetched_at >= self._ttl:
            self._fetched_at = now  # also on failure: a broken KV is not retried per request
            raw = await kv_get(REVOKED_KEY)
            ids = json.loads(raw) if raw else []
            if not isinstance(ids, list):
                raise ValueError("the revoked-key record is not a JSON list")
            self._ids = frozenset(str(i) for i in ids)
        return key_id in self._ids

    def __contains__(self, key_id: str) -> bool:
        """The last known answer, with no refresh (after a failed one)."""
        return key_id in self._ids
