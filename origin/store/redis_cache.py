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
``retry_after`` (the lookup goes to the primary meanwhile). A project's request rate
limits are checked on the primary, whose state they change: in the lookup itself when
it runs there, else in a second command to the primary when the replica's lookup says
the project has limits and the request has no leased permit; a lease asked for ahead
of need goes to the primary in the background, the request it rides on having its
permit already (``origin.governance.rate_limiter``, ``origin.governance.request_leases``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from prism import POLICY_KEY_PREFIX, REVOKED_KEY, AuthenticationError, entry_key

from ..background import cancel_and_wait
from ..connection.redis_client import LoadedScript, RedisClient, RedisClientError
from ..governance.rate_limit_scripts import RATE_CHECK_SCRIPT, REQUEST_LIMIT_LUA
from ..governance.request_leases import ProjectLeases, RequestLeases
from ..metrics import Metrics

__all__ = ["LOOKUP_SCRIPT", "Lookup", "RedisCache", "lookup_script"]

log = logging.getLogger("prism.origin")


class Lookup:
    """What one lookup found. A plain class: made on every request, and compiled its
    ``__init__`` is native code (a NamedTuple's ``__new__`` is generated Python)."""

    __slots__ = ("available", "entry", "flight", "leads", "policy", "rate", "revoked")

    def __init__(
        self,
        available: bool,  # False: Redis was not asked or failed; only `revoked` is known
        revoked: bool = False,
        entry: bytes | None = None,
        policy: bytes | None = None,  # the project's policy record as stored (None: no policy)
        # The request rate limit's verdict when one applies: [admitted, limit, remaining,
        # reset_ms, retry_ms, scope, ...] (origin.governance.rate_limit_scripts); refused:
        # no entry was read.
        rate: list[int] | None = None,
        # A miss asked for its flight's lease: the id of the flight holding it, and whether
        # this lookup took it (``leads``: the request's flight calls the provider).
        flight: bytes | None = None,
        leads: bool = False,
    ) -> None:
        self.available = available
        self.revoked = revoked
        self.entry = entry
        self.policy = policy
        self.rate = rate
        self.flight = flight
        self.leads = leads

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Lookup):
            return NotImplemented
        return (
            self.available,
            self.revoked,
            self.entry,
            self.policy,
            self.rate,
            self.flight,
            self.leads,
        ) == (
            other.available,
            other.revoked,
            other.entry,
            other.policy,
            other.rate,
            other.flight,
            other.leads,
        )

    __hash__ = None  # type: ignore[assignment]  # equal by value, and mutable


UNAVAILABLE = Lookup(available=False)
REVOKED_WHILE_UNAVAILABLE = Lookup(available=False, revoked=True)

# KEYS[1] = the revoked set, KEYS[2] = the entry, KEYS[3] = the project's policy, either
# "" when not wanted; ARGV[1] = the key id; ARGV[2] = a number N >= 1 to check the
# request against the project's request rate limits, taking up to N permits
# (``origin.governance.request_leases``), -N to take them for later (the request itself is admitted
# by a permit leased earlier, so its entry is read whatever the verdict), "r" (on a
# replica, which cannot write) only to say whether it has any (reply {..., 2}), "0"
# neither. A missing value comes back as false (nil), which keeps its place in the
# reply. Revoked: nothing else is read. The rate limit check runs only when the policy
# record sets rate limits; a refused request reads no entry. The limits' hash is named
# inside the script, from the project (a single Redis, not a cluster).
#
# With shared flights (``lookup_script(lease_ms)``), an entry read and missing also takes its
# flight's lease (``origin.routing.flight_lease``: the key named from the entry's, the id a
# counter's) or names who holds it: the reply's first element is then 2 (taken) or 3 (held),
# and the entry's place holds the flight's id. A miss's one command is its claim as well.
_ENTRY_READ = "entry = redis.call('GET', KEYS[2])"
_LEASE_LUA = """
local function lease()
  local key = 'prism:flight:{{' .. string.sub(KEYS[2], {start}) .. '}}'
  local holder = redis.call('GET', key)
  if holder then return 3, holder end
  local flight = '#' .. redis.call('INCR', 'prism:flight:ids')
  redis.call('SET', key, flight, 'PX', {lease_ms})
  return 2, flight
end
"""


