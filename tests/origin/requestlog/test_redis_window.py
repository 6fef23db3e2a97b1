"""The Redis window on a real Redis: an entry per chunk of a batch, bounded per project by
records (entries of any size) and by age with its count kept right, a request id found
without a scan across hours, a retried batch written once, an older version's entries
read and trimmed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, cast

import pytest
import redis

from deploy.log_window import find_record, read_records
from origin.connection.redis_client import RedisReplyError
from origin.requestlog.record import Logged, logged
from origin.requestlog.record_filter import RecordFilter
from origin.requestlog.redis_window import (
    COUNT_KEY_PREFIX,
    HOURS_KEY,
    INDEX_KEY_PREFIX,
    PROJECTS_KEY,
    RedisWindowSink,
    entry_records,
    ids_key,
    stream_key,
)
from origin.requestlog.window_reader import WindowReader
from origin.settings import RedisClientKind
from tests.fixtures.origin import make_redis_client
from tests.polling import wait_for

Entry = tuple[bytes, dict[bytes, bytes]]


def records(project: str, start: int, count: int, ts: float = 1.0) -> list[Logged]:
    return [
        logged({"id": f"{project}-{n}", "project": project, "ts": ts, "status": 200})
        for n in range(start, start + count)
    ]


def write(
    redis_url: str,
    batches: list[list[Logged]],
    window: int = 10_000,
    age: int = 3600,
    clock: Callable[[], float] | None = None,
    kind: RedisClientKind = "pipe",
) -> None:
    async def run() -> None:
        client = make_redis_client(kind, redis_url, 5.0)
        sink = (
            RedisWindowSink(client, window, age)
            if clock is None
            else RedisWindowSink(client, window, age, clock)
        )
        for batch in batches:
            await sink.write(batch)
        await sink.close()

    asyncio.run(run())


def window_of(admin: redis.Redis, project: str) -> list[tuple[bytes, list[dict[str, Any]]]]:
    """Each entry of the project's stream, oldest first, with its records; and checks
    that the index lists exactly those entries, and the count their records."""
    entries = cast(list[Entry], admin.xrange(stream_key(project)))
    found = [(entry, entry_records(fields)) for entry, fields in entries]
    for _, fields in entries:
        assert int(fields[b"n"]) == len(entry_records(fields))
    index = cast(list[bytes], admin.lrange(INDEX_KEY_PREFIX + project, 0, -1))
    assert index == [b"%s %d" % (entry, len(lines)) for entry, lines in found]
    count = admin.get(COUNT_KEY_PREFIX + project)
    assert count is not None and int(count) == sum(len(lines) for _, lines in found)
    return found


def ids(found: list[tuple[bytes, list[dict[str, Any]]]]) -> list[str]:
    return [record["id"] for _, lines in found for record in lines]


def test_a_batch_is_an_entry_per_project_and_chunk_of_its_records(
    redis_url: str, admin: redis.Redis, redis_client_kind: RedisClientKind
) -> None:
    batch = records("big", 0, 250) + records("small", 0, 3)
    batch[10:10] = records("small", 3, 1)  # projects interleaved, as requests come
    write(redis_url, [batch], kind=redis_client_kind)
    big, small = window_of(admin, "big"), window_of(admin, "small")
    # Each chunk in the batch's order (a pooled client may add the chunks in any order).
    chunks = sorted(ids([entry]) for entry in big)
    assert chunks == [
        [f"big-{n}" for n in range(s, e)] for s, e in ((0, 100), (100, 200), (200, 250))
    ]
    assert ids(small) == ["small-3", "small-0", "small-1", "small-2"]
    assert {m.decode() for m in cast(set[bytes], admin.smembers(PROJECTS_KEY))} == {"big", "small"}
    for key in (stream_key("big"), INDEX_KEY_PREFIX + "big", COUNT_KEY_PREFIX + "big"):
        assert 3590 < admin.ttl(key) <= 3600  # together, ``age`` after this write
    record = find_record(admin, "big-142")
    assert record is not None and record["project"] == "big" and record["id"] == "big-142"


def test_the_window_is_bounded_by_records_whatever_its_entries_hold(
    redis_url: str, admin: redis.Redis
) -> None:
    window, written = 250, 0
    for size in (1, 7, 100, 250, 3, 1, 1, 180, 64, 1, 99, 2):
        write(redis_url, [records("p", written, size)], window=window)
        written += size
        found = window_of(admin, "p")
        held = sum(len(lines) for _, lines in found)
        # The last ``window`` records at least; fewer than the oldest entry's more.
        assert held >= min(window, written) and held - len(found[0][1]) < window
        assert ids(found) == [f"p-{n}" for n in range(written - held, written)]
    assert read_records(admin, ["p"], RecordFilter(), 5)[-1]["id"] == f"p-{written - 1}"


def redis_ms(admin: redis.Redis) -> int:
    seconds, micros = admin.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_the_age_trims_whole_entries_and_the_count_follows(
    redis_url: str, admin: redis.Redis
) -> None:
    now = [1_000_000.0]
    write(redis_url, [records("aged", 0, 300)], age=60, clock=lambda: now[0])
    assert len(window_of(admin, "aged")) == 3
    # Far past the age by the sink's clock (entry ids are Redis's): every older entry
    # goes, whatever the window would hold; the newest always stays.
    now[0] = 10**10
    write(redis_url, [records("aged", 300, 5)], age=60, clock=lambda: now[0])
    assert ids(window_of(admin, "aged")) == [f"aged-{n}" for n in range(300, 305)]
    # By the clocks as they are: what is 60 s old goes, a batch just written stays whole.
    written = redis_ms(admin)
    wait_for(lambda: redis_ms(admin) > written + 50, 5, interval=0.005)
    write(redis_url, [records("aged", 305, 150)], age=60, clock=lambda: time.time() + 59.975)
    assert ids(window_of(admin, "aged")) == [f"aged-{n}" for n in range(305, 455)]


def test_an_id_is_found_in_the_hour_it_was_written_in_and_the_hours_are_listed(
    redis_url: str, admin: redis.Redis
) -> None:
    hour = int(time.time() // 3600) + 1  # the next hour: the clocks below are within its age
    for at, first in ((hour * 3600 - 0.5, 0), (hour * 3600 + 0.5, 3)):
        write(redis_url, [records("h", first, 3)], age=7200, clock=lambda: at)  # noqa: B023
    assert admin.hget(ids_key(hour - 1), "h-2") is not None
    assert admin.hget(ids_key(hour), "h-3") is not None and admin.hget(ids_key(hour), "h-2") is None
    assert [int(h) for h in cast(list[bytes], admin.zrange(HOURS_KEY, 0, -1))] == [hour - 1, hour]
    assert 7200 < admin.ttl(ids_key(hour)) <= 7200 + 3600
    for request_id in ("h-0", "h-2", "h-3", "h-5"):
        record = find_record(admin, request_id)
        assert record is not None and record["id"] == request_id

    async def found(request_id: str) -> dict[str, Any] | None:
        reader = WindowReader(make_redis_client("pipe", redis_url, 5.0))
        try:
            return await reader.find(request_id)
        finally:
            await reader.close()

    assert (asyncio.run(found("h-1")) or {}).get("id") == "h-1"
    assert (asyncio.run(found("h-4")) or {}).get("id") == "h-4"
    for nobody in ("never", ""):  # ("": the field that makes each hour's hash expire)
        assert asyncio.run(found(nobody)) is None and find_record(admin, nobody) is None
    # Hours past the age are no longer listed: their ids' records are gone.
    later = (hour + 10) * 3600.0
    write(redis_url, [records("h", 6, 1)], age=7200, clock=lambda: later)
    assert [int(h) for h in cast(list[bytes], admin.zrange(HOURS_KEY, 0, -1))] == [hour + 10]


def sink(redis_url: str) -> RedisWindowSink:
    return RedisWindowSink(make_redis_client("pipe", redis_url, 5.0), 10_000, 3600)


def test_a_retried_batch_writes_only_what_its_failure_left_out(
    redis_url: str, admin: redis.Redis
) -> None:
    async def run() -> None:
        writer = sink(redis_url)
        await writer.write(records("r", 0, 2))
        batch = records("r", 2, 150)
        admin.delete(COUNT_KEY_PREFIX + "r")
        admin.hset(COUNT_KEY_PREFIX + "r", "not", "a count")  # the indexing fails on it
        with pytest.raises(RedisReplyError, match="WRONGTYPE"):
            await writer.write(batch)
        assert admin.xlen(stream_key("r")) == 3  # the entries went in, not their index
        admin.delete(COUNT_KEY_PREFIX + "r")  # (counted again from the index)
        await writer.write(batch)  # the buffer's retry: the same batch
        await writer.write(records("r", 152, 1))
        await writer.close()

    asyncio.run(run())
    assert ids(window_of(admin, "r")) == [f"r-{n}" for n in range(153)]  # each once
    assert (find_record(admin, "r-151") or {}).get("id") == "r-151"


def test_entries_indexed_out_of_order_keep_their_place(redis_url: str, admin: redis.Redis) -> None:
    async def run() -> None:
        first, second = sink(redis_url), sink(redis_url)  # two origins' processes
        await second.write(records("o", 0, 2))
        admin.delete(COUNT_KEY_PREFIX + "o")
        admin.hset(COUNT_KEY_PREFIX + "o", "not", "a count")
        with pytest.raises(RedisReplyError):
            await first.write(batch := records("o", 2, 3))  # added, not indexed
        admin.delete(COUNT_KEY_PREFIX + "o")
        await second.write(records("o", 5, 4))  # added after it, indexed before it
        await first.write(batch)
        await first.close()
        await second.close()

    asyncio.run(run())
    assert ids(window_of(admin, "o")) == [f"o-{n}" for n in range(9)]


def test_an_older_versions_entries_are_read_counted_and_trimmed(
    redis_url: str, admin: redis.Redis
) -> None:
    key = stream_key("old")
    for n in range(5):  # a record an entry, ``r`` alone
        admin.xadd(key, {"r": b'{"id": "old-%d", "project": "old", "ts": 1.0}' % n})
    write(redis_url, [records("old", 5, 3)], window=6)
    newest = read_records(admin, ["old"], RecordFilter(), 100)
    assert [r["id"] for r in newest] == [f"old-{n}" for n in range(8)]
    assert admin.get(COUNT_KEY_PREFIX + "old") == b"8"  # the old five indexed as one entry
    write(redis_url, [records("old", 8, 6)], window=6)  # enough new ones: the old go
    assert ids(window_of(admin, "old")) == [f"old-{n}" for n in range(8, 14)]
