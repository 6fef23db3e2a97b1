"""Request records as the request log makes them (the fields its contract names), and a
tiny driver standing in for the buffer that feeds a sink: batches, retried until written."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from origin.requestlog.record import Logged, logged
from origin.requestlog.sink import RecordSink

DAY = 86_400.0
THURSDAY = 20_426 * DAY + 13 * 3600.0 + 0.25  # 2025-12-04 13:00:00.25 UTC

LAYERS = ("miss", "redis", "semantic", "kv", "bypass")


def record(
    index: int, ts: float = THURSDAY, project: str | None = "acme", **extra: Any
) -> dict[str, Any]:
    """The ``index``-th request: a miss every fifth, otherwise a hit of some layer."""
    layer = LAYERS[index % len(LAYERS)]
    found: dict[str, Any] = {
        "ts": ts + index * 0.001,
        "id": f"req-{index:06d}",
        "source": "origin",
        "key": "k1",
        "api": "chat",
        "method": "POST",
        "path": "/v1/chat/completions",
        "stream": index % 2 == 0,
        "model": "gpt-4o-mini",
        "answered_model": "gpt-4o-mini-2024-07-18",
        "provider": "openai",
        "attempts": [
            {"provider": "openai", "model": "gpt-4o-mini", "status": 200, "error": None, "ms": 41.5}
        ],
        "layer": layer,
        "status": 200,
        "tokens_in": 12 + index,
        "tokens_out": 30,
        "cost_usd": 0.000021 if layer == "miss" else 0.0,
        "saved_usd": 0.0 if layer == "miss" else 0.000021,
        "stages": {"auth": 0.1, "redis": 0.4},
        "ttfb_ms": 45.2,
        "total_ms": 51.0,
        "region": "eu-west-1",
        "fingerprint": f"{index:064x}",
        **extra,
    }
    if project is not None:
        found["project"] = project
    return found


def lines(records: Iterable[Mapping[str, Any]]) -> list[Logged]:
    """The records as their buffers hand them to a sink."""
    return [logged(record) for record in records]


async def drive(
    sink: RecordSink,
    records: Sequence[Mapping[str, Any]],
    batch: int = 1000,
    within: float = 15.0,
    on_failure: Callable[[Exception], None] = lambda error: None,
) -> int:
    """Hand ``records`` to ``sink`` in batches as the buffer does, each failed batch sent
    again (after a short pause, and ``on_failure``) until written or ``within`` has
    passed; the failures."""
    failures = 0
    deadline = time.monotonic() + within
    for start in range(0, len(records), batch):
        part = lines(records[start : start + batch])
        while True:
            try:
                await sink.write(part)
                break
            except Exception as error:
                failures += 1
                if time.monotonic() > deadline:
                    raise
                on_failure(error)
                await asyncio.sleep(0.05)  # the buffer's backoff, shortened
    return failures