def lookup_script(lease_ms: int = 0) -> str:
    """The lookup script; with ``lease_ms``, taking a miss's flight lease for that long."""
    read, head, lease = _ENTRY_READ, "0", ""
    if lease_ms:
        read += " if not entry then head, entry = lease() end"
        head = "head"
        lease = _LEASE_LUA.format(start=len(entry_key("")) + 1, lease_ms=lease_ms)
        lease += "local head = 0\n"
    return f"""{lease}
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return {{1}} end
local entry, policy, rate, ahead = false, false, nil, false
if KEYS[3] ~= '' then
  policy = redis.call('GET', KEYS[3])
  if ARGV[2] ~= '0' and policy and string.find(policy, '"rate_limits":', 1, true) then
    if ARGV[2] == 'r' then
      rate = {{2}}
    else
      local project, want = string.sub(KEYS[3], {len(POLICY_KEY_PREFIX) + 1}), tonumber(ARGV[2])
      if want < 0 then ahead, want = true, -want end
{REQUEST_LIMIT_LUA}
    end
  end
end
if rate then
  if (rate[1] ~= 0 or ahead) and KEYS[2] ~= '' then {read} end
  return {{{head}, entry, policy, unpack(rate)}}
end
if KEYS[2] ~= '' then {read} end
return {{{head}, entry, policy}}
"""


