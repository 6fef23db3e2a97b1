"""Usage per project, key, model and UTC day: counted in memory, written to Redis in bulk.

Every answered request adds to counters in memory (no Redis command on any request's
path); every ``interval`` (1 s) and at shutdown one script writes them all (HINCRBY into
one hash per project and day, with an expiry). A process that crashes loses at most the
counts of its last interval; a flush that fails is dropped rather than retried, so a
write that did land is never counted twice (while Redis is unavailable, counts wait).

Redis::

    prism:usage:<project>:<YYYY-MM-DD>   hash, fields "<counter>|<key id>|<model>":
        requests.redis | requests.semantic | requests.miss | requests.bypass
        | requests.coalesced | requests.kv
        tokens_in, tokens_out   as the provider reported them (prompt, completion)
        cost_micros             what the provider charged, integer micro-USD
        saved_micros            what cache hits would have cost (their entry's usage)
        unpriced                answered calls whose cost is unknown (model has no price)

Layers: ``redis`` and ``semantic`` are hits (an exact one, and a paraphrase answered from
the semantic cache; days written before ``semantic`` was counted apart have no such field
and counted those hits as ``redis``); ``kv`` hits are answered at the edge, which sends
their records to the origin after the response (``origin/apis/edge_records.py``), and
count when those arrive (earlier days have none); ``coalesced`` requests rode on another request's
provider call (that request's key pays for it, see ``origin/governance/billing.py``). ``/metrics``
exports this process's totals by project and model (``prism_usage_*``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from ..background import cancel_and_wait
from ..connection.redis_client import RedisClient, RedisClientError
from ..providers.token_counts import Tokens

__all__ = ["FIELDS", "LAYERS", "USAGE_SCRIPT", "UsageRecorder", "usage_key"]

log = logging.getLogger("prism.origin")

LAYERS = ("redis", "semantic", "miss", "bypass", "coalesced", "kv")
# One slot per counter, in this order, in the in-memory rows and the hash fields.
FIELDS = (
    *(f"requests.{layer}" for layer in LAYERS),
    "tokens_in",
    "tokens_out",
    "cost_micros",
    "saved_micros",
    "unpriced",
)
_LAYER = {layer: index for index, layer in enumerate(LAYERS)}
_IN, _OUT, _COST, _SAVED, _UNPRICED = range(len(LAYERS), len(FIELDS))
RETENTION_SECONDS = 400 * 86_400  # a year of days, and a month to spare
_MAX_ROWS = 100_000  # pending rows while Redis is away: beyond it, new rows are dropped

# KEYS = the day hashes; ARGV[1] = expiry (s), then per key: n, then n (field, amount).
USAGE_SCRIPT = """
local ttl = tonumber(ARGV[1])
local at = 2
for _, key in ipairs(KEYS) do
  local n = tonumber(ARGV[at])
  at = at + 1
  for _ = 1, n do
    redis.call('HINCRBY', key, ARGV[at], ARGV[at + 1])
    at = at + 2
  end
  redis.call('EXPIRE', key, ttl)
