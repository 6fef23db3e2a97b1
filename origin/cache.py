"""The exact cache in Redis, the source of truth, with a breaker so a dead Redis costs nothing.

One command per request: the revocation check, the entry read and the project's
policy read run as one server-side script (EVALSHA), and every request's command
shares one auto-pipelined connection (``RedisPipe``, or redis-py's pool: any
``RedisClient``). When Redis fails or
stalls, the cache steps aside for ``retry_after`` seconds (requests are answered as
``bypass``), drops the connection, and then tries again: Redis coming back needs no
restart.

Revocation does not fail open with Redis: the revoked set is also kept in memory
(reloaded every ``revoked_refresh`` seconds off the request path, and added to by every
lookup that finds a key revoked) and consulted only while Redis is unavailable.

With a ``reader`` (a replica near this origin, ``PRISM_REDIS_READ_URL``) the lookup runs
there and everything else on the primary. A replica may lag (milliseconds; without end
while its link to the primary is cut), so a replica's "not revoked" is also checked
against that in-memory set, which is read from the primary: a revocation takes effect
within ``revoked_refresh`` at worst, never later. A failing replica is skipped for
``retry_after`` (the lookup goes to the primary meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, NamedTuple

from prism import REVOKED_KEY, AuthenticationError, entry_key, policy_key

from .metrics import Metrics
from .redis_client import NoScriptError, PreparedCommand, RedisClient, RedisClientError

__all__ = ["LOOKUP_SCRIPT", "Lookup", "RedisCache"]

log = logging.getLogger("prism.origin")


class Lookup(NamedTuple):  # a tuple: made on every request, and cheaper than a dataclass
    available: bool  # False: Redis was not asked or failed; only `revoked` is known
    revoked: bool = False
    entry: bytes | None = None
    policy: bytes | None = None  # the project's policy record as stored (None: no policy)


UNAVAILABLE = Lookup(available=False)
REVOKED_WHILE_UNAVAILABLE = Lookup(available=False, revoked=True)

# KEYS[1] = the revoked set, KEYS[2] = the entry, KEYS[3] = the project's policy, either
# "" when not wanted; ARGV[1] = the key id. A missing value comes back as false (nil),
# which keeps its place in the reply. Revoked: nothing else is read.
LOOKUP_SCRIPT = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return {1} end
local entry, policy = false, false
if KEYS[2] ~= '' then entry = redis.call('GET', KEYS[2]) end
if KEYS[3] ~= '' then policy = redis.call('GET', KEYS[3]) end
return {0, entry, policy}
"""


_FAILED_OVER = ("READONLY", "MASTERDOWN")


