"""One provider call per question across processes and machines: a short Redis lease per
flight key, and a Redis stream per flight that the other processes follow live.

The first process to miss on a key takes its lease and calls the provider: in the request's
Redis lookup itself (``origin.store.redis_cache.lookup_script``: the miss's one command is
its claim too; ``FlightLeases.taken``, then ``adopt`` by the flight, or ``let_go`` by a
request that will not call after all), else by ``FlightLeases.claim`` (a take-over, a
request whose lookup did not ask); what arrives (the head, each stream frame, then the
answer or the failure) is appended to the flight's stream (``Lease``), in order, by one
writer that sends whatever has queued while its last write was out (no write per frame
under load, no wait when quiet).
A process that misses while the lease is held follows that stream (``FlightLeases.read``)
instead of calling, as its own requests follow an in-process flight
(``origin.routing.shared_call``): in-process coalescing stays the first level, so one
process follows a flight once, however many of its requests asked.

Liveness is the lease's: the leader renews it while its call runs. A follower that hears
nothing for ``CHECK`` asks who holds the lease (``poll``): the same flight, keep waiting;
nobody (the leader died or stalled past the lease) or another flight, the leader is lost,
and the followers race to claim the lease again: one takes over, the others follow it.
An answer that is stored keeps its lease a little longer (``LINGER``), pointing at the
finished stream, so a process whose Redis lookup missed just before the entry landed
follows the finished flight instead of calling again; an answer not stored, and every
failure, releases the lease at once.

Keys: ``prism:flight:{key}`` (the lease: the flight's id; a lookup's ids are ``#`` and the
count ``prism:flight:ids`` keeps) and ``prism:flight:{key}:id`` (its
stream; the braces keep both in one Redis Cluster slot). Each stream entry has one field:
``h`` the head (JSON: x-prism-provider's label, fallback, provider, upstream model),
``f`` a frame, ``u`` the trailing usage frame, ``r`` the answer's body (the end), ``x`` a
failure (the end: not shared as an answer) or ``a`` the call abandoned by its clients (the
end: followers take over).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import redis.asyncio
import redis.exceptions

from ..connection.redis_client import LoadedScript, NoScriptError, RedisClient, RedisClientError

__all__ = ["CHECK", "LINGER", "FlightLeases", "Lease", "lease_ms"]

log = logging.getLogger("prism.origin")

CHECK = 0.5  # seconds a follower waits for news before asking whether the leader holds on
LINGER = 5.0  # seconds a stored answer's lease outlives it, pointing at the finished stream
_STREAM_TTL = 60.0  # seconds a flight's stream outlives its last entry
_READ_COUNT = 512  # entries taken by one read

# -> 1 (the caller holds the lease now), or the id of the flight that holds it (nil: it
# ended between the two commands; claim again).
_CLAIM = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return redis.call('GET', KEYS[1])
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
# Appends (field, value) pairs as entries; then, if the caller still holds the lease, keeps
# it (ARGV[2] = -1), releases it (0) or lets it live that many ms more.
_APPEND = """
for i = 4, #ARGV, 2 do redis.call('XADD', KEYS[1], '*', ARGV[i], ARGV[i + 1]) end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local lease = tonumber(ARGV[2])
if lease >= 0 and redis.call('GET', KEYS[2]) == ARGV[1] then
  if lease == 0 then redis.call('DEL', KEYS[2]) else redis.call('PEXPIRE', KEYS[2], lease) end
end
return 1
"""
# Deletes the lease if the caller still holds it (a lookup's lease let go of).
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# -> {the lease's holder (or nil), the stream's entries after ARGV[1]}: one atomic look, so
# an end appended as the lease was released is seen with it.
_POLL = """
return {redis.call('GET', KEYS[1]), redis.call('XRANGE', KEYS[2], '(' .. ARGV[1], '+')}
"""

Entry = tuple[bytes, bytes, bytes]  # (entry id, field, value)


def lease_ms(lease: float) -> int:
    """A lease of ``lease`` seconds in Redis's milliseconds (at least one)."""
    return max(1, round(lease * 1000))


def _lease_key(key: str) -> str:
    return f"prism:flight:{{{key}}}"


def stream_key(key: str, flight: bytes) -> str:
    return f"prism:flight:{{{key}}}:{flight.decode()}"


