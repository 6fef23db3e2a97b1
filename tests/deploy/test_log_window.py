"""`prism logs`' reader of the window (``deploy.log_window``) on a real Redis written by
the real sink, entries of many records: the newest across projects, each once, and
following new records in order with no gap or repeat."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis

from deploy.log_window import follow_records, read_records
from origin.connection.redis_pipe import RedisPipe
from origin.requestlog.record_filter import RecordFilter
from origin.requestlog.redis_window import RedisWindowSink
from tests.origin.requestlog.samples import lines


def records(
    project: str, start: int, count: int, base: float | None = None
) -> list[dict[str, Any]]:
    at = time.time() if base is None else base
    return [
        {"id": f"{project}-{n}", "project": project, "ts": at + n * 1e-3, "status": 200 + n % 2}
        for n in range(start, start + count)
    ]


def write(redis_url: str, *batches: list[dict[str, Any]]) -> None:
    async def run() -> None:
        sink = RedisWindowSink(RedisPipe(redis_url, 5.0), window=10_000, age=3600)
        for batch in batches:
            await sink.write(lines(batch))
        await sink.close()

    asyncio.run(run())


def test_the_newest_records_across_projects_each_once(redis_url: str, admin: redis.Redis) -> None:
    base = time.time()
    batch = records("a", 0, 230, base) + records("b", 0, 5, base + 0.2095)  # b's among a's last
    write(redis_url, batch, batch[200:])  # the last 35 written twice: a retried batch
    newest = read_records(admin, ["a", "b"], RecordFilter(), 25)
    by_time = sorted(batch, key=lambda r: r["ts"])
    assert [r["id"] for r in newest] == [r["id"] for r in by_time][-25:]  # oldest first
    assert {"b-0", "b-4"} <= {r["id"] for r in newest}
    odd = read_records(admin, ["a"], RecordFilter(status="201"), 200)
    assert [r["id"] for r in odd] == [f"a-{n}" for n in range(1, 230, 2)][-200:]


def test_following_gives_each_new_record_once_in_order(redis_url: str, admin: redis.Redis) -> None:
    write(redis_url, records("f", 0, 10))  # there before: not followed
    following = follow_records(admin, ["f", "g"], RecordFilter(status="200"), block_ms=50)
    assert next(following) is None  # nothing new yet: where each stream ends is taken
    write(redis_url, records("f", 10, 150), records("g", 0, 3) + records("f", 160, 70))
    wanted = [f"f-{n}" for n in range(10, 230) if n % 2 == 0] + ["g-0", "g-2"]
    seen: list[str] = []
    deadline = time.monotonic() + 10
    while len(seen) < len(wanted) and time.monotonic() < deadline:
        record = next(following)
        if record is not None:
            seen.append(record["id"])
    assert sorted(seen) == sorted(wanted) and len(seen) == len(set(seen))
    mine = [rid for rid in seen if rid.startswith("f-")]
    assert mine == [rid for rid in wanted if rid.startswith("f-")]  # each stream in order
    assert next(following) is None  # and nothing more
