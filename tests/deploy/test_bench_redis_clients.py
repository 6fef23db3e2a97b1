"""The Redis client comparison script runs and checks each client's answers."""

from __future__ import annotations

import pytest

from deploy.bench import redis_clients


def test_the_comparison_runs_each_client_on_the_lookup_and_the_get(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    redis_clients.main(
        [
            "--redis-url",
            redis_url,
            "--rounds",
            "2",
            "--requests",
            "64",
            "--clients",
            "pipe,redis-py",
        ]
    )
    out = capsys.readouterr().out
    runs = [line.split()[2:4] for line in out.splitlines() if line.startswith("round")]
    assert sorted(runs) == sorted(
        [client, workload]
        for client in ("pipe", "redis-py")
        for workload in ("lookup", "get")
        for _ in range(2)
    )
    assert "vs pipe" in out
