"""The origin's reader of the Redis window (``origin.requestlog.window_reader``) on a real
Redis, written by the real sink: pages through every project's stream in one order with
no gap or repeat, within and across entries of many records, filters held across pages,
a page's budget in records, a record a retried batch wrote twice shown once, and a request
found by id."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest
import redis

from origin.connection.redis_pipe import RedisPipe
from origin.requestlog.record_filter import FilterError, RecordFilter
from origin.requestlog.redis_window import RedisWindowSink, entry_records, stream_key
from origin.requestlog.window_reader import Cursor, WindowReader
from tests.origin.requestlog.samples import lines

PROJECTS = ("acme", "beta", "-")
LAYERS = ("miss", "redis", "semantic")


def batches(now: float) -> list[list[dict[str, Any]]]:
    """Five flushes of 12 records each, spread over the projects and layers; each batch's
    records a millisecond apart, so one batch's entries share a millisecond or two."""
    found = []
    for b in range(5):
        batch = []
        for n in range(12):
            index = b * 12 + n
            record: dict[str, Any] = {
                "ts": now - 10 + index * 0.01,
                "id": f"r{index:03d}",
                "layer": LAYERS[index % 3],
                "status": 200 if index % 5 else 502,
            }
            project = PROJECTS[index % 3]
            if project != "-":
                record["project"] = project
            batch.append(record)
        found.append(batch)
    return found


async def write(redis_url: str, parts: list[list[dict[str, Any]]]) -> None:
    sink = RedisWindowSink(RedisPipe(redis_url, 5.0), window=10_000, age=3600)
    for part in parts:
        await sink.write(lines(part))
    await sink.close()


def the_order(redis_url: str, projects: tuple[str, ...] = PROJECTS) -> list[str]:
    """Every record's id in the reader's order, from the streams as Redis holds them."""
    admin = redis.Redis.from_url(redis_url)
    keyed = []
    for project in projects:
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], admin.xrange(stream_key(project)))
        for entry, fields in entries:
            ms, seq = (int(part) for part in entry.split(b"-"))
            for index, record in enumerate(entry_records(fields)):
                keyed.append(((ms, record["ts"], project, seq, index), record["id"]))
    admin.close()
    return [rid for _, rid in sorted(keyed, reverse=True)]


async def every_page(
    reader: WindowReader, where: RecordFilter, limit: int
) -> list[list[dict[str, Any]]]:
    pages, before = [], None
    while True:
        page = await reader.page(PROJECTS, where, limit, before)
        pages.append(page.records)
        if page.next is None:
            return pages
        before = Cursor.parse(str(page.next))  # as a client sends it back


def test_pages_cover_every_stream_in_one_order_without_gaps_or_repeats(redis_url: str) -> None:
    now = time.time()
    asyncio.run(write(redis_url, batches(now)))
    order = the_order(redis_url)
    assert len(order) == 60

    async def read() -> None:
        reader = WindowReader(RedisPipe(redis_url, 5.0))
        assert sorted(await reader.projects()) == sorted(PROJECTS)
        pages = await every_page(reader, RecordFilter(), 7)
        assert [len(p) for p in pages] == [7] * 8 + [4]
        assert [r["id"] for p in pages for r in p] == order
        whole = (await reader.page(PROJECTS, RecordFilter(), 200)).records
        assert [r["id"] for r in whole] == order
        # A filter holds on every page: the 502s that are Redis hits, 3 a page.
        where = RecordFilter(layer="redis", status="5xx")
        wanted = [rid for rid in order if int(rid[1:]) % 3 == 1 and int(rid[1:]) % 5 == 0]
        pages = await every_page(reader, where, 3)
        assert [r["id"] for p in pages for r in p] == wanted and len(wanted) == 4
        # A time range, paged: the records from 0.2 to 0.4 s into the 0.6 s written.
        where = RecordFilter(since=now - 9.8, until=now - 9.6)
        wanted = [rid for rid in order if now - 9.8 <= now - 10 + int(rid[1:]) * 0.01 <= now - 9.6]
        pages = await every_page(reader, where, 5)
        assert [r["id"] for p in pages for r in p] == wanted and 18 <= len(wanted) <= 22
        assert (await reader.page(["nobody"], RecordFilter(), 5)).records == []

    asyncio.run(read())


