"""The CLI's side of the audit log (redis-py): append inside the same transaction as the
change it records, read, follow and verify. The chain itself is ``origin.governance.audit``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, cast

import redis

from origin.governance.audit import AUDIT_HEAD, AUDIT_STREAM, GENESIS, Broken, seal, verify_chain

__all__ = ["AUDIT_HEAD", "append", "follow", "head", "read", "stage", "verify"]

_PAGE = 1000


def head(pipe: redis.client.Pipeline) -> str:
    """The chain's head, read while ``pipe`` WATCHes ``AUDIT_HEAD`` (before ``multi``)."""
    value = pipe.get(AUDIT_HEAD)
    if value is None:
        return GENESIS
    return value.decode() if isinstance(value, bytes) else str(value)


def stage(pipe: redis.client.Pipeline, fields: Mapping[str, str], prev: str) -> dict[str, str]:
    """Queue the sealed record and the new head in ``pipe``'s MULTI (after ``multi``)."""
    sealed = seal(fields, prev)
    pipe.xadd(AUDIT_STREAM, cast(Any, sealed))
    pipe.set(AUDIT_HEAD, sealed["hash"])
    return sealed


def append(client: redis.Redis, fields: Mapping[str, str]) -> dict[str, str]:
    """Append one record on its own (WATCHed: a concurrent writer makes it seal again)."""
    done: list[dict[str, str]] = []

    def update(pipe: redis.client.Pipeline) -> None:
        prev = head(pipe)
        pipe.multi()
        done[:] = [stage(pipe, fields, prev)]

    client.transaction(update, AUDIT_HEAD)
    return done[0]


def _decoded(fields: Mapping[Any, Any]) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (
            v.decode() if isinstance(v, bytes) else str(v)
        )
        for k, v in fields.items()
    }


def read(client: redis.Redis, after: str = "-") -> Iterator[tuple[str, dict[str, str]]]:
    """Every record after stream id ``after`` (exclusive; "-" for all), in order, paged."""
    start = after if after == "-" else f"({after}"
    while True:
        page = cast(list[Any], client.xrange(AUDIT_STREAM, min=start, count=_PAGE))
        for record_id, fields in page:
            rid = record_id.decode() if isinstance(record_id, bytes) else str(record_id)
            yield rid, _decoded(fields)
        if len(page) < _PAGE:
            return
        last = page[-1][0]
        start = "(" + (last.decode() if isinstance(last, bytes) else str(last))


def follow(
    client: redis.Redis, after: str, block_ms: int = 5000
) -> Iterator[tuple[str, dict[str, str]]]:
    """Records appended after ``after``, as they arrive (blocks; never ends by itself)."""
    last = after
    while True:
        reply = cast(list[Any], client.xread({AUDIT_STREAM: last}, block=block_ms, count=_PAGE))
        for _stream, records in reply or []:
            for record_id, fields in records:
                last = record_id.decode() if isinstance(record_id, bytes) else str(record_id)
                yield last, _decoded(fields)


def verify(client: redis.Redis) -> tuple[int, Broken | None]:
    """(records checked, the first break or None) over the whole chain and its head."""
    raw = client.get(AUDIT_HEAD)
    current = raw.decode() if isinstance(raw, bytes) else raw
    return verify_chain(read(client), current)
