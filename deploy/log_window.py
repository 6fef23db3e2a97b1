"""Reading the origin's request-log window in Redis (``origin.requestlog.redis_window``)
for `prism logs`, with sync redis-py: a request by its id, the newest records matching
filters, and new ones as they come. The filter and the entry ids a time range covers are
``origin.requestlog.record_filter``'s (the dashboard's reader uses the same).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, cast

import orjson
import redis

from origin.requestlog.record_filter import RecordFilter
from origin.requestlog.redis_window import (
    NO_PROJECT,
    PROJECTS_KEY,
    RECORD_FIELD,
    id_key,
    stream_key,
)

__all__ = ["find_record", "follow_records", "projects", "read_records"]

_PAGE = 500

Entry = tuple[bytes, dict[bytes, bytes]]  # a stream entry as redis-py returns it (bytes)


def _decode(fields: dict[bytes, bytes]) -> dict[str, Any] | None:
    raw = fields.get(RECORD_FIELD.encode())
    if raw is None:
        return None
    record = orjson.loads(raw)
    return record if isinstance(record, dict) else None


def find_record(client: redis.Redis, request_id: str) -> dict[str, Any] | None:
    """The record of request ``request_id`` while the window keeps it (None: not there)."""
    where = client.get(id_key(request_id))
    if not isinstance(where, bytes):
        return None
    project, _, entry = where.decode().partition(" ")
    for _, fields in cast(list[Entry], client.xrange(stream_key(project), entry, entry, count=1)):
        return _decode(fields)
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
    """The newest ``limit`` records matching ``where`` across the projects, oldest first."""
    found: dict[str, dict[str, Any]] = {}
    for project in project_names:
        for record in _newest(client, stream_key(project), where):
            found.setdefault(str(record.get("id")), record)
            if len(found) >= limit * len(project_names):
                break
    newest = sorted(found.values(), key=lambda r: r.get("ts", 0.0), reverse=True)[:limit]
    return newest[::-1]


def _newest(client: redis.Redis, key: str, where: RecordFilter) -> Iterator[dict[str, Any]]:
    """Matching records of one stream, newest first, read a page at a time."""
    high, low = where.entry_bounds()
    while True:
        page = cast(list[Entry], client.xrevrange(key, high, low, count=_PAGE))
        for _, fields in page:
            record = _decode(fields)
            if record is not None and where.matches(record):
                yield record
        if len(page) < _PAGE:
            return
        high = "(" + page[-1][0].decode()


def follow_records(
    client: redis.Redis, project_names: Sequence[str], where: RecordFilter, block_ms: int = 5000
) -> Iterator[dict[str, Any] | None]:
    """New records as they reach the window (XREAD BLOCK), matching ``where``; None after
    each ``block_ms`` with nothing new, so a caller may stop."""
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
                record = _decode(fields)
                if record is not None and where.matches(record):
                    yield record
