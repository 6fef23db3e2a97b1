"""What the request log's Redis window costs: Redis's memory per million records, and
Redis's CPU (and this process's) per record written.

Memory: writes ``count`` realistic records (a miss's: attempts, stages, tokens, cost)
through the Redis window's own sink (``origin.requestlog.redis_window``) in batches of
1,000, as the buffer sends them, into an otherwise empty Redis, and reads ``used_memory``
before and after; the id index is measured apart (written first without ids, then with).
CPU: the same records again into the default window (10,000 a project, so each write also
trims), reading Redis's ``used_cpu_user`` + ``used_cpu_sys`` (INFO) and this process's CPU
time around the writes alone. Use a Redis of its own: another client's commands would count
as the window's::

    redis-server --port 6395 --save '' --appendonly no --daemonize yes
    python -m deploy.bench.log_window_memory redis://127.0.0.1:6395/0 100000
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import redis

from origin.connection.redis_pipe import RedisPipe
from origin.requestlog.record import Logged, logged
from origin.requestlog.redis_window import RedisWindowSink

__all__ = ["main", "measure", "measure_cpu"]

_BATCH = 1000
_WINDOW = 10_000  # PRISM_LOG_WINDOW's default


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


def _batches(count: int, with_ids: bool = True) -> list[list[Logged]]:
    """The records in the buffer's batches, their JSON kept as the buffer keeps it."""
    found = []
    for start in range(0, count, _BATCH):
        batch = [_record(n) for n in range(start, min(count, start + _BATCH))]
        if not with_ids:
            for record in batch:
                del record["id"]
        found.append([logged(record) for record in batch])
    return found


async def _write(url: str, batches: list[list[Logged]], window: int) -> float:
    """Writes the batches; the CPU seconds this process spent in the sink's writes."""
    sink = RedisWindowSink(RedisPipe(url, 5.0), window=window, age=86_400)
    spent = 0.0
    for batch in batches:
        started = time.process_time()
        await sink.write(batch)
        spent += time.process_time() - started
    await sink.close()
    return spent


def measure(url: str, count: int) -> dict[str, float]:
    """Bytes per record: the stream entries alone, and with their ids' index."""
    client = redis.Redis.from_url(url)
    try:
        found: dict[str, float] = {}
        for with_ids in (False, True):
            batches = _batches(count, with_ids)
            client.flushall()
            before = int(client.info("memory")["used_memory"])
            asyncio.run(_write(url, batches, count * 2))
            after = int(client.info("memory")["used_memory"])
            found["with_ids" if with_ids else "stream_only"] = (after - before) / count
        return found
    finally:
        client.close()


def _redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def measure_cpu(url: str, count: int, window: int = _WINDOW) -> dict[str, float]:
    """Microseconds per record: Redis's CPU, and this process's in the sink's writes."""
    client = redis.Redis.from_url(url)
    try:
        batches = _batches(count)
        client.flushall()
        before = _redis_cpu(client)
        sink_seconds = asyncio.run(_write(url, batches, window))
        redis_seconds = _redis_cpu(client) - before
        return {"redis_us": redis_seconds / count * 1e6, "sink_us": sink_seconds / count * 1e6}
    finally:
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("redis_url")
    parser.add_argument("count", type=int, nargs="?", default=100_000)
    args = parser.parse_args()
    for name, per_record in measure(args.redis_url, args.count).items():
        print(f"{name}: {per_record:.0f} bytes/record, {per_record:.0f} MB per million")
    cpu = measure_cpu(args.redis_url, args.count)
    print(
        f"cpu (window {_WINDOW:,}): Redis {cpu['redis_us']:.2f} us/record,"
        f" the sink {cpu['sink_us']:.2f} us/record"
    )


if __name__ == "__main__":
    main()
