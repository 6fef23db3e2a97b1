"""The exact cache in Redis, the source of truth, with a breaker so a dead Redis costs nothing.

One round trip per request: the revocation check and the entry read go in one
pipeline. When Redis fails, the cache steps aside for ``retry_after`` seconds
(requests are answered as ``bypass``) and then tries again: Redis coming back
needs no restart.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from prism import REVOKED_KEY, entry_key

from .metrics import Metrics

__all__ = ["Lookup", "RedisCache"]


@dataclass(frozen=True, slots=True)
class Lookup:
    available: bool  # False: Redis was not asked or failed; nothing is known
    revoked: bool = False
    entry: bytes | None = None


UNAVAILABLE = Lookup(available=False)


class RedisCache:
    def __init__(self, redis: Redis, metrics: Metrics, retry_after: float = 1.0) -> None:
        self.redis = redis
        self._metrics = metrics
        self._retry_after = retry_after
        self._down_until = 0.0

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, op: str) -> None:
        self._metrics.redis_errors.labels(op).inc()
        self._down_until = time.monotonic() + self._retry_after

    async def lookup(self, key_id: str, fingerprint: str | None) -> Lookup:
        """Is ``key_id`` revoked, and the entry for ``fingerprint`` (when given)."""
        if not self.available:
            return UNAVAILABLE
        try:
            if fingerprint is None:
                revoked = await self.redis.sismember(REVOKED_KEY, key_id)
                return Lookup(available=True, revoked=bool(revoked))
            pipe = self.redis.pipeline(transaction=False)
            pipe.sismember(REVOKED_KEY, key_id)
            pipe.get(entry_key(fingerprint))
            revoked, entry = await pipe.execute()
        except (RedisError, OSError):
            self._failed("lookup")
            return UNAVAILABLE
        return Lookup(available=True, revoked=bool(revoked), entry=entry)

    async def store(self, fingerprint: str, data: bytes, ttl: int) -> bool:
        if not self.available:
            return False
        try:
            await self.redis.set(entry_key(fingerprint), data, ex=ttl)
        except (RedisError, OSError):
            self._failed("store")
            return False
        return True

    async def ping(self) -> bool:
        """A live check for /healthz; also closes the breaker when Redis is back."""
        try:
            await self.redis.ping()
        except (RedisError, OSError):
            self._failed("ping")
            return False
        self._down_until = 0.0
        return True
