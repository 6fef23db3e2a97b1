"""Usage per project, key, model and UTC day: counted in memory, written to Redis in bulk.

Every answered request adds to counters in memory (no Redis command on any request's
path); every ``interval`` (1 s) and at shutdown one script writes them all (HINCRBY into
one hash per project and day, with an expiry). A process that crashes loses at most the
counts of its last interval.

A flush that fails is kept and sent again, and counted once all the same: each batch
carries an id that the script marks as applied (``SET NX``) before it adds anything, so a
retry of a batch whose write landed but whose reply was lost adds nothing. One batch is
in flight at a time: while it is not written, new counts wait in memory (merged, so an
outage costs memory by distinct rows, not by requests), and the next batch is made once
it has landed. Rows past the bound, and a batch not written within the marker's life
(``RETRY_SECONDS``), are dropped and counted (``prism_usage_dropped_rows_total``).

Redis::

    prism:usage:<project>:<YYYY-MM-DD>   hash, fields "<counter>|<key id>|<model>":
        requests.redis | requests.semantic | requests.miss | requests.bypass
        | requests.coalesced | requests.kv
        tokens_in, tokens_out   as the provider reported them (prompt, completion)
        cost_micros             what the provider charged, integer micro-USD
        saved_micros            what cache hits would have cost (their entry's usage)
        unpriced                answered calls whose cost is unknown (model has no price)
    prism:usage-batch:<batch id>         "1" once that batch was applied (expires)

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
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from ..background import cancel_and_wait
from ..connection.redis_client import RedisClient, RedisClientError, RedisReplyError
from ..providers.token_counts import Tokens

__all__ = [
    "FIELDS",
    "LAYERS",
    "RETRY_SECONDS",
    "USAGE_SCRIPT",
    "UsageRecorder",
    "batch_key",
    "usage_key",
]

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

# A batch not written this long after it was made is dropped: its marker lives longer
# (MARKER_SECONDS), so every retry of a batch that did land still finds the marker.
RETRY_SECONDS = 3000
MARKER_SECONDS = 3600
# Error replies that pass (a failover, a restart loading its data, a busy or full server):
# the batch is sent again. Any other error reply is the batch's own, and it is dropped.
_PASSING = ("READONLY", "MASTERDOWN", "LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "OOM")

# KEYS[1] = the batch's marker, then the day hashes; ARGV[1] = the hashes' expiry (s),
# ARGV[2] = the marker's (s), then per hash: n, then n (field, amount). The marker is set
# first: a batch already applied adds nothing (0), and an error halfway through can only
# lose the rest of a batch, never count a part of it twice.
USAGE_SCRIPT = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[2]) then
  return 0
end
local ttl = tonumber(ARGV[1])
local at = 3
for i = 2, #KEYS do
  local key = KEYS[i]
  local n = tonumber(ARGV[at])
  at = at + 1
  for _ = 1, n do
    redis.call('HINCRBY', key, ARGV[at], ARGV[at + 1])
    at = at + 2
  end
  redis.call('EXPIRE', key, ttl)
end
return 1
"""


def usage_key(project: str, day: str) -> str:
    return f"prism:usage:{project}:{day}"


def batch_key(batch_id: str) -> str:
    return f"prism:usage-batch:{batch_id}"


Row = tuple[str, str, str]  # project, key id, model


@dataclass(frozen=True, slots=True)
class _Batch:
    """One flush's counts as the script's arguments, sent as they are until they land."""

    id: str
    keys: list[str]
    args: list[str | int]
    rows: int
    made: float  # time.monotonic()


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
        # The batch sent and not known to have landed; its id is this process's and a count.
        self._unsent: _Batch | None = None
        self._process = secrets.token_hex(8)
        self._batches = 0
        self.dropped = 0  # rows lost: too many pending, or a batch never written
        self.failures = 0  # batches that failed to be written (each time)
        self.retried = 0  # batches written on a later try

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
        """Write the batch not yet written, then what was counted since, one command
        each; False if one failed (kept for the next flush) or Redis is unavailable
        (the counts wait)."""
        if self._unsent is None and not self._pending:
            return True
        if not self._available():
            return False
        if self._unsent is not None:
            if not await self._send(self._unsent):
                return False
            self._unsent = None
            self.retried += 1
        if not self._pending:
            return True
        batch = self._unsent = self._take()
        if not await self._send(batch):
            return False
        self._unsent = None
        return True

    def _take(self) -> _Batch:
        """The pending counts as the next batch (and into the /metrics totals)."""
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
        args: list[str | int] = [RETENTION_SECONDS, MARKER_SECONDS]
        for name in keys:
            args.append(len(hashes[name]) // 2)
            args += hashes[name]
        self._batches += 1
        batch_id = f"{self._process}-{self._batches}"
        return _Batch(batch_id, keys, args, rows, time.monotonic())

    async def _send(self, batch: _Batch) -> bool:
        """True once the batch is applied (now, or by an earlier try whose reply was lost).
        False: kept to be sent again, unless it can never be (dropped and counted)."""
        keys = [batch_key(batch.id), *batch.keys]
        try:
            await self._redis.execute("EVAL", USAGE_SCRIPT, len(keys), *keys, *batch.args)
        except RedisClientError as error:
            self.failures += 1
            refused = isinstance(error, RedisReplyError) and not str(error).startswith(_PASSING)
            if refused or time.monotonic() - batch.made > RETRY_SECONDS:
                self._unsent = None
                self.dropped += batch.rows
                log.warning("usage flush failed, %d rows dropped: %s", batch.rows, error)
            else:
                log.warning("usage flush failed, %d rows kept to retry: %s", batch.rows, error)
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
        dropped = CounterMetricFamily(
            "prism_usage_dropped_rows",
            "Usage rows never written to Redis: past the pending bound, or a batch that "
            "could not be written in time.",
            value=self.dropped,
        )
        yield from (tokens, cost, saved, unpriced, dropped)


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
