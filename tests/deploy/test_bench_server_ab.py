"""deploy/bench/server_ab.py serves the origin under a candidate server for real and
reports what it measured (the figures themselves are the machine's: no bound on them)."""

from __future__ import annotations

import pytest

from deploy.bench import server_ab


@pytest.mark.timeout(300)  # an origin's start-up on a slow machine
def test_one_round_under_uvicorn_serves_hits_and_misses_and_counts_their_cpu() -> None:
    report = server_ab.run(["uvicorn"], wall=True, rounds=1, seconds=0.5)
    rows = report["wall"]
    assert [(r["row"], r["concurrency"]) for r in rows] == [
        ("hit", 1), ("hit", 32), ("miss", 1), ("miss", 32),
    ]  # fmt: skip
    for row in rows:
        assert row["server"] == "uvicorn" and row["non_2xx"] == 0 and row["rps"] > 0
        assert row["cpu_us"] > 0 and row["switches"] >= 0
    assert report["instructions"] == []


def test_a_candidate_not_installed_is_skipped_saying_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(server_ab.SERVERS, "granian", "no_such_server_module")
    assert server_ab.available(["uvicorn", "granian"]) == ["uvicorn"]
    assert "skipped granian: no_such_server_module is not installed" in capsys.readouterr().err
