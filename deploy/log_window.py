"""Reading the origin's request-log window in Redis (``origin.requestlog.redis_window``):
a request by its id, the newest records matching filters, and new ones as they come.

Entry ids are the times the records reached Redis, at or after each record's own ``ts``
(a record waits up to a second in its buffer, longer through an outage): a time range is
read by entry id with a margin and then held to the records' own times.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import orjson
import redis

from origin.requestlog.redis_window import (
    NO_PROJECT,
    PROJECTS_KEY,
    RECORD_FIELD,
    id_key,
    stream_key,
)

__all__ = ["RecordFilter", "find_record", "follow_records", "parse_time", "read_records"]

_PAGE = 500
_LATE_MS = 300_000  # how much later than its ts a record may have reached Redis
_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_STATUS = re.compile(r"^([1-5])xx$")

Entry = tuple[bytes, dict[bytes, bytes]]  # a stream entry as redis-py returns it (bytes)


def parse_time(text: str, now: float, option: str) -> float:
    """``10m``/``2h``/``1d`` ago, or an ISO 8601 time (UTC unless it says otherwise), as
    epoch seconds; ``ValueError`` saying what is wrong."""
    ago = _AGO.match(text.strip())
    if ago is not None:
        return now - float(ago.group(1)) * _UNITS[ago.group(2)]
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{option}: {text[:40]!r} is neither a duration (30s, 10m, 2h, 1d) nor an ISO time"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


@dataclass(frozen=True, slots=True)
class RecordFilter:
    """What a record must match (None: anything)."""

    key: str | None = None
    model: str | None = None
    layer: str | None = None
    status: str | None = None  # 429, 4xx, or "error" (400 and above)
    since: float | None = None
    until: float | None = None

    def __post_init__(self) -> None:
        status = self.status
        if status is not None and not (
            status == "error" or status.isdigit() or _STATUS.match(status)
        ):
            raise ValueError(
                f"--status: {status[:20]!r} is not a status (429), a class (4xx) or 'error'"
            )

    def matches(self, record: dict[str, Any]) -> bool:
        if self.key is not None and record.get("key") != self.key:
            return False
        if self.model is not None and self.model not in (
            record.get("model"),
            record.get("answered_model"),
        ):
            return False
        if self.layer is not None and record.get("layer") != self.layer:
            return False
        ts = record.get("ts", 0.0)
        if self.since is not None and ts < self.since:
            return False
        if self.until is not None and ts > self.until:
            return False
        return self.status is None or _status_matches(self.status, int(record.get("status", 0)))


def _status_matches(wanted: str, status: int) -> bool:
    if wanted == "error":
        return status >= 400
    if wanted.isdigit():
        return status == int(wanted)
    return status // 100 == int(wanted[0])


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
    high: str = "+" if where.until is None else str(int(where.until * 1000) + _LATE_MS)
    low = "-" if where.since is None else str(int(where.since * 1000))
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
