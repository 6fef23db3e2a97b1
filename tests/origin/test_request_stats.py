"""The per-request counters and duration histogram, as a scrape renders them."""

from __future__ import annotations

from origin.metrics import Metrics


def test_statuses_count_apart_and_add_up_in_the_duration_histogram() -> None:
    metrics = Metrics()
    metrics.record_request("chat", 200, "miss", 0.002)
    metrics.record_request("chat", 200, "miss", 0.0025)  # a bound is inside its bucket
    metrics.record_request("chat", 499, "miss", 0.5)
    metrics.record_request("chat", 200, "redis", 0.0004)
    sample = metrics.registry.get_sample_value

    assert (
        sample("prism_origin_requests_total", {"route": "chat", "status": "200", "layer": "miss"})
        == 2
    )
    assert (
        sample("prism_origin_requests_total", {"route": "chat", "status": "499", "layer": "miss"})
        == 1
    )
    miss = {"route": "chat", "layer": "miss"}
    assert sample("prism_origin_request_duration_seconds_count", miss) == 3
    total = sample("prism_origin_request_duration_seconds_sum", miss)
    assert total is not None and abs(total - 0.5045) < 1e-9
    assert sample("prism_origin_request_duration_seconds_bucket", {**miss, "le": "0.001"}) == 0
    assert sample("prism_origin_request_duration_seconds_bucket", {**miss, "le": "0.0025"}) == 2
    assert sample("prism_origin_request_duration_seconds_bucket", {**miss, "le": "0.25"}) == 2
    assert sample("prism_origin_request_duration_seconds_bucket", {**miss, "le": "0.5"}) == 3
    assert sample("prism_origin_request_duration_seconds_bucket", {**miss, "le": "+Inf"}) == 3
    redis = {"route": "chat", "layer": "redis"}
    assert sample("prism_origin_request_duration_seconds_count", redis) == 1
    assert sample("prism_origin_request_duration_seconds_bucket", {**redis, "le": "0.001"}) == 1
