"""`prism bench regions`, quick: on the real two-region stack (the local Workers runtime,
two origin processes, a Redis primary and its replica), the nearest origin stopped and
then killed under a steady load costs no request, the load moves to the other region and
comes back; a slow provider is waited for, called once per request.

The latency checks the bench makes (a median within 10 % of the healthy one) are for a
quiet machine and its full run; here only what does not depend on the machine's speed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from deploy.bench.regions import FAR, NEAR, RegionsConfig, run_regions
from deploy.bench.regions_report import render_regions, write_regions


@pytest.mark.timeout(900)
def test_regions_quick_run_loses_no_request_to_a_hung_or_dead_origin(tmp_path: Path) -> None:
    result = run_regions(RegionsConfig.quick())
    stopped, killed, slow = result["scenarios"]
    for outage in (stopped, killed):
        checks = {check["check"]: check for check in outage["checks"]}
        assert checks["≥ 99 % answered 200"]["ok"], outage["figures"]
        samples = outage["samples"]
        # Healthy: the nearest answers; during the outage the other; then the nearest again.
        assert samples[0]["region"] == NEAR
        assert any(s["region"] == FAR for s in samples), outage["figures"]
        assert outage["figures"]["back_on_nearest_after_s"] is not None, outage["figures"]
        assert samples[-1]["region"] == NEAR
    # A stopped origin's requests each waited for a probe, not the origin timeout (90 s).
    assert stopped["figures"]["slowest_ms"] < 60_000
    assert all(check["ok"] for check in slow["checks"]), slow["checks"]

    path, problem = write_regions(result, tmp_path)
    assert json.loads(path.read_text())["scenarios"][0]["name"] == "nearest origin stopped"
    assert problem is None and (tmp_path / "regions.png").stat().st_size > 0
    console = Console(record=True, width=200)
    console.print(render_regions(result))
    assert "back on the nearest origin" in console.export_text()
