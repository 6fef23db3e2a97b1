"""`prism bench logsinks --quick` through the real processes: a private redis-server, the
provider stand-in, moto's S3 server and a Rotel collector (both SIGKILLed for 3 s and started
again on their ports) and one `prism origin serve` with every request-log sink on.

What does not depend on the machine's speed is asserted: every request answered 200 in
every phase, both sinks really down for the outage, and for every sink each record the
origin produced found in it afterwards or counted dropped by the origin, none missing
silently; with a buffer smaller than the outage's records, the drops are counted and the
sum still holds. The p99 bound is for the full run on a quiet machine; here it is reported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("flask", reason="moto's server needs flask (the dev extra)")


def _bench(out: Path, *extra: str) -> dict[str, Any]:
    run = subprocess.run(
        [sys.executable, "-m", "deploy.cli", "bench", "logsinks", "--quick", "--json",
         "--out", str(out), *extra],
        capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(run.stdout)
    assert json.loads((out / "logsinks.json").read_text()) == result
    checks = {check["check"]: check["ok"] for check in result["checks"]}
    p99 = next(name for name in checks if name.startswith("p99"))
    assert run.returncode == (0 if all(checks.values()) else 1), run.stderr[-2000:]
    del checks[p99]  # the machine's speed: reported, not asserted here
    assert all(checks.values()), result["checks"]
    return result


def _phases(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    phases = {phase["name"]: phase for phase in result["phases"]}
    assert list(phases) == ["before", "outage", "after"]
    for phase in phases.values():
        assert phase["sent"] == phase["ok"] > 0 and not phase["errors"], phase
        assert phase["layers"].get("redis", 0) > phase["layers"].get("miss", 0) > 0, phase
        assert phase["p99_ms"] is not None and phase["p99_ms"] >= phase["p50_ms"] > 0
    return phases


@pytest.mark.timeout(120)
def test_sinks_killed_under_load_lose_nothing_and_fail_no_request(tmp_path: Path) -> None:
    result = _bench(tmp_path)
    phases = _phases(result)
    assert phases["outage"]["seconds"] >= 3.0 and result["down_s"] >= 3.0
    sinks = {sink["sink"]: sink for sink in result["sinks"]}
    produced = sum(p["sent"] for p in phases.values())  # and the warm-up's, besides
    for name, sink in sinks.items():
        assert sink["produced"] > produced, sink
        assert sink["found"] == sink["produced"] and sink["dropped"] == 0, sink
        assert sink["written"] >= sink["found"] and not sink["missing"], sink
        assert sink["killed"] == (name != "redis")
    # The killed sinks held the outage's records (3 s at 100/s) while down; Redis did not.
    for name in ("files", "otlp"):
        assert sinks[name]["peak_queued"] >= 250, sinks[name]
    assert sinks["redis"]["peak_queued"] < sinks["files"]["peak_queued"]
    assert result["s3_objects"] >= 2 and result["collector_exports"] >= 2


@pytest.mark.timeout(120)
def test_past_the_bound_the_records_are_counted_dropped(tmp_path: Path) -> None:
    result = _bench(tmp_path, "--buffer", "150")
    _phases(result)
    sinks = {sink["sink"]: sink for sink in result["sinks"]}
    for name in ("files", "otlp"):
        sink = sinks[name]
        assert sink["dropped"] > 0 and sink["found"] > 0, sink
        assert sink["found"] + sink["dropped"] == sink["produced"], sink
        assert len(sink["missing"]) == 10  # the dropped ones: not in the sink
        assert sink["peak_queued"] >= 140, sink  # it filled to the bound (150) meanwhile
