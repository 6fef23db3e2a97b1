"""The cache entry both halves read and write (Redis and Workers KV hold the same bytes).

Layout: one line of JSON metadata, a newline, then the completion's JSON exactly
as it will be served::

    {"v":1,"created":1764400000,"ttl":86400,"model":"gpt-4o-mini","len":812,"sum":"…","usage":{…}}
    {"id":"chatcmpl-…","object":"chat.completion",…}

A plain (non-stream) hit serves the body bytes as they are, without parsing
them. ``len`` and ``sum`` (SHA-256 prefix) guard against truncation and
corruption; anything that fails to decode, has another version, or has
expired is a clean miss (``None``), never an exception. An answer from a route's fallback
target says so (``"fallback":true``, absent otherwise): the origin lets it step aside once
the route's primary is healthy again.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["ENVELOPE_VERSION", "Envelope", "decode", "encode", "entry_key"]

ENVELOPE_VERSION = 1
_SUM_LEN = 16
_META = json.JSONDecoder()
# Built once: json.dumps with any non-default option builds a new encoder per call.
_META_ENCODER = json.JSONEncoder(separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Envelope:
    created: int
    ttl: int
    model: str
    body: bytes
    usage: dict[str, Any] | None
    fallback: bool = False  # a fallback target's answer, kept until the primary is back

    def completion(self) -> dict[str, Any]:
        """The stored completion object (parsed on demand: only SSE replay needs it)."""
        value = json.loads(self.body)
        assert isinstance(value, dict)
        return value

    def expires_at(self) -> int:
        return self.created + self.ttl


def entry_key(fingerprint: str) -> str:
    """The key of an entry, the same in Redis and in Workers KV."""
    return f"prism:v{ENVELOPE_VERSION}:{fingerprint}"


def _sum(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()[:_SUM_LEN]


def encode(
    body: bytes,
    *,
    model: str,
    ttl: int,
    usage: dict[str, Any] | None = None,
    created: int | None = None,
    fallback: bool = False,
) -> bytes:
    """Wrap a completion's JSON bytes in an envelope."""
    meta: dict[str, Any] = {
        "v": ENVELOPE_VERSION,
        "created": int(time.time()) if created is None else created,
        "ttl": ttl,
        "model": model,
        "len": len(body),
        "sum": _sum(body),
        "usage": usage,
    }
    if fallback:
        meta["fallback"] = True
    return _META_ENCODER.encode(meta).encode() + b"\n" + body


def decode(data: bytes | str | None, now: float | None = None) -> Envelope | None:
    """The envelope in ``data``, or ``None`` for anything else (garbage, old, expired)."""
    if not data:
        return None
    try:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        head, sep, body = raw.partition(b"\n")
        if not sep:
            return None
        meta = _META.raw_decode(head.decode())[0]
        if not isinstance(meta, dict) or meta.get("v") != ENVELOPE_VERSION:
            return None
        created, ttl, model = meta["created"], meta["ttl"], meta["model"]
        if not (isinstance(created, int) and isinstance(ttl, int) and isinstance(model, str)):
            return None
        if meta.get("len") != len(body) or meta.get("sum") != _sum(body):
            return None
        if (time.time() if now is None else now) >= created + ttl:
            return None
        usage = meta.get("usage")
        return Envelope(
            created=created,
            ttl=ttl,
            model=model,
            body=body,
            usage=usage if isinstance(usage, dict) else None,
            fallback=meta.get("fallback") is True,
        )
    except (ValueError, KeyError, TypeError, UnicodeError):
        return None
