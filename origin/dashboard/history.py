"""The dashboard's memory: a snapshot of the origin's figures every few seconds, kept an hour.

A background task (started only when the dashboard is on: ``PRISM_ADMIN_KEY``) reads
what already exists, never anything on a request's path:

- the process's counters from its metrics registry (``figures.totals_of``): requests
  by layer, provider calls, the KV writer's queue and sends;
- each provider's health gate (state, error rate, p50/p95 time to first byte);
- each project's usage today from Redis (``prism:usage:{project}:{day}``, written by
  every origin about once a second), summed inside Redis by one script so the reply
  stays small however many keys and models a project has.

Each snapshot is turned into a row of the charts when it is taken (rates and the hit
ratio against the one before), so a page's poll only lays the rows out, once per snapshot
however many pages are open. The rows live in a ring buffer in this process (``size`` of
them: an hour at 5 s); of the snapshots, only the last is kept. A restart starts an
empty history; the day's spend survives it because it is read from Redis.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from ..background import cancel_and_wait
from ..connection.redis_client import RedisClientError
from ..governance.usage import LAYERS as USAGE_LAYERS
from ..governance.usage import usage_key
from .figures import LAYERS, STATES, Totals, rates_between, totals_of

if TYPE_CHECKING:
    from ..gateway import Gateway

__all__ = ["HealthEvent", "History", "ProjectDay", "ProviderPoint", "Snapshot", "provider_point"]

log = logging.getLogger("prism.origin")

PROJECTS_KEY = "prism:projects"  # projects with managed keys (deploy/key_store.py)
MAX_PROJECTS = 100  # read per snapshot: the busiest (by spend) when there are more
MAX_EVENTS = 200

# KEYS = day hashes; returns, per key, [counter, total, counter, total, ...] with the
# key id and model dropped from the field names ("<counter>|<key id>|<model>").
_SUM_SCRIPT = """
local out = {}
for i, key in ipairs(KEYS) do
  local sums, row = {}, {}
  local flat = redis.call('HGETALL', key)
  for j = 1, #flat, 2 do
    local counter = string.match(flat[j], '^[^|]+')
    sums[counter] = (sums[counter] or 0) + tonumber(flat[j + 1])
  end
  for counter, total in pairs(sums) do
    row[#row + 1] = counter
    row[#row + 1] = string.format('%d', total)
  end
  out[i] = row
end
return out
"""


@dataclass(frozen=True, slots=True)
class ProviderPoint:
    state: str
    error_rate: float
    recent_calls: int
    p50_ms: float | None  # time to first byte (streams), else to the whole answer
    p95_ms: float | None
    reason: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ProjectDay:
    """A project's usage so far today (UTC), every origin's, as Redis holds it."""

    requests: Mapping[str, int]  # by usage layer (origin/governance/usage.py LAYERS)
    cost_usd: float
    saved_usd: float
    tokens_in: int
    tokens_out: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": dict(self.requests),
            "cost_usd": self.cost_usd,
            "saved_usd": self.saved_usd,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
        }


@dataclass(frozen=True, slots=True)
class HealthEvent:
    at: float
    provider: str
    old: str
    new: str
    reason: str | None


@dataclass(frozen=True, slots=True)
class Snapshot:
    totals: Totals
    providers: Mapping[str, ProviderPoint]
    projects: Mapping[str, ProjectDay] | None  # None: Redis could not be read
    day: str


def provider_point(snapshot: Mapping[str, Any]) -> ProviderPoint:
    """A point from ``Health.snapshot()`` (also ``/healthz``'s per-provider JSON)."""
    p50 = snapshot.get("ttfb_p50_ms")
    p95 = snapshot.get("ttfb_p95_ms")
    if p50 is None:
        p50, p95 = snapshot.get("latency_p50_ms"), snapshot.get("latency_p95_ms")
    return ProviderPoint(
        state=str(snapshot.get("state", "?")),
        error_rate=float(snapshot.get("error_rate") or 0.0),
        recent_calls=int(snapshot.get("recent_calls") or 0),
        p50_ms=None if p50 is None else float(p50),
        p95_ms=None if p95 is None else float(p95),
        reason=None if snapshot.get("reason") is None else str(snapshot.get("reason")),
    )


def _project_day(flat: Iterable[bytes | str]) -> ProjectDay:
    items = [item.decode() if isinstance(item, bytes) else str(item) for item in flat]
    sums = {items[i]: int(items[i + 1]) for i in range(0, len(items) - 1, 2)}
    return ProjectDay(
        requests={layer: sums.get(f"requests.{layer}", 0) for layer in USAGE_LAYERS},
        cost_usd=sums.get("cost_micros", 0) / 1_000_000,
        saved_usd=sums.get("saved_micros", 0) / 1_000_000,
        tokens_in=sums.get("tokens_in", 0),
        tokens_out=sums.get("tokens_out", 0),
    )


class History:
    def __init__(
        self,
        gateway: Gateway,
        interval: float = 5.0,
        size: int = 720,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._gateway = gateway
        self.interval = interval
        self._clock = clock
        self.last: Snapshot | None = None  # the rates, events and names go from it
        self.rows: deque[_Row] = deque(maxlen=size)  # each snapshot as the charts plot it
        self.events: deque[HealthEvent] = deque(maxlen=MAX_EVENTS)
        self._task: asyncio.Task[None] | None = None
        self._series: bytes | None = None  # series() as JSON until the next snapshot

    async def sample(self) -> Snapshot:
        """Take one snapshot now and keep it."""
        gateway = self._gateway
        now = self._clock()
        totals = totals_of(gateway.metrics.registry.collect(), now)
        health = gateway.router.health
        providers = {name: provider_point(gate.snapshot()) for name, gate in health.items()}
        day = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d")
        projects = await self._projects(day, totals.cost_usd)
        last = self.last
        if last is not None:
            for name, point in providers.items():
                old = last.providers.get(name)
                if old is not None and old.state != point.state:
                    self.events.append(HealthEvent(now, name, old.state, point.state, point.reason))
        snapshot = Snapshot(totals, providers, projects, day)
        self.rows.append(_row(last, snapshot))
        self.last = snapshot
        self._series = None
        return snapshot

    async def _projects(self, day: str, seen: Mapping[str, float]) -> dict[str, ProjectDay] | None:
        gateway = self._gateway
        if not gateway.cache.available:
            return None
        redis = gateway.redis
        try:
            members = await redis.execute("SMEMBERS", PROJECTS_KEY)
            names = {m.decode() if isinstance(m, bytes) else str(m) for m in members or ()}
            names.update(seen)
            if self.last is not None and self.last.projects:
                names.update(self.last.projects)  # seen by other origins earlier today
            ordered = sorted(names, key=lambda name: (-seen.get(name, 0.0), name))
            ordered = sorted(ordered[:MAX_PROJECTS])
            if not ordered:
                return {}
            keys = [usage_key(name, day) for name in ordered]
            await redis.drain()  # queue behind no backlog of our own
            rows = await redis.execute("EVAL", _SUM_SCRIPT, len(keys), *keys)
        except RedisClientError as error:
            log.warning("dashboard: usage not read from Redis: %s", error)
            return None
        return {
            name: _project_day(row)
            for name, row in zip(ordered, rows, strict=True)
            if row  # no usage today: not shown
        }

    async def _sample_forever(self) -> None:
        while True:
            try:
                await self.sample()
            except Exception:  # a bug here must not end the sampling
                log.exception("dashboard sample failed unexpectedly")
            await asyncio.sleep(self.interval)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._sample_forever(), name="prism-dashboard")

    def latest(self) -> dict[str, Any] | None:
        """The last snapshot alone (``prism top`` reads it every refresh)."""
        return _latest(self.last) if self.last is not None else None

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    # -- what the page reads ------------------------------------------------------------

    def series_json(self) -> bytes:
        """``series()`` as JSON, made once per snapshot however many pages poll it."""
        if self._series is None:
            self._series = orjson.dumps(self.series())
        return self._series

    def series(self) -> dict[str, Any]:
        """Every figure as a column over the snapshots' times (rates: null at the first
        point, which has nothing before it), the health events and the latest state.
        Each point's row was worked out when it was sampled: this only lays them out."""
        rows = list(self.rows)
        providers = sorted({name for row in rows for name in row.providers})
        projects = sorted({name for row in rows for name in row.projects})
        return {
            "interval": self.interval,
            "layers": list(LAYERS),
            "states": list(STATES),
            "t": [row.at for row in rows],
            "requests": {
                layer: [row.requests.get(layer) if row.requests else None for row in rows]
                for layer in LAYERS
            },
            "hit_ratio": [row.hit_ratio for row in rows],
            "server_errors": [row.server_errors for row in rows],
            "kv": {
                "queued": [row.kv_queued for row in rows],
                "sent": [row.kv_sent for row in rows],
                "dropped": [row.kv_dropped for row in rows],
            },
            "providers": {
                name: {
                    field: [row.providers.get(name, _NO_PROVIDER)[index] for row in rows]
                    for index, field in enumerate(("state", "p50_ms", "p95_ms", "error_rate"))
                }
                for name in providers
            },
            "projects": {
                name: {
                    field: [row.projects.get(name, row.no_project)[index] for row in rows]
                    for index, field in enumerate(("spend_usd", "requests_per_s"))
                }
                for name in projects
            },
            "events": [
                {"at": e.at, "provider": e.provider, "from": e.old, "to": e.new, "reason": e.reason}
                for e in self.events
            ],
            "latest": self.latest(),
        }


_NO_PROVIDER: tuple[None, None, None, None] = (None, None, None, None)


@dataclass(frozen=True, slots=True)
class _Row:
    """One point of every chart: rates against the snapshot before it (None: none)."""

    at: float
    requests: Mapping[str, float] | None
    hit_ratio: float | None
    server_errors: float | None
    kv_queued: float
    kv_sent: float | None
    kv_dropped: float | None
    # name -> (state index, p50 ms, p95 ms, error rate)
    providers: Mapping[str, tuple[int | None, float | None, float | None, float]]
    # name -> (spend today USD, requests a second, every origin's); and for a project not
    # in this read: 0 spent when Redis was read, unknown when it was not
    projects: Mapping[str, tuple[float | None, float | None]]
    no_project: tuple[float | None, None]


def _row(before: Snapshot | None, point: Snapshot) -> _Row:
    totals = point.totals
    rates = rates_between(before.totals, totals) if before is not None else None
    providers = {
        name: (
            STATES.index(p.state) if p.state in STATES else None,
            p.p50_ms,
            p.p95_ms,
            p.error_rate,
        )
        for name, p in point.providers.items()
    }
    projects: dict[str, tuple[float | None, float | None]] = {}
    if point.projects is not None:
        # A rate needs two reads of the same day: none across a failed read or midnight.
        earlier = None
        if before is not None and before.projects is not None and before.day == point.day:
            earlier = before.projects
        seconds = totals.at - before.totals.at if before is not None else 0.0
        for name, today in point.projects.items():
            rate = None
            if earlier is not None and seconds > 0:
                was = earlier.get(name)
                count = sum(today.requests.values()) - (sum(was.requests.values()) if was else 0)
                rate = max(count, 0) / seconds
            projects[name] = (today.cost_usd, rate)
    return _Row(
        at=round(totals.at, 3),
        requests=None if rates is None else rates.requests,
        hit_ratio=None if rates is None else rates.hit_ratio,
        server_errors=None if rates is None else rates.server_errors,
        kv_queued=totals.kv_queued,
        kv_sent=None if rates is None else rates.kv_sent,
        kv_dropped=None if rates is None else rates.kv_dropped,
        providers=providers,
        projects=projects,
        no_project=(None, None) if point.projects is None else (0.0, None),
    )


def _latest(point: Snapshot) -> dict[str, Any]:
    totals = point.totals
    return {
        "at": totals.at,
        "day": point.day,
        "requests": dict(totals.requests),
        "hit_ratio": totals.hit_ratio,
        "kv": {
            "queued": totals.kv_queued,
            "in_flight": totals.kv_in_flight,
            "sent": totals.kv_sent,
            "dropped": totals.kv_dropped,
        },
        "providers": {name: p.as_dict() for name, p in point.providers.items()},
        "projects": None
        if point.projects is None
        else {name: day.as_dict() for name, day in point.projects.items()},
    }
