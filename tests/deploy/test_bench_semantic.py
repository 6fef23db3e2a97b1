"""`prism bench semantic --pairs FILE` and `--scale N`: the counts they report are the
cache's decisions, the files they write are there (the real model, a real redis-server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from deploy.cli import app

pytest.importorskip("numpy", reason="the semantic extra is not installed")
pytest.importorskip("matplotlib", reason="the bench extra is not installed")

runner = CliRunner()
PAIRS = [
    {"a": "What's the capital of France?", "b": "what is the capital of france", "same": True},
    {"a": "How do I reverse a list in Python?", "b": "Reverse a list in Python", "same": True},
    {"a": "Convert 5 km to miles", "b": "Convert 5 miles to km", "same": False},
    {"a": "What is 2+2?", "b": "What is 2*2?", "same": False},
    {"a": "What's the capital of France?", "b": "What's the capital of France?", "same": False},
]


def test_pairs_count_hits_on_same_and_wrong_hits_on_the_rest(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps(p) for p in PAIRS) + "\n")
    out = tmp_path / "out"
    args = ["bench", "semantic", "--pairs", str(pairs), "--threshold", "0.95", "--out", str(out)]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    (report,) = json.loads(result.stdout)["pairs"]["files"]
    assert (report["same"], report["different"], report["skipped"]) == (2, 3, 0)
    at = {row["threshold"]: row for row in report["rows"]}[0.95]
    # The identical texts labelled "not same" are the one wrong hit (a label the cache
    # cannot honour); the guard keeps the swapped units and the other operator out.
    assert at["wrong_hit_rate"] == pytest.approx(1 / 3)
    assert at["wrong_hit_rate_unguarded"] >= 2 / 3 - 1e-9  # km/miles scores 0.99
    assert at["hit_rate"] >= 0.5
    assert [w["b"] for w in report["wrong_hits"]] == ["What's the capital of France?"]
    assert (out / "semantic-pairs.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((out / "semantic-pairs.json").read_text())["threshold"] == 0.95


def test_a_pairs_file_with_a_bad_line_is_one_clear_error(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"a": "x", "b": "y"}\n')
    result = runner.invoke(app, ["bench", "semantic", "--pairs", str(pairs)])
    assert result.exit_code == 1
    assert "pairs.jsonl:1: want" in result.output


def test_scale_reports_a_miss_cost_memory_and_recall() -> None:
    from deploy.bench.semantic_scale import run_scale

    result = run_scale(6000, lookups=10)
    assert result["held"] == 6000
    assert result["recall_at_0_95"] == 1.0
    assert result["redis_bytes_per_record"] > 768  # a float16 vector at least
    for part in ("lookup_miss", "embedding", "beyond_embedding", "search"):
        assert 0 < result[part]["p50_ms"] <= result[part]["p99_ms"]


def test_scale_refuses_a_size_out_of_range() -> None:
    result = runner.invoke(app, ["bench", "semantic", "--scale", "5"])
    assert result.exit_code != 0
    assert "--scale must be 100-1000000" in result.output
