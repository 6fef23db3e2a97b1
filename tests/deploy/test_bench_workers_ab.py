"""deploy/bench/workers_ab.py runs both shapes for real and reports what it measured (the
figures themselves are the machine's: no bound on them here)."""

from __future__ import annotations

import pytest

from deploy.bench.workers_ab import run


@pytest.mark.timeout(600)  # four `prism` processes' start-up on a slow machine
def test_one_round_loads_one_worker_then_two_with_hits_and_misses() -> None:
    report = run(rounds=1, duration=1, concurrency=4)
    assert [row["workers"] for row in report["rows"]] == [1, 2]
    for row in report["rows"]:
        for kind in ("hit", "miss", "floor"):
            figures = row[kind]
            assert figures["failed"] == 0 and figures["rps"] > 0
            assert figures["origin_cpu_s"] > 0 and 0 < figures["machine_busy"] <= 1
    assert set(report["ratio"]) == {"hit", "miss", "floor", "hit_of_floor"}
