"""The Redis window on a real Redis: capped per project by count and by age, and a request
id found without a scan."""

from __future__ import annotations

import asyncio

import redis

from deploy.log_window import find_record
from origin.connection.redis_pipe import RedisPipe
from origin.requestlog.redis_window import ID_KEY_PREFIX, PROJECTS_KEY, RedisWindowSink, stream_key


def _records(project: str, count: int, ts: float) -> list[dict[str, object]]:
    return [
        {"id": f"{project}-{n}", "project": project, "ts": ts, "status": 200} for n in range(count)
    ]


def test_the_window_is_capped_per_project_and_each_id_found(redis_url: str) -> None:
    async def write() -> None:
        sink = RedisWindowSink(RedisPipe(redis_url, 1.0), window=10, age=3600)
        for _ in range(3):  # three flushes of 200 records each, for two projects
            await sink.write(_records("big", 200, 1.0) + _records("small", 3, 1.0))
        await sink.close()

    asyncio.run(write())
    admin = redis.Redis.from_url(redis_url)
    # MAXLEN ~ trims whole stream nodes (100 entries each): at least the window is kept,
    # never much more than a node beyond it.
    assert 10 <= admin.xlen(stream_key("big")) <= 110
    assert admin.xlen(stream_key("small")) == 9
    assert {m.decode() for m in admin.smembers(PROJECTS_KEY)} == {"big", "small"}  # type: ignore[union-attr]
    assert 0 < admin.ttl(ID_KEY_PREFIX + "big-199") <= 3600
    assert 0 < admin.ttl(stream_key("big")) <= 3600
    record = find_record(admin, "small-2")
    assert record is not None and record["project"] == "small"


def test_records_older_than_the_age_are_trimmed(redis_url: str) -> None:
    now = [1_000_000.0]

    async def write() -> None:
        sink = RedisWindowSink(
            RedisPipe(redis_url, 1.0), window=100_000, age=60, clock=lambda: now[0]
        )
        await sink.write(_records("aged", 300, 0.0))
        now[0] = 10**10  # everything written so far is far older than the age
        await sink.write(_records("aged", 1, 0.0))
        await sink.close()

    asyncio.run(write())
    # MINID ~ also trims whole nodes: the 300 old entries' full nodes go.
    assert redis.Redis.from_url(redis_url).xlen(stream_key("aged")) <= 101