LOOKUP_SCRIPT = lookup_script()


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
        flight_lease_ms: int = 0,
    ) -> None:
        self.redis = redis
        self._reader = reader
        self._reader_down_until = 0.0
        self._metrics = metrics
        self._retry_after = retry_after
        self._down_until = 0.0
        # A miss takes its flight's lease in the lookup (``flight_lease_ms``: shared flights
        # are on), unless a replica may answer: it cannot write (the flight claims instead).
        leasing = flight_lease_ms if reader is None else 0
        self._lookup_script = LoadedScript(lookup_script(leasing), 3, REVOKED_KEY)
        self._rate_check = LoadedScript(RATE_CHECK_SCRIPT)  # on the primary, after a replica
        self.leases = RequestLeases()
        # The revoked key ids last read from Redis, for when Redis cannot be asked.
        self._revoked: set[str] = set()
        self._revoked_refresh = revoked_refresh
        self.revoked_loaded_at: float | None = None  # monotonic time of the last reload
        self._refresher: asyncio.Task[None] | None = None
        self._asking: set[asyncio.Task[None]] = set()  # leases asked of the primary ahead

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
        self,
        key_id: str,
        fingerprint: str | None,
        project: str | None = None,
        count: bool = False,
    ) -> Lookup:
        """Is ``key_id`` revoked, the entry for ``fingerprint`` and the policy of
        ``project`` (each when given), and with ``count``, the request checked against
        the project's request rate limits: one command, whatever is asked (two when a
        replica answers for a project with rate limits)."""
        if not self.available:
            return self._unavailable(key_id)
        redis = self._lookup_client()
        # A permit this process leased earlier spares the script its rate check.
        held: ProjectLeases | None = None
        leased: list[int] | None = None
        want, asks = 0, False
        counted = "0"
        if count:
            held = self.leases.by_project.get(project) if project is not None else None
            if held is None:  # never limited here: the script says whether it is
                want, asks = 1, True
            else:
                leased, want, asks = held.take(key_id)
            if want and redis is not self._reader:
                counted = str(want if leased is None else -want)  # negative: for later
            elif want and leased is None:
                counted = "r"  # the replica says whether a check is due; the primary checks
            elif want and held is not None and project is not None:
                # A lease asked ahead of need: this request's permit came from its lease, so
                # it does not wait for the primary's round trip; the ask goes on without it.
                self._ask_ahead(project, key_id, want, held)
                want, asks = 0, False
        try:
            if fingerprint is None and project is None:
                reply: Any = (await redis.execute("SISMEMBER", REVOKED_KEY, key_id),)
            else:
                entry = "" if fingerprint is None else entry_key(fingerprint)
                # policy_key's concatenation, inline: prism.policy is not compiled, and a
                # call into it per hit cost more than the key.
                policy = "" if project is None else POLICY_KEY_PREFIX + project
                reply = await self._lookup_script.run(redis, entry, policy, key_id, counted)
        except RedisClientError as error:
            if redis is self._reader:  # the primary takes the lookups for a while
                self._metrics.redis_errors.labels("lookup_replica").inc()
                self._reader_down_until = time.monotonic() + self._retry_after
            else:
                self._failed("lookup", error)
            return self._unavailable(key_id)
        else:
            flight: bytes | None = None
            leads = False
            head = reply[0]
            if head == 1 or (redis is self._reader and key_id in self._revoked):
                self._revoked.add(key_id)
                return Lookup(True, True)
            if head:  # a miss, with its flight's lease (2: taken) or its holder (3)
                flight, leads, reply[1] = reply[1], head == 2, None
            if len(reply) < 3:
                return Lookup(True, False)
            if project is None:
                return Lookup(True, False, reply[1], reply[2], None, flight, leads)
            # Leased under a policy that has changed since: the new one decides.
            void = held is not None and reply[2] != held.policy
            if len(reply) > 3:
                rate = reply[3:] if reply[3] != 2 else await self._check_rate(project, key_id, want)
            elif void:
                rate, asks = await self._check_rate(project, key_id, 1), True
            else:
                return Lookup(True, False, reply[1], reply[2], leased, flight, leads)
            if rate is None:  # no request limit applies (or the primary could not say)
                self.leases.by_project.pop(project, None)
                return Lookup(True, False, reply[1], reply[2], None, flight, leads)
            if asks or void:
                spent = leased is None or void  # else its permit came from the lease
                left = self.leases.record(project, key_id, rate, reply[2], spent, asks)
                if spent and left:  # its header counts the permits the process holds too
                    rate[2] = min(rate[2] + left, rate[1])
            if leased is not None and not void:  # admitted by its lease; that ask was ahead
                return Lookup(True, False, reply[1], reply[2], leased, flight, leads)
            return Lookup(True, False, reply[1] if rate[0] else None, reply[2], rate, flight, leads)
        finally:
            if asks and held is not None:  # the ask ends, recorded or not: another may ask
                held.unask(key_id)

    async def _check_rate(self, project: str, key_id: str, want: int) -> list[int] | None:
        """The request rate limit's verdict from the primary, taking up to ``want`` permits
        (None: no limit applies, or the primary failed: no limits without Redis)."""
        try:
            rate: list[int] = await self._rate_check.run(self.redis, key_id, project, str(want))
        except RedisClientError as error:
            self._failed("rate_limit", error)
            return None
        return rate or None

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

    async def replica_status(self) -> dict[str, object] | None:
        """How far the replica this origin reads is behind its primary (None: no replica):
        its link, the bytes of the primary's replication stream it has yet to apply (the
        two offsets are read one after the other, so a busy primary shows some bytes),
        and the seconds since it last heard from the primary (which pings it every 10 s)."""
        if self._reader is None:
            return None
        try:
            replica = _info(await self._reader.execute("INFO", "replication"))
            primary = _info(await self.redis.execute("INFO", "replication"))
        except RedisClientError as error:
            return {"ok": False, "error": type(error).__name__}
        applied, sent = replica.get("slave_repl_offset"), primary.get("master_repl_offset")
        link = replica.get("master_link_status", "")
        return {
            "ok": link == "up",
            "link": link or "not a replica",
            "lag_bytes": max(int(sent) - int(applied), 0) if applied and sent else None,
            "last_io_seconds_ago": int(replica.get("master_last_io_seconds_ago", -1)),
        }

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

    def _ask_ahead(self, project: str, key_id: str, want: int, held: ProjectLeases) -> None:
        task = asyncio.ensure_future(self._ask_primary(project, key_id, want, held))
        self._asking.add(task)
        task.add_done_callback(self._asking.discard)

    async def _ask_primary(self, project: str, key_id: str, want: int, held: ProjectLeases) -> None:
        """The next lease from the primary, for a key whose lookups a replica answers."""
        recorded = False
        try:
            rate = await self._check_rate(project, key_id, want)
            # Kept only while the policy it was asked under still holds (a new one voids
            # every lease: the one asked here is then left unspent).
            if rate is not None and self.leases.by_project.get(project) is held:
                self.leases.record(project, key_id, rate, held.policy, False, True)
                recorded = True
        finally:
            if not recorded:
                held.unask(key_id)

    async def close(self) -> None:
        refresher, self._refresher = self._refresher, None
        await cancel_and_wait(refresher)
        for task in list(self._asking):
            await cancel_and_wait(task)


def _info(reply: bytes | str) -> dict[str, str]:
    """An ``INFO`` reply's ``name:value`` lines."""
    text = reply.decode() if isinstance(reply, bytes) else reply
    return dict(
        line.split(":", 1) for line in text.splitlines() if ":" in line and not line.startswith("#")
    )