async def write_apart(redis_url: str, parts: list[list[dict[str, Any]]]) -> None:
    """``write``, each batch in a later millisecond of Redis's clock than the one before
    (a page reads whole milliseconds: this makes each batch one)."""
    client = RedisPipe(redis_url, 5.0)
    sink = RedisWindowSink(client, window=10_000, age=3600)
    for part in parts:
        await sink.write(lines(part))
        seconds, micros = await client.execute("TIME")
        written = int(seconds) * 1000 + int(micros) // 1000
        while True:  # until Redis's clock has passed the millisecond just written
            seconds, micros = await client.execute("TIME")
            if int(seconds) * 1000 + int(micros) // 1000 > written:
                break
    await sink.close()


def test_a_page_reads_its_budget_of_records_and_its_cursor_goes_on(redis_url: str) -> None:
    asyncio.run(write_apart(redis_url, batches(time.time())))  # an entry of 4 a stream each
    order = the_order(redis_url)
    wanted = [rid for rid in order if int(rid[1:]) % 5 == 0]  # the 502s: 12 of 60

    async def read() -> None:
        # 3 records a stream, inside an entry, then to the end of that millisecond: a
        # batch a page.
        reader = WindowReader(RedisPipe(redis_url, 5.0), budget=9)
        pages = await every_page(reader, RecordFilter(status="error"), 50)
        assert [r["id"] for p in pages for r in p] == wanted
        # A batch a page, or more pages where a batch's three entries straddled one of
        # Redis's milliseconds (each page still within its budget).
        assert len(pages) >= 5 and all(len(p) < 4 for p in pages)

    asyncio.run(read())


def test_pages_go_through_entries_of_a_hundred_records_exactly(redis_url: str) -> None:
    now = time.time()
    big = [{"ts": now, "id": f"b{n:03d}", "project": "acme"} for n in range(250)]
    small = [{"ts": now, "id": f"s{n:03d}", "project": "beta"} for n in range(3)]
    asyncio.run(write(redis_url, [big[:120] + small, big[120:]]))  # entries 100, 20, 3, 100, 30
    order = the_order(redis_url, ("acme", "beta"))
    # One stream's records newest first (the same ts: by entry, then index in it).
    assert len(order) == 253
    assert [rid for rid in order if rid[0] == "b"] == [f"b{n:03d}" for n in range(249, -1, -1)]

    async def read() -> None:
        reader = WindowReader(RedisPipe(redis_url, 5.0))
        for limit in (1, 7, 30, 100, 200):
            pages = await every_page(reader, RecordFilter(), limit)
            assert [r["id"] for p in pages for r in p] == order
        # Reading in budgets smaller than an entry, too.
        reader = WindowReader(RedisPipe(redis_url, 5.0), budget=14)
        pages = await every_page(reader, RecordFilter(), 10)
        assert [r["id"] for p in pages for r in p] == order

    asyncio.run(read())


def test_a_record_written_twice_is_shown_once_and_found_by_id(redis_url: str) -> None:
    batch = batches(time.time())[0]
    asyncio.run(write(redis_url, [batch, batch]))  # a batch the buffer retried

    async def read() -> None:
        reader = WindowReader(RedisPipe(redis_url, 5.0))
        page = await reader.page(PROJECTS, RecordFilter(), 50)
        assert sorted(r["id"] for r in page.records) == sorted(r["id"] for r in batch)
        assert page.next is None
        pages = await every_page(reader, RecordFilter(), 5)  # no page repeats one; none lost
        assert all(len({r["id"] for r in p}) == len(p) for p in pages)
        assert {r["id"] for p in pages for r in p} == {r["id"] for r in batch}
        found = await reader.find("r004")
        assert found is not None and found["project"] == "beta" and found["layer"] == "redis"
        assert await reader.find("never") is None

    asyncio.run(read())


@pytest.mark.parametrize(
    "text", ["", "12", "12-0 x 1.5 acme", "x-0 1 1.5 acme", "12-0 1 nan acme", "12 3 1.5 acme"]
)
def test_a_cursor_it_did_not_give_is_refused(text: str) -> None:
    with pytest.raises(FilterError) as refused:
        Cursor.parse(text)
    assert refused.value.param == "before"
    for at in (
        Cursor(1_796_307_937_049, 1796307937.0491233, "a project with spaces", 3, 42),
        Cursor.below(1_796_307_937_049),
    ):
        assert Cursor.parse(str(at)) == at  # what a page gives comes back whole
