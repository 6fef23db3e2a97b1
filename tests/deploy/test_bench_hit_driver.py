"""The in-process Redis-hit driver (for instruction counts) really serves Redis hits."""

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
