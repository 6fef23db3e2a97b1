"""The exact cache in Redis, the source of truth, with a breaker so a dead Redis costs nothing.

One command per request: the revocation check and the entry read run as one
server-side script (EVALSHA), and every request's command shares one auto-pipelined
connection (``RedisPipe``). When Redis fails or stalls, the cache steps aside for
``retry_after`` seconds (requests are answered as ``bypass``), drops the connection,
and then tries again: Redis coming back needs no restart.
"""

from __future__ import annotations

import contextlib
import time
from typing import NamedTuple

from redis.exceptions import NoScriptError, RedisError, ResponseError

from prism import REVOKED_KEY, entry_key

from .metrics import Metrics
from .redis_pipe import PreparedCommand, RedisPipe

__all__ = ["Lookup", "RedisCache"]


class Lookup(NamedTuple):  # a tuple: made on every request, and cheaper than a dataclass
    available: bool  # False: Redis was not asked or failed; nothing is known
    revoked: bool = False
    entry: bytes | None = None


UNAVAILABLE = Lookup(available=False)

# KEYS[1] = the revoked set, KEYS[2] = the entry; ARGV[1] = the key id. A missing entry
# comes back as false (nil), which keeps its place in the reply.
_LOOKUP = "return {redis.call('SISMEMBER', KEYS[1], ARGV[1]), redis.call('GET', KEYS[2])}"


_FAILED_OVER = ("READONLY", "MASTERDOWN")


class RedisCache:
    """Every operation is bounded by the pipe's timeout (one timer per connection)."""

    def __init__(self, redis: RedisPipe, metrics: Metrics, retry_after: float = 1.0) -> None:
        self.redis = redis
        self._metrics = metrics
        self._retry_after = retry_after
        self._down_until = 0.0
        self._lookup_script: PreparedCommand | None = None  # EVALSHA sha 2 revoked-set

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, op: str, error: Exception) -> None:
        self._metrics.redis_errors.labels(op).inc()
        self._down_until = time.monotonic() + self._retry_after
        # A broken or stalled connection has already dropped itself. One that reaches a
        # replica after a failover answers READONLY / MASTERDOWN: reconnect to the primary.
        if isinstance(error, ResponseError) and str(error).startswith(_FAILED_OVER):
            self.redis.reset()

    async def lookup(self, key_id: str, fingerprint: str | None) -> Lookup:
        """Is ``key_id`` revoked, and the entry for ``fingerprint`` (when given)."""
        if not self.available:
            return UNAVAILABLE
        try:
            if fingerprint is None:
                member = await self.redis.execute("SISMEMBER", REVOKED_KEY, key_id)
                return Lookup(True, bool(member))
            key = entry_key(fingerprint)
            reply = None
            if self._lookup_script is not None:
                with contextlib.suppress(NoScriptError):  # Redis restarted or was flushed
                    reply = await self.redis.run(self._lookup_script, key, key_id)
            if reply is None:  # first use, or the script is gone: load it
                sha = await self.redis.execute("SCRIPT", "LOAD", _LOOKUP)
                self._lookup_script = PreparedCommand("EVALSHA", sha, 2, REVOKED_KEY)
                reply = await self.redis.run(self._lookup_script, key, key_id)
        except (RedisError, OSError, TimeoutError) as error:
            self._failed("lookup", error)
            return UNAVAILABLE
        return Lookup(True, bool(reply[0]), reply[1] if len(reply) > 1 else None)

    async def store(self, fingerprint: str, data: bytes, ttl: int) -> bool:
        if not self.available:
            return False
        try:
            await self.redis.execute("SET", entry_key(fingerprint), data, "EX", ttl)
        except (RedisError, OSError, TimeoutError) as error:
            self._failed("store", error)
            return False
        return True

    async def ping(self) -> bool:
        """A live check for /healthz; also closes the breaker when Redis is back."""
        try:
            await self.redis.execute("PING")
        except (RedisError, OSError, TimeoutError) as error:
            self._failed("ping", error)
            return False
        self._down_until = 0.0
        return True
