"""`prism bench geo`, quick: every part in its own network namespace with short delays; the
layering holds for each customer and edge, San Francisco's second region answers its
misses, and killing that origin mid-run fails no request."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from deploy.bench.geo import GeoConfig, run_geo
from deploy.bench.geo_profile import DEFAULT_PROFILE
from deploy.bench.geo_report import render_geo, write_geo
from deploy.local import netns

WHY_NOT = netns.available()


@pytest.mark.skipif(WHY_NOT is not None, reason=f"no network namespaces: {WHY_NOT}")
def test_geo_quick_run_keeps_the_layering_and_survives_an_origin_killed(tmp_path: Path) -> None:
    config = GeoConfig(DEFAULT_PROFILE.scaled(0.2), requests=2, failover_requests=4)
    result = run_geo(config)
    assert result["network"] == "namespaces"
    rows = {(row["customer"], row["regions"]): row for row in result["rows"]}
    assert len(rows) == 4
    for row in rows.values():
        assert row["wrong_layers"] == [], row
        assert row["samples"] == {"miss": 2, "redis": 2, "kv": 2}
        # Each layer is nearer than the one behind it: the provider, then the origin.
        assert row["kv_ms"] < row["redis_ms"] < row["miss_ms"], row
    # Singapore is nearest Mumbai either way; San Francisco gets its own region.
    assert rows[("Singapore", 2)]["answered_by"] == ["ap-south-1"]
    assert rows[("San Francisco", 1)]["answered_by"] == ["ap-south-1"]
    assert rows[("San Francisco", 2)]["answered_by"] == ["us-west-1"]
    assert rows[("San Francisco", 2)]["miss_ms"] < rows[("San Francisco", 1)]["miss_ms"]
    # A Redis hit far away costs about the link, not two of it (the 50 ms link, scaled).
    assert rows[("San Francisco", 1)]["origin_wait_ms"] < 2 * 50
    failover = result["failover"]
    assert failover["killed"] == "us-west-1"
    assert failover["failures"] == 0
    assert failover["answered_after_kill"] == ["ap-south-1"]
    assert any("no request fails" in check["check"] and check["ok"] for check in result["checks"])

    path, _ = write_geo(result, tmp_path)
    assert json.loads(path.read_text())["rows"] == result["rows"]
    console = Console(record=True, width=200)
    console.print(render_geo(result))
    shown = console.export_text()
    assert "San Francisco" in shown and "us-west-1" in shown
    # The run's namespaces (named after this process) are gone with it.
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"prism{os.getpid() % 100_000}-" not in left
