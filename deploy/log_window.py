"""Reading the origin's request-log window in Redis (``origin.requestlog.redis_window``)
for `prism logs`, with sync redis-py: a request by its id, the newest records matching
filters, and new ones as they come. The filter and the entry ids a time range covers are
``origin.requestlog.record_filter``'s (the dashboard's reader uses the same). An entry
holds a chunk of records, read newest first for the newest, in order when following.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, cast

import orjson
import redis

from origin.requestlog.record_filter import RecordFilter, entries_for
from origin.requestlog.redis_window import (
    HOURS_KEY,
    NO_PROJECT,
    PROJECTS_KEY,
    entry_lines,
    ids_key,
    stream_key,
)

__all__ = ["find_record", "follow_records", "projects", "read_records"]

_PAGE = 500  # records per XREVRANGE, about

Entry = tuple[bytes, dict[bytes, bytes]]  # a stream entry as redis-py returns it (bytes)


def _decode(line: bytes) -> dict[str, Any] | None:
    record = orjson.loads(line)
    return record if isinstance(record, dict) else None


def find_record(client: redis.Redis, request_id: str) -> dict[str, Any] | None:
    """The record of request ``request_id`` while the window keeps it (None: not there):
    its place from the ids of each hour, newest first, asked in one round trip."""
    hours = cast(list[bytes], client.zrange(HOURS_KEY, 0, -1, desc=True))
    pipe = client.pipeline(transaction=False)
    for hour in hours:
        pipe.hget(ids_key(hour.decode()), request_id)
    for place in pipe.execute():
        parts = place.decode().rsplit(" ", 2) if isinstance(place, bytes) else ()
        if len(parts) != 3 or not parts[2].isdigit():
            continue  # none, or the field that makes an hour's hash expire ("")
        project, entry, index = parts
        for _, fields in cast(list[Entry], client.xrange(stream_key(project), entry, entry)):
            lines = entry_lines(fields)
            record = _decode(lines[int(index)]) if int(index) < len(lines) else None
            if record is not None and record.get("id") == request_id:
                return record
    return None


def projects(client: redis.Redis, project: str | None) -> list[str]:
    """The projects to read: the one asked for, else every one with a window."""
    if project is not None:
        return [project]
    found = sorted(
        member.decode() if isinstance(member, bytes) else str(member)
        for member in cast(set[bytes], client.smembers(PROJECTS_KEY))
    )
    return found or [NO_PROJECT]


def read_records(
    client: redis.Redis, project_names: Sequence[str], where: RecordFilter, limit: int
) -> list[dict[str, Any]]:
    """The newest ``limit`` records matching ``where`` across the projects, oldest first
    (each record once, however often a retried batch wrote it)."""
    found: dict[str, dict[str, Any]] = {}
    for project in project_names:
        mine = 0
        for record in _newest(client, stream_key(project), where):
            if str(record.get("id")) not in found:
                found[str(record.get("id"))] = record
                mine += 1
                if mine >= limit:  # the newest ``limit`` overall are among each's newest
                    break
    newest = sorted(found.values(), key=lambda r: r.get("ts", 0.0), reverse=True)[:limit]
    return newest[::-1]


def _newest(client: redis.Redis, key: str, where: RecordFilter) -> Iterator[dict[str, Any]]:
    """Matching records of one stream, newest first, read a few entries at a time."""
    high, low = where.entry_bounds()
    entries_read = records_seen = 0
    count = 1
    while True:
        entries = cast(list[Entry], client.xrevrange(key, high, low, count=count))
        for _, fields in entries:
            lines = entry_lines(fields)
            entries_read += 1
            records_seen += len(lines)
            for line in reversed(lines):
                record = _decode(line)
                if record is not None and where.matches(record):
                    yield record
        if len(entries) < count:
            return
        high = "(" + entries[-1][0].decode()
        count = entries_for(_PAGE, records_seen, entries_read)


def follow_records(
    client: redis.Redis, project_names: Sequence[str], where: RecordFilter, block_ms: int = 5000
) -> Iterator[dict[str, Any] | None]:
    """New records as they reach the window (XREAD BLOCK), matching ``where``, in the
    order written; None after each ``block_ms`` with nothing new, so a caller may stop.
    An entry arrives whole: following its id misses and repeats nothing."""
    last: dict[str, str] = {}
    for project in project_names:  # from each stream's newest entry now ("0-0": none yet)
        key = stream_key(project)
        newest = cast(list[Entry], client.xrevrange(key, "+", "-", count=1))
        last[key] = newest[0][0].decode() if newest else "0-0"
    while True:
        replies = cast(
            list[tuple[bytes, list[Entry]]],
            client.xread(last, block=block_ms),  # type: ignore[arg-type]
        )
        if not replies:
            yield None
            continue
        for stream, entries in replies:
            for entry, fields in entries:
                last[stream.decode()] = entry.decode()
                for line in entry_lines(fields):
                    record = _decode(line)
                    if record is not None and where.matches(record):
                        yield record
