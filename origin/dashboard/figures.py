"""The figures an operator watches, read from the origin's Prometheus metrics; and rates.

Pure: ``totals_of`` takes metric families as ``prometheus_client`` gives them, from the
origin's own registry (the dashboard's sampler) or parsed from ``/metrics`` text
(``prism top``), so both read the same counters the same way. ``rates_between`` turns
two readings into per-second rates, the way Prometheus's ``rate`` does: a counter that
went down was reset (the origin restarted), so its new value is all that happened since.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import Metric

__all__ = ["LAYERS", "STATES", "Rates", "Totals", "hit_ratio", "rates_between", "totals_of"]

# The layers a request is answered from (``x-prism-edge-cache-layer``): ``kv`` hits are
# answered at the edge, and counted by the origin their records reach
# (``origin/apis/edge_records.py``); ``refused`` are the edge's own refusals.
LAYERS = ("miss", "kv", "redis", "semantic", "bypass")
HIT_LAYERS = ("kv", "redis", "semantic")
# The origin's answers, and the edge's own as their records tell the origin.
_REQUESTS = frozenset({"prism_origin_requests", "prism_edge_requests"})
# ``prism_provider_state``'s values.
STATES = ("healthy", "probing", "demoted")


@dataclass(frozen=True, slots=True)
class Totals:
    """Counters since the origin started (gauges as they are), at ``at`` (unix seconds)."""

    at: float
    requests: Mapping[str, float]  # answered API requests by layer
    server_errors: float = 0.0  # of which 5xx
    provider_calls: Mapping[str, float] = field(default_factory=dict)  # by provider
    provider_failures: Mapping[str, float] = field(default_factory=dict)  # not "ok"
    provider_state: Mapping[str, str] = field(default_factory=dict)
    kv_queued: float = 0.0
    kv_in_flight: float = 0.0
    kv_sent: float = 0.0
    kv_dropped: float = 0.0
    cost_usd: Mapping[str, float] = field(default_factory=dict)  # by project, this process
    loop_lag: float = 0.0  # seconds the event loop ran late at its last watch tick
    loop_lag_refused: float = 0.0  # requests refused with a 503 while it lagged

    @property
    def hit_ratio(self) -> float | None:
        return hit_ratio(self.requests)


@dataclass(frozen=True, slots=True)
class Rates:
    """What happened per second between two readings ``seconds`` apart."""

    seconds: float
    requests: Mapping[str, float]  # by layer
    server_errors: float
    provider_calls: Mapping[str, float]
    provider_failures: Mapping[str, float]
    kv_sent: float
    kv_dropped: float
    cost_usd: Mapping[str, float]  # USD per second, by project

    @property
    def hit_ratio(self) -> float | None:
        return hit_ratio(self.requests)

    @property
    def total(self) -> float:
        return sum(self.requests.values())


def hit_ratio(by_layer: Mapping[str, float]) -> float | None:
    """Hits over hits and misses (``bypass`` is neither: it could not be cached), or None
    when there were neither."""
    hits = sum(by_layer.get(layer, 0.0) for layer in HIT_LAYERS)
    looked_up = hits + by_layer.get("miss", 0.0)
    return hits / looked_up if looked_up else None


def totals_of(families: Iterable[Metric], at: float) -> Totals:
    """The figures in ``families`` (``registry.collect()`` or the text parser's output)."""
    requests = dict.fromkeys(LAYERS, 0.0)
    server_errors = kv_queued = kv_in_flight = kv_sent = kv_dropped = 0.0
    loop_lag = loop_lag_refused = 0.0
    calls: dict[str, float] = {}
    failures: dict[str, float] = {}
    states: dict[str, str] = {}
    cost: dict[str, float] = {}
    for family in families:
        name = family.name
        for sample in family.samples:
            labels, value = sample.labels, sample.value
            if name in _REQUESTS and sample.name.endswith("_total"):
                layer = labels.get("layer", "bypass")
                requests[layer] = requests.get(layer, 0.0) + value
                if labels.get("status", "").startswith("5"):
                    server_errors += value
            elif name == "prism_provider_attempts" and sample.name.endswith("_total"):
                provider = labels.get("provider", "")
                calls[provider] = calls.get(provider, 0.0) + value
                if labels.get("outcome") != "ok":
                    failures[provider] = failures.get(provider, 0.0) + value
            elif name == "prism_provider_state":
                index = int(value)
                states[labels.get("provider", "")] = STATES[index] if 0 <= index < 3 else "?"
            elif name == "prism_kv_writer_queue_depth":
                kv_queued = value
            elif name == "prism_kv_writer_in_flight":
                kv_in_flight = value
            elif name == "prism_kv_writer_sent" and sample.name.endswith("_total"):
                kv_sent = value
            elif name == "prism_kv_writer_dropped" and sample.name.endswith("_total"):
                kv_dropped += value
            elif name == "prism_origin_event_loop_lag_seconds":
                loop_lag = value
            elif name == "prism_origin_loop_lag_refused" and sample.name.endswith("_total"):
                loop_lag_refused = value
            elif name == "prism_usage_cost_usd" and sample.name.endswith("_total"):
                project = labels.get("project", "")
                cost[project] = cost.get(project, 0.0) + value
    return Totals(
        at=at,
        requests=requests,
        server_errors=server_errors,
        provider_calls=calls,
        provider_failures=failures,
        provider_state=states,
        kv_queued=kv_queued,
        kv_in_flight=kv_in_flight,
        kv_sent=kv_sent,
        kv_dropped=kv_dropped,
        cost_usd=cost,
        loop_lag=loop_lag,
        loop_lag_refused=loop_lag_refused,
    )


def _increase(before: float, after: float) -> float:
    return after if after < before else after - before  # down: reset, all of it is new


def _per_second(
    before: Mapping[str, float], after: Mapping[str, float], seconds: float
) -> dict[str, float]:
    return {name: _increase(before.get(name, 0.0), n) / seconds for name, n in after.items()}


def rates_between(before: Totals, after: Totals) -> Rates | None:
    """Per-second rates from ``before`` to ``after``; None when no time passed."""
    seconds = after.at - before.at
    if seconds <= 0:
        return None
    return Rates(
        seconds=seconds,
        requests=_per_second(before.requests, after.requests, seconds),
        server_errors=_increase(before.server_errors, after.server_errors) / seconds,
        provider_calls=_per_second(before.provider_calls, after.provider_calls, seconds),
        provider_failures=_per_second(before.provider_failures, after.provider_failures, seconds),
        kv_sent=_increase(before.kv_sent, after.kv_sent) / seconds,
        kv_dropped=_increase(before.kv_dropped, after.kv_dropped) / seconds,
        cost_usd=_per_second(before.cost_usd, after.cost_usd, seconds),
    )