class FlightLeases:
    """The Redis side of shared flights, one per process: the lease and stream commands on
    the origin's client, and the blocking reads on a small pool of their own (a blocked read
    would hold up every command behind it on the origin's one pipelined connection)."""

    def __init__(
        self,
        redis_client: RedisClient,
        url: str,
        wait_limit: Callable[[str, bool], float],
        counted: Callable[[str], None],
        *,
        lease: float = 3.0,
        readers: int = 32,
        timeout: float = 0.5,
    ) -> None:
        self._redis = redis_client
        self._url = url
        # Seconds a follower waits for a model's leader's first news: its first-byte limit.
        self.wait_limit = wait_limit
        self.counted = counted  # an outcome: lead, follow, take_over, own
        self.lease_ms = lease_ms(lease)
        self._stream_ms = round(_STREAM_TTL * 1000)
        self.renew_every = lease / 3
        self._readers = readers
        self._timeout = timeout
        self._pool: redis.asyncio.Redis | None = None
        # A flight's id: this process's, then a count (unique, and no syscall per miss).
        self._prefix, self._ids = secrets.token_hex(6), itertools.count()
        self._held: set[Lease] = set()  # leases this process renews
        # Leases taken by requests' lookups, by key, until their flight adopts them.
        self._taken: dict[str, Lease] = {}
        self._renewing: asyncio.Task[None] | None = None
        self._claim = LoadedScript(_CLAIM, 1)
        self._renew = LoadedScript(_RENEW, 1)
        self._append = LoadedScript(_APPEND, 2)
        self._release = LoadedScript(_RELEASE, 1)
        self._releasing: set[asyncio.Future[Any]] = set()
        self._poll = LoadedScript(_POLL, 2)

    async def claim(self, key: str) -> Lease | bytes:
        """The lease for ``key`` (this process leads), or the id of the flight holding it.
        Raises ``RedisClientError`` when Redis cannot say (the caller calls on its own)."""
        for _ in range(3):
            flight = f"{self._prefix}{next(self._ids)}"
            held = await self._claim.run(self._redis, _lease_key(key), flight, self.lease_ms)
            if held == 1:
                lease = Lease(self, key, flight.encode())
                self._hold(lease)
                return lease
            if isinstance(held, bytes):
                return held
        raise RedisClientError("the flight's lease changed hands three times in a row")

    def taken(self, key: str, flight: bytes) -> None:
        """A request's lookup took ``key``'s lease for ``flight``: held (and renewed) for the
        flight that request starts, or the one of this process that starts first."""
        lease = Lease(self, key, flight)
        self._taken[key] = lease
        self._hold(lease)

    def adopt(self, key: str) -> Lease | None:
        """The lease a lookup took for ``key``, now the starting flight's to lead with."""
        return self._taken.pop(key, None)

    def let_go(self, key: str, flight: bytes) -> None:
        """The request whose lookup took ``key``'s lease for ``flight`` will not call (refused,
        answered otherwise, or joined a flight running here): unless a flight adopted it,
        released at once, in the background, so another process's identical request calls
        now rather than when it lapses (a failed release: it lapses)."""
        lease = self._taken.get(key)
        if lease is None or lease.flight != flight:
            return
        del self._taken[key]
        self.release(lease)
        release = asyncio.ensure_future(self._release.run(self._redis, _lease_key(key), flight))
        self._releasing.add(release)
        release.add_done_callback(self._released)

    def _released(self, release: asyncio.Future[Any]) -> None:
        self._releasing.discard(release)
        if not release.cancelled() and release.exception() is not None:
            log.info("a shared flight's lease could not be released: %s", release.exception())

    def _hold(self, lease: Lease) -> None:
        self._held.add(lease)
        if self._renewing is None:
            self._renewing = asyncio.get_running_loop().create_task(self._renew_held())

    async def read(self, key: str, flight: bytes, after: bytes) -> list[Entry]:
        """The flight's entries after ``after``, waiting up to ``CHECK`` for the first."""
        pool = self._pool
        if pool is None:
            pool = self._pool = redis.asyncio.Redis(
                connection_pool=redis.asyncio.BlockingConnectionPool.from_url(
                    self._url,
                    max_connections=self._readers,
                    timeout=self._timeout,
                    socket_connect_timeout=self._timeout,
                    socket_timeout=CHECK + self._timeout,
                )
            )
        name = stream_key(key, flight)
        try:
            reply: Any = await pool.xread(
                {name: after}, count=_READ_COUNT, block=round(CHECK * 1000)
            )
        except (redis.exceptions.RedisError, OSError) as error:
            raise RedisClientError(str(error)) from None
        return [_entry(item) for _, items in reply or () for item in items]

    async def poll(self, key: str, flight: bytes, after: bytes) -> tuple[bytes | None, list[Entry]]:
        """Who holds the lease now, and the flight's entries after ``after``."""
        holder, items = await self._poll.run(
            self._redis, _lease_key(key), stream_key(key, flight), after
        )
        return holder, [_entry(item) for item in items or ()]

    async def close(self) -> None:
        if self._renewing is not None:
            self._renewing.cancel()
        if self._releasing:
            await asyncio.gather(*self._releasing, return_exceptions=True)
        if self._pool is not None:
            with contextlib.suppress(Exception):
                await self._pool.aclose(close_connection_pool=True)
            self._pool = None

    # -- a leader's writes ------------------------------------------------------------

    def append(self, lease: Lease, entries: list[bytes | str], release: int) -> Awaitable[Any]:
        return self._append.start(
            self._redis,
            stream_key(lease.key, lease.flight),
            _lease_key(lease.key),
            lease.flight,
            release,
            self._stream_ms,
            *entries,
        )

    def release(self, lease: Lease) -> None:
        """``lease`` is renewed no more (its flight ended, or its stream failed)."""
        self._held.discard(lease)

    async def _renew_held(self) -> None:
        """Every held lease, renewed each ``renew_every`` (one task for all of them, not a
        timer per miss: most calls end before their first renewal), until none is held."""
        try:
            while self._held:
                await asyncio.sleep(self.renew_every)
                held = list(self._held)
                replies = await asyncio.gather(
                    *(
                        self._renew.start(self._redis, _lease_key(lease.key), lease.flight,
                                          self.lease_ms)
                        for lease in held
                    ),
                    return_exceptions=True,
                )  # fmt: skip
                for lease, reply in zip(held, replies, strict=True):
                    if reply == 0:
                        # Lost (this loop stalled past the lease, and another process took
                        # over): the call goes on for its own clients.
                        self._held.discard(lease)
        finally:
            self._renewing = None


