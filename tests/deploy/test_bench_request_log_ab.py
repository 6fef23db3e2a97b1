"""`python -m deploy.bench.request_log_ab`: real origins with the request log off, with the
window only and with every sink, loaded in turn on one Redis; every answer a hit, and the
CPU each process spent counted per request."""

from __future__ import annotations

from deploy.bench.request_log_ab import measure


def test_one_round_loads_each_origin_with_hits_and_counts_their_cpu() -> None:
    result = measure(rounds=1, seconds=1.0, concurrency=4, otlp=False, extra=("window",))
    assert set(result["runs"]) == {"off", "window", "on"}
    for case, (run,) in result["runs"].items():
        assert run["non_2xx"] == 0, case
        assert run["rps"] > 0 and run["cpu_us_per_request"] > 0, case
        assert run["redis_cpu_us_per_request"] >= 0, case
    assert result["throughput_kept_paired_median"] > 0
