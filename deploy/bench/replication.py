"""The KV writer, seen from outside: the origin's /metrics (on its admin listener)
before and after a miss run.

Every entry the origin stores is handed to its KV writer (counted). After the
run, this waits until each of those entries is accounted for (sent or dropped)
and reports how many went, in how many REST calls, and how fast, counting the
drain time after the load in the rate.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Mapping
from typing import Any

import httpx

__all__ = ["measure_replication", "read_metrics", "wait_writer_idle"]

_SENT = "prism_kv_writer_sent_total"
_SUBMITTED = "prism_kv_writer_submitted_total"  # each new entry, whatever became of it
_DROPPED = "prism_kv_writer_dropped_total"


def read_metrics(admin_url: str) -> dict[str, float]:
    """The origin's samples as ``{"name{labels}": value}``."""
    text = httpx.get(admin_url + "/metrics", timeout=10).text
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                found[name] = float(value)
    return found


def _total(metrics: Mapping[str, float], name: str) -> float:
    """A counter summed over its labels."""
    return sum(v for k, v in metrics.items() if re.match(re.escape(name) + r"(\{|$)", k))


def _writer_idle(metrics: Mapping[str, float]) -> bool:
    return (
        metrics.get("prism_kv_writer_queue_depth", 0) == 0
        and metrics.get("prism_kv_writer_in_flight", 0) == 0
    )


def wait_writer_idle(admin_url: str, timeout: float = 120) -> dict[str, float]:
    """The origin's metrics once its KV writer has nothing queued or in flight.

    Local bulk writes are slow (each key is a file and a database row), so entries
    of an earlier run may still be on their way; reading "before" then would count
    them against the next run.
    """
    deadline = time.monotonic() + timeout
    while True:
        metrics = read_metrics(admin_url)
        if _writer_idle(metrics) or time.monotonic() > deadline:
            return metrics
        time.sleep(0.1)


def measure_replication(
    admin_url: str, before: Mapping[str, float], run_seconds: float, flush_interval: float
) -> dict[str, Any]:
    """What the KV writer did with the entries created since ``before`` was read.

    Waits until the writer is idle again (nothing queued, no bulk call in flight), or
    two minutes have passed.
    """
    began = time.monotonic()
    while True:
        after = read_metrics(admin_url)
        created = _total(after, _SUBMITTED) - _total(before, _SUBMITTED)
        done = _total(after, _SENT) + _total(after, _DROPPED)
        done -= _total(before, _SENT) + _total(before, _DROPPED)
        if (done >= created and _writer_idle(after)) or time.monotonic() - began > 120:
            break
        time.sleep(0.1)
    drain = time.monotonic() - began

    def delta(name: str) -> float:
        return _total(after, name) - _total(before, name)

    sent, calls = delta(_SENT), delta("prism_kv_writer_calls_total")
    window = run_seconds + drain
    return {
        "entries_created": int(created),
        "entries_replicated": int(sent),
        "rest_calls": int(calls),
        "entries_per_call": round(sent / calls, 1) if calls else 0.0,
        "dropped": int(delta(_DROPPED)),
        "retries": int(delta("prism_kv_writer_retries_total")),
        "drain_seconds": round(drain, 2),
        "entries_per_second": round(sent / window, 1) if window else 0.0,
        "flush_interval_s": flush_interval,
        "note": "entries come from the origin's highest-concurrency miss run, "
        "so the rate is bounded by that run's throughput",
    }
