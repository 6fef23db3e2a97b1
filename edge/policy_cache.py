"""The edge's view of project policies: one record per project in Workers KV
(``prism:policy:{project}``), read at most once per ``ttl`` per isolate and project."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from prism import Policy, PolicyMemo, policy_key

__all__ = ["PolicyCache"]


class PolicyCache:
    """Memoized per isolate, like the revoked set: a project's policy costs one KV read a
    minute, not one per request. A change reaches a PoP within ``ttl`` seconds plus KV's
    own propagation; the origin enforces it on every request it sees, at once.
    """

    def __init__(self, ttl: float, size: int = 1024) -> None:
        self._ttl = ttl
        self._size = size
        self._items: dict[str, tuple[float, Policy | None]] = {}  # project -> (read at, policy)
        self._parsed = PolicyMemo(size=64)

    async def get(
        self, project: str, now: float, kv_get: Callable[[str], Awaitable[str | None]]
    ) -> Policy | None:
        """The project's policy (None: none set). A failed or invalid read raises after
        keeping the last known policy, so the caller can say so; it is not retried for
        ``ttl`` seconds, and the origin still enforces the policy."""
        item = self._items.get(project)
        if item is not None and now - item[0] < self._ttl:
            return item[1]
        if item is None and len(self._items) >= self._size:
            self._items.clear()
        # Also on failure: a broken KV is not asked again per request.
        self._items[project] = (now, item[1] if item is not None else None)
        raw = await kv_get(policy_key(project))
        policy = self._parsed.get(raw) if raw else None
        self._items[project] = (now, policy)
        return policy

    def fresh(self, project: str, now: float) -> bool:
        """Whether ``get`` would answer from memory (no KV read, nothing to time)."""
        item = self._items.get(project)
        return item is not None and now - item[0] < self._ttl

    def last(self, project: str) -> Policy | None:
        """The last known policy, with no refresh (after a failed one)."""
        item = self._items.get(project)
        return item[1] if item is not None else None
