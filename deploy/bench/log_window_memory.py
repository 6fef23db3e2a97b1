"""What the request log's Redis window costs in memory, per million records.

Writes ``count`` realistic records (a miss's: attempts, stages, tokens, cost) through the
Redis window's own sink (``origin.requestlog.redis_window``) in batches of 1,000, into an
otherwise empty Redis, and reads ``used_memory`` before and after; the id keys are
measured apart (written first without, then with them)::

    redis-server --port 6395 --save '' --daemonize yes
    python -m deploy.bench.log_window_memory redis://127.0.0.1:6395/0 100000
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import redis

from origin.connection.redis_pipe import RedisPipe
from origin.requestlog.redis_window import RedisWindowSink

__all__ = ["main", "measure"]

_BATCH = 1000


def _record(n: int) -> dict[str, Any]:
    return {
        "ts": time.time(),
        "id": f"5f1c2a9b{n:08x}",
        "source": "origin",
        "method": "POST",
        "path": "/v1/chat/completions",
        "status": 200,
        "layer": "miss",
        "stages": {"auth": 0.041, "parse": 0.052, "redis": 0.412, "upstream": 412.377},
        "ttfb_ms": 413.102,
        "total_ms": 413.511,
        "api": "chat",
        "project": "acme",
        "key": "k7d3f09a21",
        "region": "eu-west",
        "model": "gpt-4o-mini",
        "stream": False,
        "fingerprint": "9c4e1f0b2a7d8e6f5c3b1a0d9e8f7c6b5a4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b",
        "provider": "openai",
        "answered_model": "gpt-4o-mini",
        "tokens_in": 412,
        "tokens_out": 96,
        "cost_usd": 0.0001194,
        "attempts": [{"provider": "openai", "model": "gpt-4o-mini", "status": 200, "ms": 412.3}],
    }


async def _write(url: str, count: int, with_ids: bool) -> None:
    sink = RedisWindowSink(RedisPipe(url, 5.0), window=count * 2, age=86_400)
    for start in range(0, count, _BATCH):
        batch = [_record(n) for n in range(start, min(count, start + _BATCH))]
        if not with_ids:
            for record in batch:
                del record["id"]
        await sink.write(batch)
    await sink.close()


def measure(url: str, count: int) -> dict[str, float]:
    """Bytes per record: the stream entries alone, and with their id keys."""
    client = redis.Redis.from_url(url)
    try:
        found: dict[str, float] = {}
        for with_ids in (False, True):
            client.flushall()
            before = int(client.info("memory")["used_memory"])
            asyncio.run(_write(url, count, with_ids))
            after = int(client.info("memory")["used_memory"])
            found["with_ids" if with_ids else "stream_only"] = (after - before) / count
        return found
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("redis_url")
    parser.add_argument("count", type=int, nargs="?", default=100_000)
    args = parser.parse_args()
    found = measure(args.redis_url, args.count)
    for name, per_record in found.items():
        print(f"{name}: {per_record:.0f} bytes/record, {per_record:.0f} MB per million")


if __name__ == "__main__":
    main()