def _entry(item: Any) -> Entry:
    """A stream entry as Redis sends it (``[id, [field, value]]``; redis-py: a dict)."""
    ident, fields = item
    if isinstance(fields, dict):
        ((field, value),) = fields.items()
    else:
        field, value = fields[0], fields[1]
    return ident, field, value


class Lease:
    """A leader's hold on its flight: what it appends, in order (one write out at a time,
    carrying whatever queued meanwhile), renewed by its ``FlightLeases`` while it runs."""

    __slots__ = ("_ended", "_leases", "_linger", "_pending", "_writing", "flight", "key")

    def __init__(self, leases: FlightLeases, key: str, flight: bytes) -> None:
        self._leases = leases
        self.key = key
        self.flight = flight
        self._pending: list[bytes | str] = []  # field, value, field, value...
        self._writing = False
        self._ended = False
        self._linger = False

    def head(self, label: str, fallback: bool, provider: str, model: str) -> None:
        """Queued for the write that carries what follows it (a stream's first events, a
        JSON call's answer): no write, and no wait, of its own."""
        self._pending += ("h", orjson.dumps([label, fallback, provider, model]))

    def frames(self, frames: list[bytes], usage: set[int], start: int) -> None:
        """Append ``frames[start:]`` (``usage``: the indices of usage frames)."""
        pending = self._pending
        for index in range(start, len(frames)):
            pending += ("u" if index in usage else "f", frames[index])
        self._flush()

    def end(self, field: str, value: bytes, linger: bool) -> None:
        """The flight's last entry; the lease is released, or kept ``LINGER`` more."""
        if self._ended:
            return
        self._ended, self._linger = True, linger
        self._leases.release(self)
        self._pending += (field, value)
        self._flush()

    def _flush(self) -> None:
        if self._writing or not self._pending:
            return
        entries, self._pending = self._pending, []
        release = -1  # the lease is kept while the flight runs
        if self._ended:  # the end is in this write
            release = round(LINGER * 1000) if self._linger else 0
        self._send(entries, release, retry=True)

    def _send(self, entries: list[bytes | str], release: int, retry: bool) -> None:
        self._writing = True
        write = asyncio.ensure_future(self._leases.append(self, entries, release))
        write.add_done_callback(functools.partial(self._written, entries, release, retry))

    def _written(
        self, entries: list[bytes | str], release: int, retry: bool, write: asyncio.Future[Any]
    ) -> None:
        self._writing = False
        error = None if write.cancelled() else write.exception()
        if isinstance(error, NoScriptError) and retry:  # Redis restarted: load it, once
            self._send(entries, release, retry=False)
            return
        if error is not None:
            # The followers hear nothing more: they see the lease lapse and take over.
            log.info("a shared flight's stream could not be written: %s", error)
            self._pending.clear()
            self._leases.release(self)
            return
        self._flush()
