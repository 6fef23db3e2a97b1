"""Reading the request-log window (``origin.requestlog.redis_window``) from the origin,
on a Redis client of its own (its replies are bulky: no request's command waits behind
them), for the dashboard's Requests page: a request by its id, and the newest records
matching a ``RecordFilter``, a page at a time.

Pages are newest first by when a record reached the window (its entry id's time, a
second or so after its ``ts``; an edge's records a few seconds), then by ``ts``: the one
order a cursor resumes exactly and cheaply across streams, whose entry ids are their own
(the records a batch wrote in the same millisecond, every project's, are in ``ts``
order). A cursor is the last record's place, "{entry ms} {ts} {id}": the next page is
what lies below it in every stream, read from that millisecond down. A record a retried
batch wrote twice is shown once on a page (it may show again on the next).

A filter that few records match could read the whole window (10,000 entries a project,
about 100 ms each): a page reads ``BUDGET`` entries at most, and when it stops short, it
holds what matched in the part read and its cursor is where the reading stopped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ..connection.redis_client import RedisClient
from .record_filter import FilterError, RecordFilter
from .redis_window import NO_PROJECT, PROJECTS_KEY, RECORD_FIELD, id_key, stream_key

__all__ = ["BUDGET", "Cursor", "Page", "WindowReader"]

# Entries per XREVRANGE: decoding and matching them holds the event loop about a
# millisecond (a reply of bodies, 64 KB answers, a few MB at most).
_SCAN = 100
# Entries one page reads at most, over its streams (each its share): about 200 ms of
# this process's time, however many projects and however rare the match.
BUDGET = 20_000
_FIELD = RECORD_FIELD.encode()


@dataclass(frozen=True, slots=True, order=True)
class Cursor:
    """A record's place in the order: its entry's millisecond, its ``ts``, its id."""

    ms: int
    ts: float
    id: str

    @classmethod
    def parse(cls, text: str) -> Cursor:
        parts = text.split(" ", 2)
        try:
            if len(parts) != 3 or not parts[0].isdigit() or math.isnan(float(parts[1])):
                raise ValueError
            return cls(int(parts[0]), float(parts[1]), parts[2])
        except ValueError:
            raise FilterError("before", f"{text[:60]!r} is not a cursor this page gave") from None

    @classmethod
    def of(cls, entry: bytes, record: dict[str, Any]) -> Cursor:
        return cls(
            int(entry.partition(b"-")[0]), float(record.get("ts", 0.0)), str(record.get("id"))
        )

    def __str__(self) -> str:
        return f"{self.ms} {self.ts!r} {self.id}"


@dataclass(frozen=True, slots=True)
class Page:
    records: list[dict[str, Any]]  # newest first
    next: Cursor | None  # None: nothing older matches; else where the next page starts


class WindowReader:
    def __init__(self, redis: RedisClient, budget: int = BUDGET) -> None:
        self._redis = redis
        self._budget = budget

    async def close(self) -> None:
        await self._redis.close()

    async def find(self, request_id: str) -> dict[str, Any] | None:
        """The record of request ``request_id`` while the window keeps it (None: not there)."""
        where = await self._redis.execute("GET", id_key(request_id))
        if not isinstance(where, bytes):
            return None
        project, _, entry = where.decode().partition(" ")
        for _, fields in await self._redis.execute(
            "XRANGE", stream_key(project), entry, entry, "COUNT", 1
        ):
            return _decode(fields)
        return None

    async def projects(self) -> list[str]:
        """Every project with a window ("-": the records of no project)."""
        members = await self._redis.execute("SMEMBERS", PROJECTS_KEY)
        found = sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members or ())
        return found or [NO_PROJECT]

    async def page(
        self,
        project_names: Sequence[str],
        where: RecordFilter,
        limit: int,
        before: Cursor | None = None,
    ) -> Page:
        """The newest ``limit`` records of the projects matching ``where``, below
        ``before`` when given, and the cursor of the page after it. A filter few records
        match reads ``budget`` entries at most: the page then holds what matched in the
        part read (perhaps nothing), and its cursor goes on from there."""
        budget = max(1, self._budget // max(1, len(project_names)))
        parts = [
            await self._newest(stream_key(project), where, limit + 1, before, budget)
            for project in project_names
        ]
        # Read whole down to the highest place a stream's reading stopped short.
        frontier = max((stop for _, stop in parts if stop is not None), default=None)
        found = [
            item for part, _ in parts for item in part if frontier is None or item[0] >= frontier
        ]
        found.sort(key=lambda item: item[0], reverse=True)
        seen: set[str] = set()
        records: list[dict[str, Any]] = []
        last: Cursor | None = None
        for at, record in found:
            if at.id in seen:
                continue
            if len(records) == limit:  # one more beyond the page: there is a next page
                return Page(records, last)
            seen.add(at.id)
            records.append(record)
            last = at
        return Page(records, frontier)

    async def _newest(
        self, key: str, where: RecordFilter, want: int, before: Cursor | None, budget: int
    ) -> tuple[list[tuple[Cursor, dict[str, Any]]], Cursor | None]:
        """The ``want`` first matching records of one stream in the order, below
        ``before``: read newest entry first, to the end of the millisecond the
        ``want``-th is in (the rest of that millisecond may come before it by ``ts``).
        After ``budget`` entries, to the end of that millisecond, and the place reading
        stopped: every entry from that millisecond up has been read (None: no stop)."""
        high, low = where.entry_bounds()
        if before is not None and (high == "+" or int(high) >= before.ms):
            # That whole millisecond, below the cursor by ts and id; none of it after a
            # stop (the cursor is below each of its records).
            high = str(before.ms - 1 if before.ts == -math.inf else before.ms)
        redis = self._redis
        found: list[tuple[Cursor, dict[str, Any]]] = []
        read = 0
        stop_below: int | None = None  # read to the end of this millisecond, then stop
        stopped: Cursor | None = None
        count = min(want + 1, _SCAN, budget)  # unfiltered, the first read is the page
        while True:
            await redis.drain()  # queue behind no backlog of our own
            entries = await redis.execute("XREVRANGE", key, high, low, "COUNT", count)
            for entry, fields in entries or ():
                record = _decode(fields)
                if record is None:
                    continue
                at = Cursor.of(entry, record)
                if stop_below is not None and at.ms < stop_below:
                    return found, stopped
                if before is not None and at >= before:
                    continue  # the cursor's millisecond, above it
                read += 1
                if where.matches(record):
                    found.append((at, record))
                    if len(found) == want and stop_below is None:
                        stop_below = at.ms
                if read >= budget and stop_below is None:
                    stop_below = at.ms
                    stopped = Cursor(at.ms, -math.inf, "")  # below every record of at.ms
            if not entries or len(entries) < count:
                return found, None  # the stream read to its end (or to ``since``)
            high = "(" + entries[-1][0].decode()
            count = min(_SCAN, budget)


def _decode(fields: Sequence[bytes]) -> dict[str, Any] | None:
    """An entry's record, from its raw field list (``[b"r", json]``)."""
    for name, value in zip(fields[::2], fields[1::2], strict=True):
        if name == _FIELD:
            record = orjson.loads(value)
            return record if isinstance(record, dict) else None
    return None
