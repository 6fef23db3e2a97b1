"""The in-process Redis-hit driver (for instruction counts) really serves Redis hits, and
its floor really answers through uvicorn."""

from __future__ import annotations

import pytest

from deploy.bench.hit_driver import drive_hits, main


def test_the_driver_answers_every_request_from_redis(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    per_hit = drive_hits(redis_url, 64, concurrency=8)
    assert 0 < per_hit < 0.1
    main([redis_url, "40", "--concurrency", "4"])
    assert "40 Redis hits, 4 at a time:" in capsys.readouterr().out


def test_the_floor_answers_every_request_through_uvicorn(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert 0 < drive_hits(redis_url, 32, concurrency=4, floor=True) < 0.1
    main([redis_url, "20", "--concurrency", "2", "--floor"])
    assert "20 floor answers, 2 at a time:" in capsys.readouterr().out
