"""What a reader of the request-log window asks for: which records (``RecordFilter``),
times as people write them (``parse_time``), the entry ids a time range covers, and how
many entries to ask for to get about so many records (``entries_for``).

One definition for every reader: `prism logs` (``deploy.log_window``, sync redis-py) and
the dashboard's Requests page (``origin.requestlog.window_reader``, the origin's client).

Entry ids are the times the records reached Redis, at or after each record's own ``ts``
(a record waits up to a second in its buffer, longer through an outage): a time range is
read by entry id with a margin (``entry_bounds``) and then held to the records' own times.
An entry holds a chunk of a batch, 1 to 100 records: a reader asks for as many entries as
the records it wants would fill at the sizes it has seen, one at first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = ["LATE_MS", "FilterError", "RecordFilter", "entries_for", "parse_time"]

LATE_MS = 300_000  # how much later than its ts a record may have reached Redis
_AGO = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_STATUS = re.compile(r"^([1-5])xx$")


class FilterError(ValueError):
    """A filter that is not one; ``param`` names it (``status``, ``since`` ...), so the
    CLI says ``--status`` and the dashboard's API a 400 with that ``param``."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def parse_time(text: str, now: float, param: str) -> float:
    """``10m``/``2h``/``1d`` ago, or an ISO 8601 time (UTC unless it says otherwise), as
    epoch seconds; ``FilterError`` saying what is wrong."""
    ago = _AGO.match(text.strip())
    if ago is not None:
        return now - float(ago.group(1)) * _UNITS[ago.group(2)]
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise FilterError(
            param, f"{text[:40]!r} is neither a duration (30s, 10m, 2h, 1d) nor an ISO time"
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
            raise FilterError(
                "status", f"{status[:20]!r} is not a status (429), a class (4xx) or 'error'"
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

    def entry_bounds(self) -> tuple[str, str]:
        """(highest, lowest) entry ids that may hold a matching record, for XREVRANGE:
        ``until`` plus the margin a record may have waited, down to ``since``."""
        high = "+" if self.until is None else str(int(self.until * 1000) + LATE_MS)
        low = "-" if self.since is None else str(int(self.since * 1000))
        return high, low


def entries_for(records: int, records_seen: int, entries_seen: int) -> int:
    """Entries to read for about ``records`` more, at the sizes seen so far (none seen:
    one entry, which may hold a hundred)."""
    if entries_seen == 0:
        return 1
    return max(1, records * entries_seen // max(1, records_seen))


def _status_matches(wanted: str, status: int) -> bool:
    if wanted == "error":
        return status >= 400
    if wanted.isdigit():
        return status == int(wanted)
    return status // 100 == int(wanted[0])
