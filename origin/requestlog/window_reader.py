"""Reading the request-log window (``origin.requestlog.redis_window``) from the origin,
on a Redis client of its own (its replies are bulky: no request's command waits behind
them), for the dashboard's Requests page: a request by its id, and the newest records
matching a ``RecordFilter``, a page at a time.

Pages are newest first by when a record reached the window (its entry id's millisecond, a
second or so after its ``ts``; an edge's records a few seconds), then by ``ts``, then by
its place (project, entry, index in the entry): one order across the streams, exact and
cheap to resume (the records a batch wrote in the same millisecond, every project's, are
in ``ts`` order). A cursor is the last record's key, "{entry id} {index} {ts} {project}":
the next page is what lies below it in every stream, read from that millisecond down,
each stream to the end of the millisecond its page's last record is in (within one, an
entry's records need not be in ``ts`` order). A record a retried batch wrote twice is
shown once on a page (it may show again on the next).

A filter that few records match could read the whole window (10,000 records a project,
about 100 ms each): a page reads ``BUDGET`` records at most (decoded and matched: the cost
is per record, whatever the entries), and when it stops short, it holds what matched in
the part read and its cursor is where the reading stopped.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ..connection.redis_client import RedisClient
from .record_filter import FilterError, RecordFilter, entries_for
from .redis_window import HOURS_KEY, NO_PROJECT, PROJECTS_KEY, entry_lines, ids_key, stream_key

__all__ = ["BUDGET", "Cursor", "Page", "WindowReader"]

# Records per XREVRANGE, about: decoding and matching them holds the event loop about a
# millisecond (a reply of bodies, 64 KB answers, a few MB at most).
_SCAN = 100
# Records one page reads at most, over its streams (each its share): about 200 ms of
# this process's time, however many projects and however rare the match.
BUDGET = 20_000


@dataclass(frozen=True, slots=True, order=True)
class Cursor:
    """A record's key in the order: its entry's millisecond, its ``ts``, then its place
    (project, entry's sequence number, index in the entry), which no other record has."""

    ms: int
    ts: float
    project: str
    seq: int
    index: int

    @classmethod
    def parse(cls, text: str) -> Cursor:
        parts = text.split(" ", 3)
        try:
            ms, _, seq = parts[0].partition("-")
            if len(parts) != 4 or not (ms.isdigit() and seq.isdigit() and parts[1].isdigit()):
                raise ValueError
            ts = float(parts[2])
            if math.isnan(ts):
                raise ValueError
            return cls(int(ms), ts, parts[3], int(seq), int(parts[1]))
        except ValueError:
            raise FilterError("before", f"{text[:60]!r} is not a cursor this page gave") from None

    @classmethod
    def below(cls, ms: int) -> Cursor:
        """Below every record of millisecond ``ms``, above every older one."""
        return cls(ms, -math.inf, "", 0, 0)

    def __str__(self) -> str:
        return f"{self.ms}-{self.seq} {self.index} {self.ts!r} {self.project}"


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
        """The record of request ``request_id`` while the window keeps it (None: not there):
        its place from the ids of each hour, newest first, asked all at once."""
        redis = self._redis
        hours = await redis.execute("ZRANGE", HOURS_KEY, 0, -1, "REV")
        places = await asyncio.gather(
            *(redis.execute("HGET", ids_key(hour.decode()), request_id) for hour in hours or ())
        )
        for place in places:
            parts = place.decode().rsplit(" ", 2) if isinstance(place, bytes) else ()
            if len(parts) != 3 or not parts[2].isdigit():
                continue  # none, or the field that makes an hour's hash expire ("")
            project, entry, index = parts
            for _, fields in await redis.execute(
                "XRANGE", stream_key(project), entry, entry, "COUNT", 1
            ):
                lines = entry_lines(fields)
                record = _decode(lines[int(index)]) if int(index) < len(lines) else None
                if record is not None and record.get("id") == request_id:
                    return record
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
        match reads ``budget`` records at most: the page then holds what matched in the
        part read (perhaps nothing), and its cursor goes on from there."""
        budget = max(1, self._budget // max(1, len(project_names)))
        parts = [
            await self._newest(project, where, limit + 1, before, budget)
            for project in project_names
        ]
        # Each stream is read whole down to where it stopped: the page, to the highest.
        frontier = max((stop for _, stop in parts if stop is not None), default=None)
        found = [
            item for part, _ in parts for item in part if frontier is None or item[0] >= frontier
        ]
        found.sort(key=lambda item: item[0], reverse=True)
        seen: set[str] = set()
        records: list[dict[str, Any]] = []
        last: Cursor | None = None
        for at, record in found:
            request_id = str(record.get("id"))
            if request_id in seen:
                continue
            if len(records) == limit:  # one more beyond the page: there is a next page
                return Page(records, last)
            seen.add(request_id)
            records.append(record)
            last = at
        return Page(records, frontier)

    async def _newest(
        self, project: str, where: RecordFilter, want: int, before: Cursor | None, budget: int
    ) -> tuple[list[tuple[Cursor, dict[str, Any]]], Cursor | None]:
        """The ``want`` first matching records of one stream in the order, below
        ``before``: read newest entry first, to the end of the millisecond the
        ``want``-th is in (the rest of that millisecond may come before it by ``ts``),
        or the one where ``budget`` records had been read; and then where reading
        stopped, below that millisecond (None: the stream was read to its end)."""
        high, low = where.entry_bounds()
        if before is not None and (high == "+" or int(high) >= before.ms):
            # That whole millisecond, below the cursor by ts and place; none of it after a
            # stop (the cursor is below each of its records).
            high = str(before.ms - 1 if before.ts == -math.inf else before.ms)
        key, redis = stream_key(project), self._redis
        found: list[tuple[Cursor, dict[str, Any]]] = []
        read = entries_read = records_seen = 0
        stop_below: int | None = None  # read to the end of this millisecond, then stop
        count = 1
        while True:
            await redis.drain()  # queue behind no backlog of our own
            entries = await redis.execute("XREVRANGE", key, high, low, "COUNT", count)
            for entry, fields in entries or ():
                ms_text, _, seq_text = entry.partition(b"-")
                ms, seq = int(ms_text), int(seq_text)
                if stop_below is not None and ms < stop_below:
                    return found, Cursor.below(stop_below)
                lines = entry_lines(fields)
                entries_read += 1
                records_seen += len(lines)
                for index in range(len(lines) - 1, -1, -1):
                    record = _decode(lines[index])
                    if record is None:
                        continue
                    at = Cursor(ms, float(record.get("ts", 0.0)), project, seq, index)
                    if before is not None and at >= before:
                        continue  # the cursor's millisecond, above it
                    read += 1
                    if where.matches(record):
                        found.append((at, record))
                        if len(found) == want and stop_below is None:
                            stop_below = ms
                    if read >= budget and stop_below is None:
                        stop_below = ms
            if not entries or len(entries) < count:
                return found, None  # the stream read to its end (or to ``since``)
            high = "(" + entries[-1][0].decode()
            wanted = min(_SCAN, want - len(found), budget - read)
            count = 1 if stop_below is not None else entries_for(wanted, records_seen, entries_read)


def _decode(line: bytes) -> dict[str, Any] | None:
    record = orjson.loads(line)
    return record if isinstance(record, dict) else None
