"""The audit log: a hash chain in one Redis stream, written by the CLI and the origin.

Every record is a flat map of strings in the stream ``prism:audit``::

    ts       ISO 8601 UTC, milliseconds
    action   key.create | key.revoke | policy.set | policy.clear | policy.refuse |
             budget.refuse | ratelimit.refuse
    project  the project concerned
    actor    who: a login name for CLI changes, ``key:<key id>`` for a refusal
    before   JSON of the state before the change ("" for none)
    after    JSON of the state after it ("" for none)
    detail   JSON of anything else (a refusal's model and code; a rate limit refusal's
             kind, scope and count, batched by origin.governance.rate_limiter.RefusalLog)
    prev     the previous record's ``hash`` (64 zeros for the first record)
    hash     SHA-256 of this record's canonical form: every field but ``hash``, as JSON
             with sorted keys

``prism:audit:head`` holds the last record's hash. A writer appends only if the head is
still the ``prev`` it sealed its record with (atomically: the Lua script below, or a
WATCHed transaction), so concurrent writers cannot fork the chain. Changing a field of a
record breaks its hash; deleting one breaks the next record's ``prev``; cutting the end
leaves the head pointing past the last record. Whoever can rewrite the whole stream and
the head can rewrite history: the chain detects edits, not a full forgery.

This module is the chain (pure) plus the origin's writer; ``deploy.audit_log`` is the
CLI's side (redis-py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from ..connection.redis_client import RedisClient, RedisClientError

__all__ = [
    "APPEND_SCRIPT",
    "AUDIT_HEAD",
    "AUDIT_STREAM",
    "GENESIS",
    "AuditWriter",
    "Broken",
    "audit_record",
    "record_hash",
    "seal",
    "verify_chain",
]

log = logging.getLogger("prism.origin")

AUDIT_STREAM = "prism:audit"
AUDIT_HEAD = "prism:audit:head"
GENESIS = "0" * 64
FIELDS = ("ts", "action", "project", "actor", "before", "after", "detail", "prev", "hash")

# KEYS[1] = the stream, KEYS[2] = the head; ARGV[1] = the prev the record was sealed with,
# ARGV[2] = its hash, ARGV[3..] = field, value, ... Appends only if the head is still
# ARGV[1]; otherwise returns {0, head} and the writer seals again on that head.
APPEND_SCRIPT = (
    """
local head = redis.call('GET', KEYS[2]) or '"""
    + GENESIS
    + """'
if head ~= ARGV[1] then return {0, head} end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
redis.call('SET', KEYS[2], ARGV[2])
return {1, id}
"""
)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _json(value: object) -> str:
    return "" if value is None else json.dumps(value, sort_keys=True, separators=(",", ":"))


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def audit_record(
    action: str,
    project: str,
    actor: str | None,
    *,
    before: object = None,
    after: object = None,
    detail: object = None,
) -> dict[str, str]:
    """An unsealed record (no ``prev``/``hash`` yet); ``before``/``after``/``detail`` are
    anything JSON can hold, None for nothing."""
    return {
        "ts": _now(),
        "action": action,
        "project": project,
        "actor": actor or "unknown",
        "before": _json(before),
        "after": _json(after),
        "detail": _json(detail),
    }


def record_hash(fields: Mapping[str, str | bytes]) -> str:
    """SHA-256 of the record's canonical form (every field but ``hash``)."""
    canonical = {_text(k): _text(v) for k, v in fields.items() if _text(k) != "hash"}
    data = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(data.encode()).hexdigest()


def seal(fields: Mapping[str, str], prev: str) -> dict[str, str]:
    """``fields`` chained after the record whose hash is ``prev``."""
    sealed = {k: v for k, v in fields.items() if k not in ("prev", "hash")}
    sealed["prev"] = prev
    sealed["hash"] = record_hash(sealed)
    return sealed


@dataclass(frozen=True, slots=True)
class Broken:
    record_id: str  # the first record that does not verify ("" for an empty stream)
    reason: str
    checked: int  # records verified before it


def verify_chain(
    records: Iterable[tuple[str, Mapping[str, str]]], head: str | None
) -> tuple[int, Broken | None]:
    """(records checked, the first break or None). ``records`` in stream order."""
    prev = GENESIS
    count = 0
    last_id = ""
    for record_id, fields in records:
        if fields.get("prev") != prev:
            return count, Broken(
                record_id,
                "its prev does not match the record before it: a record before it was "
                "deleted, inserted or rewritten",
                count,
            )
        expected = record_hash(fields)
        if fields.get("hash") != expected:
            return count, Broken(
                record_id, "its content does not match its hash: it was changed", count
            )
        prev = expected
        last_id = record_id
        count += 1
    if (head or GENESIS) != prev:
        return count, Broken(
            last_id,
            "the chain's head is not the last record's hash: records after it were deleted "
            "(or the head was changed)",
            count,
        )
    return count, None


_APPEND_ATTEMPTS = 100


class AuditWriter:
    """The origin's appender, for refusals: best effort, off the request path.

    ``append`` is meant to run as a background task (``Gateway.spawn``); appends are
    serialised here (one chain, one writer at a time in this process) and at most
    ``max_pending`` wait: beyond that a record is dropped and counted, never slowing a
    request. A Redis failure drops the record and logs it.
    """

    def __init__(self, redis: RedisClient, max_pending: int = 1000) -> None:
        self._redis = redis
        self._lock = asyncio.Lock()
        self._head: str | None = None  # the last head seen; a guess, checked by the script
        self._pending = 0
        self._max_pending = max_pending
        self.dropped = 0

    def admit(self) -> bool:
        """Whether another record may wait (call before spawning ``append``)."""
        if self._pending >= self._max_pending:
            self.dropped += 1
            return False
        self._pending += 1
        return True

    async def append(self, fields: Mapping[str, str]) -> None:
        """Append one admitted record."""
        try:
            async with self._lock:
                await self._append(fields)
        except RedisClientError as error:
            self.dropped += 1
            log.warning("audit record %s dropped: %s", fields.get("action"), error)
        finally:
            self._pending -= 1

    async def _append(self, fields: Mapping[str, str]) -> None:
        prev = self._head or GENESIS
        # Each failed try means another writer appended: the chain moved on, so this one
        # converges while writers are few; a bound keeps a pathological case finite.
        for _ in range(_APPEND_ATTEMPTS):
            sealed = seal(fields, prev)
            flat = [item for pair in sealed.items() for item in pair]
            reply = await self._redis.execute(
                "EVAL", APPEND_SCRIPT, 2, AUDIT_STREAM, AUDIT_HEAD, prev, sealed["hash"], *flat
            )
            if int(reply[0]) == 1:
                self._head = sealed["hash"]
                return
            prev = _text(reply[1])  # another writer appended: seal again after it
        raise RedisClientError("the audit head kept moving; record not appended")
