"""The instance's one view of its workers (origin.instance.merge): metrics summed or
maxed by what they mean, health healthy only when every worker is."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from origin.instance import MAX_GAUGES, merge_health, merge_metrics
from tests.fixtures.origin_workers import sample_value


def worker_metrics(requests: int, queued: float, lag: float, state: float) -> str:
    registry = CollectorRegistry()
    counter = Counter("prism_origin_requests", "r", ("route", "layer"), registry=registry)
    counter.labels("chat", "redis").inc(requests)
    counter.labels("chat", "miss").inc(1)
    Gauge("prism_kv_writer_queue_depth", "q", registry=registry).set(queued)
    Gauge("prism_origin_event_loop_lag_seconds", "l", registry=registry).set(lag)
    Gauge("prism_provider_state", "s", ("provider",), registry=registry).labels("a").set(state)
    seconds = Histogram("prism_provider_latency_seconds", "h", buckets=(0.1, 1), registry=registry)
    for _ in range(requests):
        seconds.observe(0.05)
    return generate_latest(registry).decode()


def test_counters_histograms_and_amounts_are_summed_and_the_rest_is_the_largest() -> None:
    texts = [worker_metrics(3, 2, 0.25, 0), worker_metrics(5, 7, 0.05, 2)]
    merged = merge_metrics(texts).decode()

    def value(name: str, **labels: str) -> float:
        return sample_value(merged, name, labels or None)

    assert value("prism_origin_requests_total", route="chat", layer="redis") == 8
    assert value("prism_origin_requests_total", route="chat", layer="miss") == 2
    assert value("prism_kv_writer_queue_depth") == 9
    assert value("prism_origin_event_loop_lag_seconds") == 0.25
    assert value("prism_provider_state", provider="a") == 2  # the worst gate
    assert value("prism_provider_latency_seconds_bucket", le="0.1") == 8
    assert value("prism_provider_latency_seconds_count") == 8
    assert abs(value("prism_provider_latency_seconds_sum") - 0.4) < 1e-9
    created = [sample_value(t, "prism_origin_requests_created", {"route": "chat",
               "layer": "redis"}) for t in texts]  # fmt: skip
    got = value("prism_origin_requests_created", route="chat", layer="redis")
    assert got == min(created)
    assert {"prism_origin_event_loop_lag_seconds", "prism_provider_state"} == MAX_GAUGES


def test_a_series_only_one_worker_has_is_kept() -> None:
    one = worker_metrics(1, 0, 0, 0)
    other = one.replace('layer="miss"', 'layer="semantic"')
    merged = merge_metrics([one, other]).decode()
    labels = {"route": "chat", "layer": "semantic"}
    assert sample_value(merged, "prism_origin_requests_total", labels) == 1
    assert sample_value(merged, "prism_origin_requests_total", {**labels, "layer": "redis"}) == 2


def health(status: str = "ok", state: str = "healthy", queued: int = 0) -> dict[str, Any]:
    return {
        "status": status,
        "version": "r1",
        "redis": {"ok": status == "ok", "replica": None},
        "providers": {"a": {"kind": "openai", "state": state}},
        "kv_writer": {"enabled": True, "queued": queued},
        "background_writes": 1,
        "uptime_seconds": 10.0 if state == "healthy" else 3.0,
    }


def test_health_is_healthy_only_when_every_worker_answers_ok() -> None:
    ids = [{"index": 0, "pid": 10}, {"index": 1, "pid": 11}]
    healthy, merged = merge_health([(ids[0], health(queued=2)), (ids[1], health(queued=3))], 2)
    assert healthy and merged["status"] == "ok"
    assert merged["kv_writer"] == {"enabled": True, "queued": 5}
    assert merged["background_writes"] == 2 and len(merged["workers"]) == 2

    healthy, merged = merge_health([(ids[0], health()), (ids[1], None)], 2)
    assert not healthy and merged["status"] == "degraded"
    assert [w["answered"] for w in merged["workers"]] == [True, False]

    healthy, merged = merge_health([(ids[0], health()), (ids[1], health("degraded"))], 2)
    assert not healthy and merged["redis"]["ok"] is False

    _, merged = merge_health([(ids[0], health()), (ids[1], health(state="demoted"))], 2)
    assert merged["providers"]["a"]["state"] == "demoted"  # the worst gate
    assert merged["uptime_seconds"] == 3.0

    assert merge_health([], 0)[0] is False  # no worker yet: not healthy
