"""The dashboard's memory: a snapshot of the origin's figures every few seconds, kept an hour.

A background task (started only when the dashboard is on: ``PRISM_ADMIN_KEY``) reads
what already exists, never anything on a request's path:

- the process's counters from its metrics registry (``figures.totals_of``): requests
  by layer, provider calls, the KV writer's queue and sends;
- each provider's health gate (state, error rate, p50/p95 time to first byte);
- each project's usage today from Redis (``prism:usage:{project}:{day}``, written by
  every origin about once a second), summed inside Redis by one script so the reply
  stays small however many keys and models a project has.

Snapshots live in a ring buffer in this process (``size`` of them: an hour at 5 s).
Rates and the hit ratio are worked out when the page asks (``series``), from
consecutive snapshots. A restart starts an empty history; the day's spend survives it
because it is read from Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..redis_client import RedisClientError
from ..usage import usage_key
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


@dataclass(frozen=True, slots=True)
class ProjectDay:
    """A project's usage so far today (UTC), every origin's, as Redis holds it."""

    requests: Mapping[str, int]  # redis, miss, bypass, coalesced
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
        requests={
            layer: sums.get(f"requests.{layer}", 0)
            for layer in ("redis", "miss", "bypass", "coalesced")
        },
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
        self.points: deque[Snapshot] = deque(maxlen=size)
        self.events: deque[HealthEvent] = deque(maxlen=MAX_EVENTS)
        self._task: asyncio.Task[None] | None = None

    async def sample(self) -> Snapshot:
        """Take one snapshot now and keep it."""
        gateway = self._gateway
        now = self._clock()
        totals = totals_of(gateway.metrics.registry.collect(), now)
        health = gateway.router.health
        providers = {name: provider_point(gate.snapshot()) for name, gate in health.items()}
        day = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d")
        projects = await self._projects(day, totals.cost_usd)
        if self.points:
            before = self.points[-1].providers
            for name, point in providers.items():
                old = before.get(name)
                if old is not None and old.state != point.state:
                    self.events.append(HealthEvent(now, name, old.state, point.state, point.reason))
        snapshot = Snapshot(totals, providers, projects, day)
        self.points.append(snapshot)
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
            if self.points and self.points[-1].projects:
                names.update(self.points[-1].projects)  # seen by other origins earlier today
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

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- what the page reads ------------------------------------------------------------

    def latest(self) -> dict[str, Any] | None:
        """The last snapshot alone (``prism top`` reads it every refresh)."""
        return _latest(self.points[-1]) if self.points else None

    def series(self) -> dict[str, Any]:
        """Every figure as a column over the snapshots' times (rates: null at the first
        point, which has nothing before it), the health events and the latest state."""
        points = list(self.points)
        times = [round(p.totals.at, 3) for p in points]
        requests: dict[str, list[float | None]] = {layer: [] for layer in LAYERS}
        hit_ratio: list[float | None] = []
        errors: list[float | None] = []
        kv_sent: list[float | None] = []
        kv_dropped: list[float | None] = []
        previous: Snapshot | None = None
        for point in points:
            rates = rates_between(previous.totals, point.totals) if previous else None
            for layer in LAYERS:
                requests[layer].append(None if rates is None else rates.requests.get(layer, 0.0))
            hit_ratio.append(None if rates is None else rates.hit_ratio)
            errors.append(None if rates is None else rates.server_errors)
            kv_sent.append(None if rates is None else rates.kv_sent)
            kv_dropped.append(None if rates is None else rates.kv_dropped)
            previous = point
        return {
            "interval": self.interval,
            "layers": list(LAYERS),
            "states": list(STATES),
            "t": times,
            "requests": requests,
            "hit_ratio": hit_ratio,
            "server_errors": errors,
            "kv": {
                "queued": [p.totals.kv_queued for p in points],
                "sent": kv_sent,
                "dropped": kv_dropped,
            },
            "providers": _provider_series(points),
            "projects": _project_series(points),
            "events": [
                {"at": e.at, "provider": e.provider, "from": e.old, "to": e.new, "reason": e.reason}
                for e in self.events
            ],
            "latest": _latest(points[-1]) if points else None,
        }


def _provider_series(points: list[Snapshot]) -> dict[str, dict[str, list[Any]]]:
    names = sorted({name for p in points for name in p.providers})
    series: dict[str, dict[str, list[Any]]] = {}
    for name in names:
        column: dict[str, list[Any]] = {"state": [], "p50_ms": [], "p95_ms": [], "error_rate": []}
        for p in points:
            point = p.providers.get(name)
            state = STATES.index(point.state) if point and point.state in STATES else None
            column["state"].append(state)
            column["p50_ms"].append(point.p50_ms if point else None)
            column["p95_ms"].append(point.p95_ms if point else None)
            column["error_rate"].append(point.error_rate if point else None)
        series[name] = column
    return series


def _project_series(points: list[Snapshot]) -> dict[str, dict[str, list[Any]]]:
    """Per project: spend today (USD) at each point, and requests a second between points
    (from the day's counts, so every origin's; null across a missing read or midnight)."""
    names = sorted({name for p in points for name in (p.projects or {})})
    series: dict[str, dict[str, list[Any]]] = {}
    for name in names:
        spend: list[float | None] = []
        rate: list[float | None] = []
        previous: Snapshot | None = None
        for p in points:
            today = (p.projects or {}).get(name) if p.projects is not None else None
            spend.append(None if p.projects is None else (today.cost_usd if today else 0.0))
            before = (previous.projects or {}).get(name) if previous is not None else None
            # A rate needs two reads of the same day: none across a failed read or midnight.
            unread = previous is None or previous.projects is None or p.projects is None
            if unread or previous is None or previous.day != p.day:
                rate.append(None)
            else:
                count = sum(today.requests.values()) if today else 0
                was = sum(before.requests.values()) if before else 0
                seconds = p.totals.at - previous.totals.at
                rate.append(max(count - was, 0) / seconds if seconds > 0 else None)
            previous = p
        series[name] = {"spend_usd": spend, "requests_per_s": rate}
    return series


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
        "providers": {
            name: {
                "state": p.state,
                "error_rate": p.error_rate,
                "recent_calls": p.recent_calls,
                "p50_ms": p.p50_ms,
                "p95_ms": p.p95_ms,
                "reason": p.reason,
            }
            for name, p in point.providers.items()
        },
        "projects": None
        if point.projects is None
        else {name: day.as_dict() for name, day in point.projects.items()},
    }