class RedisCache:
    """Every operation is bounded by the client's timeout."""

    def __init__(
        self,
        redis: RedisClient,
        metrics: Metrics,
        retry_after: float = 1.0,
        revoked_refresh: float = 10.0,
        reader: RedisClient | None = None,
    ) -> None:
        self.redis = redis
        self._reader = reader
        self._reader_down_until = 0.0
        self._metrics = metrics
        self._retry_after = retry_after
        self._down_until = 0.0
        self._lookup_script: PreparedCommand | None = None  # EVALSHA sha 2 revoked-set
        # The revoked key ids last read from Redis, for when Redis cannot be asked.
        self._revoked: set[str] = set()
        self._revoked_refresh = revoked_refresh
        self.revoked_loaded_at: float | None = None  # monotonic time of the last reload
        self._refresher: asyncio.Task[None] | None = None

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, op: str, error: RedisClientError) -> None:
        self._metrics.redis_errors.labels(op).inc()
        self._down_until = time.monotonic() + self._retry_after
        # A broken or stalled connection has already dropped itself. One that reaches a
        # replica after a failover answers READONLY / MASTERDOWN: reconnect to the primary.
        if str(error).startswith(_FAILED_OVER):
            self.redis.reset()

    def _lookup_client(self) -> RedisClient:
        """The replica while it answers, else the primary."""
        if self._reader is not None and time.monotonic() >= self._reader_down_until:
            return self._reader
        return self.redis

    def _unavailable(self, key_id: str) -> Lookup:
        return REVOKED_WHILE_UNAVAILABLE if key_id in self._revoked else UNAVAILABLE

    async def lookup(
        self, key_id: str, fingerprint: str | None, project: str | None = None
    ) -> Lookup:
        """Is ``key_id`` revoked, the entry for ``fingerprint`` and the policy of
        ``project`` (each when given): one command, whatever is asked."""
        if not self.available:
            return self._unavailable(key_id)
        redis = self._lookup_client()
        try:
            if fingerprint is None and project is None:
                reply: Any = (await redis.execute("SISMEMBER", REVOKED_KEY, key_id),)
            else:
                entry = "" if fingerprint is None else entry_key(fingerprint)
                policy = "" if project is None else policy_key(project)
                reply = None
                if self._lookup_script is not None:
                    with contextlib.suppress(NoScriptError):  # Redis restarted or was flushed
                        reply = await redis.run(self._lookup_script, entry, policy, key_id)
                if reply is None:  # first use, or the script is gone: load it
                    sha = await redis.execute("SCRIPT", "LOAD", LOOKUP_SCRIPT)
                    self._lookup_script = PreparedCommand("EVALSHA", sha, 3, REVOKED_KEY)
                    reply = await redis.run(self._lookup_script, entry, policy, key_id)
        except RedisClientError as error:
            if redis is self._reader:  # the primary takes the lookups for a while
                self._metrics.redis_errors.labels("lookup_replica").inc()
                self._reader_down_until = time.monotonic() + self._retry_after
            else:
                self._failed("lookup", error)
            return self._unavailable(key_id)
        if reply[0] or (redis is self._reader and key_id in self._revoked):
            self._revoked.add(key_id)
            return Lookup(True, True)
        if len(reply) < 3:
            return Lookup(True, False)
        return Lookup(True, False, reply[1], reply[2])

    async def refuse_if_revoked(self, key_id: str) -> None:
        """Raise ``key_revoked`` when ``key_id`` is revoked (Redis's answer, or while Redis
        is unavailable, the revoked set last read from it)."""
        if (await self.lookup(key_id, None)).revoked:
            raise AuthenticationError("This API key has been revoked.", code="key_revoked")

    async def store(self, fingerprint: str, data: bytes, ttl: int) -> bool:
        if not self.available:
            return False
        try:
            await self.redis.drain()  # behind requests' lookups when the socket is full
            await self.redis.execute("SET", entry_key(fingerprint), data, "EX", ttl)
        except RedisClientError as error:
            self._failed("store", error)
            return False
        return True

    async def ping(self) -> bool:
        """A live check for /healthz; also closes the breaker when Redis is back."""
        try:
            await self.redis.execute("PING")
        except RedisClientError as error:
            self._failed("ping", error)
            return False
        self._down_until = 0.0
        return True

    async def reload_revoked(self) -> bool:
        """Read the revoked set from Redis into memory; False when Redis is unavailable."""
        if not self.available:
            return False
        try:
            members = await self.redis.execute("SMEMBERS", REVOKED_KEY)
        except RedisClientError as error:
            self._failed("revoked", error)
            return False
        self._revoked = {member.decode() for member in members}
        self.revoked_loaded_at = time.monotonic()
        return True

    async def _reload_revoked_forever(self) -> None:
        while True:
            try:
                loaded = await self.reload_revoked()
            except Exception:  # a bug here must not end the reloads
                log.exception("reloading the revoked key set failed")
                loaded = False
            await asyncio.sleep(self._revoked_refresh if loaded else self._retry_after)

    def start(self) -> None:
        """Load the revoked set now and every ``revoked_refresh`` seconds (sooner again
        after a failure), in the background."""
        if self._refresher is None:
            self._refresher = asyncio.create_task(self._reload_revoked_forever())

    async def close(self) -> None:
        refresher, self._refresher = self._refresher, None
        if refresher is not None:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
