"""`python -m deploy.bench.log_window_memory` on a real Redis, a few thousand records: the
memory and CPU it reports per record are there and plausible."""

from __future__ import annotations

from deploy.bench.log_window_memory import measure, measure_cpu


def test_the_window_bench_reports_memory_and_cpu_per_record(redis_url: str) -> None:
    memory = measure(redis_url, 3000)
    # A record's JSON is about 640 bytes; its id costs a field of a hash, not a key.
    assert 600 < memory["stream_only"] < memory["with_ids"] < memory["stream_only"] + 200
    cpu = measure_cpu(redis_url, 3000, window=1000)
    assert cpu["redis_us"] > 0 and cpu["sink_us"] > 0
