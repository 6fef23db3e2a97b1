"""`prism bench budget` at a small size, so it never rots: the admission result is exact
whatever the machine's load (the provider answers after 1 s, so every reservation is
tried before any call settles); the timings are only checked for shape."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from deploy.cli import app


def test_the_budget_bench_admits_exactly_what_the_budget_holds() -> None:
    result = CliRunner().invoke(
        app, ["bench", "budget", "--concurrent", "40", "--misses", "20", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    admission = report["admission"]
    assert admission["budget_room"] == 10
    assert (admission["admitted"], admission["refused_429"], admission["other"]) == (10, 30, 0)
    assert 0 < admission["spent_usd"] <= admission["limit_usd"]
    assert admission["reserved_after_usd"] == 0
    miss = report["miss_path"]
    for side in ("no_budget", "budget"):
        assert miss[side]["requests"] == 20
        assert 0 < miss[side]["p50_ms"] <= miss[side]["p90_ms"]
    assert miss["redis_script"]["reserve_p50_us"] > 0


def test_bad_sizes_are_refused() -> None:
    result = CliRunner().invoke(app, ["bench", "budget", "--concurrent", "0"])
    assert result.exit_code == 2
    assert "--concurrent must be 1-1000" in result.output
