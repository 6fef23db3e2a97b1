"""redis-py's replies as the test's own client gets them.

redis-py types every reply ``bytes | str`` (and a stream's entries ``... | None``): which one
a client gets follows its ``decode_responses``, which the types cannot see. These narrow a
reply to what the client asked for, and check it: ``kind`` is ``bytes`` for a plain client,
``str`` for one made with ``decode_responses=True``.
"""

from __future__ import annotations

from typing import TypeVar

from redis.typing import StreamRangeResponse

__all__ = ["reply_as", "stream_fields"]

S = TypeVar("S", bytes, str)


def reply_as(kind: type[S], value: object) -> S:
    """``value`` as ``kind`` (an ``AssertionError`` when Redis answered something else)."""
    assert isinstance(value, kind), f"Redis answered {value!r}, not {kind.__name__}"
    return value


def stream_fields(kind: type[S], entries: StreamRangeResponse | None) -> list[dict[S, S]]:
    """The fields of each entry of an XRANGE or XREVRANGE reply, in the reply's order."""
    assert entries is not None
    records: list[dict[S, S]] = []
    for _, fields in entries:
        assert fields is not None
        records.append({reply_as(kind, k): reply_as(kind, v) for k, v in fields.items()})
    return records