end
return #KEYS
"""


def usage_key(project: str, day: str) -> str:
    return f"prism:usage:{project}:{day}"


Row = tuple[str, str, str]  # project, key id, model


class UsageRecorder(Collector):
    """Counters by (project, key, model, day) since the last flush, and the process's
    totals by (project, model) for ``/metrics``. Only the event loop touches them."""

    def __init__(
        self,
        redis: RedisClient,
        available: Callable[[], bool] = lambda: True,
        interval: float = 1.0,
    ) -> None:
        self._redis = redis
        self._available = available
        self._interval = interval
        # Day number (days since 1970) -> row -> counts; ``_today`` is the current day's.
        self._pending: dict[int, dict[Row, list[int]]] = {}
        self._rows = 0
        self._today: dict[Row, list[int]] = {}
        self._day_starts = self._day_ends = 0.0  # ``_today``'s bounds (unix seconds)
        # Flushed counts by (project, model), for /metrics (which adds the pending ones).
        self._totals: dict[tuple[str, str], list[int]] = {}
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0  # rows lost: a failed flush, or too many pending

    def _day(self, now: float) -> dict[Row, list[int]]:
        if not self._day_starts <= now < self._day_ends:
            day = int(now) // 86_400
            self._day_starts, self._day_ends = day * 86_400.0, (day + 1) * 86_400.0
            self._today = self._pending.setdefault(day, {})
        return self._today

    def _row(self, project: str, key_id: str, model: str, now: float) -> list[int] | None:
        rows = self._day(now)
        counts = rows.get((project, key_id, model))
        if counts is None:
            if self._rows >= _MAX_ROWS:
                self.dropped += 1
                return None
            self._rows += 1
            counts = rows[(project, key_id, model)] = [0] * len(FIELDS)
        return counts

    def hit(
        self, project: str, key_id: str, model: str, saved: int, now: float, layer: str = "redis"
    ) -> None:
        """One hit at ``now`` (``layer``: redis or semantic): ``record`` for the hot path
        (no clock read, no loop, two dict lookups when the day has not turned)."""
        rows = self._today if self._day_starts <= now < self._day_ends else self._day(now)
        counts = rows.get((project, key_id, model))
        if counts is None:
            counts = self._row(project, key_id, model, now)
            if counts is None:
                return
        counts[_LAYER[layer]] += 1
        if saved:
            counts[_SAVED] += saved

    def record(
        self,
        project: str,
        key_id: str,
        model: str,
        layer: str,
        tokens: Tokens | None = None,
        cost: int | None = None,
    ) -> None:
        """One answered request (a hit: ``hit``). ``cost``: what it cost (None with
        ``tokens``: unpriced)."""
        counts = self._row(project, key_id, model, time.time())
        if counts is None:
            return
        counts[_LAYER[layer]] += 1
        if tokens is not None:
            counts[_IN] += tokens.prompt
            counts[_OUT] += tokens.completion
            if cost is None:
                counts[_UNPRICED] += 1
        if cost:
            counts[_COST] += cost

    # -- the writer -------------------------------------------------------------------

    async def flush(self) -> bool:
        """Write what was counted since the last flush in one command; False if it failed
        (those counts are dropped) or Redis is unavailable (they wait)."""
        if not self._pending:
            return True
        if not self._available():
            return False
        pending, rows = self._pending, self._rows
        self._pending, self._rows, self._day_starts, self._day_ends = {}, 0, 0.0, 0.0
        _add_totals(self._totals, pending)
        hashes: dict[str, list[str | int]] = {}
        for day, found in pending.items():
            for (project, key_id, model), counts in found.items():
                fields = hashes.setdefault(usage_key(project, _day(day)), [])
                for index, amount in enumerate(counts):
                    if amount:
                        fields += (f"{FIELDS[index]}|{key_id}|{model}", amount)
        keys = list(hashes)
        args: list[str | int] = [RETENTION_SECONDS]
        for name in keys:
            args.append(len(hashes[name]) // 2)
            args += hashes[name]
        try:
            await self._redis.execute("EVAL", USAGE_SCRIPT, len(keys), *keys, *args)
        except RedisClientError as error:
            self.dropped += rows
            log.warning("usage flush failed, %d rows dropped: %s", rows, error)
            return False
        return True

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.flush()
            except Exception:  # a bug here must not end the flushes
                log.exception("usage flush failed unexpectedly")

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._flush_forever())

    async def close(self) -> None:
        """Stop the timer and write what is left (at shutdown)."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        with contextlib.suppress(Exception):
            await self.flush()

    # -- /metrics ---------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        labels = ("project", "model")
        tokens = CounterMetricFamily(
            "prism_usage_tokens",
            "Tokens the providers reported, by project, model and direction (in, out).",
            labels=(*labels, "direction"),
        )
        cost = CounterMetricFamily(
            "prism_usage_cost_usd", "Provider cost of answered calls, USD.", labels=labels
        )
        saved = CounterMetricFamily(
            "prism_usage_saved_usd", "What the cache hits would have cost, USD.", labels=labels
        )
        unpriced = CounterMetricFamily(
            "prism_usage_unpriced_calls", "Answered calls whose model has no price.", labels=labels
        )
        totals = {name: list(counts) for name, counts in self._totals.items()}
        _add_totals(totals, self._pending)  # not flushed yet, counted all the same
        for (project, model), counts in totals.items():
            tokens.add_metric((project, model, "in"), counts[_IN])
            tokens.add_metric((project, model, "out"), counts[_OUT])
            cost.add_metric((project, model), counts[_COST] / 1_000_000)
            saved.add_metric((project, model), counts[_SAVED] / 1_000_000)
            unpriced.add_metric((project, model), counts[_UNPRICED])
        yield from (tokens, cost, saved, unpriced)


def _add_totals(
    totals: dict[tuple[str, str], list[int]], pending: dict[int, dict[Row, list[int]]]
) -> None:
    for rows in pending.values():
        for (project, _, model), counts in rows.items():
            total = totals.get((project, model))
            if total is None:
                total = totals[(project, model)] = [0] * len(FIELDS)
            for index, amount in enumerate(counts):
                total[index] += amount


def _day(number: int) -> str:
    return datetime.fromtimestamp(number * 86_400, UTC).strftime("%Y-%m-%d")
