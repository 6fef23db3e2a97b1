"""`prism bench semantic --load`, quick: unique misses at a small rate through two real
origins sharing a private Redis, semantic off then on, with the labelled pairs asked
beside them. What does not depend on the machine's speed: every request answered, the
lookups counted by outcome on the near origin, the model's batches read from the new
histogram, paraphrases found on both origins, no near miss answered semantically.

The latency and shed bounds are for the full run on a quiet machine (the bench judges
them at 200 misses a second); here they are only reported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numpy", reason="the semantic extra is not installed")


@pytest.mark.timeout(300)
def test_the_quick_load_run_reports_lookups_batches_and_fresh_paraphrases(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "deploy.cli", "bench", "semantic", "--load", "--quick",
         "--json", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(run.stdout)
    assert json.loads((tmp_path / "semantic-load.json").read_text()) == result
    off, on = result["phases"]
    assert (off["semantic"], on["semantic"]) == (False, True)
    for phase in (off, on):
        assert phase["sent"] == phase["ok"] > 0 and not phase["errors"], phase
        assert phase["layers"] == {"miss": phase["sent"]}  # unique: never a hit of any kind
    assert not off["outcomes"] and not off["embedded"]
    # Every unique miss and every pair's question was looked up on the near origin.
    assert sum(on["outcomes"].values()) >= on["sent"]
    assert on["outcomes"].get("hit", 0) >= 1
    assert on["embedded"] >= on["sent"] and on["embed_cpu_ms"] > 0
    assert on["mean_batch"] is not None and on["mean_batch"] >= 1
    assert on["batches"]["+Inf"] >= 1 and on["semantic_p50_ms"] is not None
    found = on["pairs_found"]
    assert found["paraphrase_same"]["hits"] >= 1 and found["paraphrase_other"]["hits"] >= 1
    assert found["near_miss_same"]["hits"] == found["near_miss_other"]["hits"] == 0
    checks = {check["check"].split(" (")[0]: check["ok"] for check in result["checks"]}
    assert checks["no wrong hit"] and checks["every request answered 200"], result["checks"]
    (row,) = result["rows"]
    assert row["rate"] == 20 and row["lookups"] == sum(on["outcomes"].values())
