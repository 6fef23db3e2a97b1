"""The semantic index: question vectors per partition, in Redis, shared by every origin.

``SemanticIndex`` is what the semantic cache needs; ``RedisHashIndex`` implements it on
plain Redis (7.0, no search module). One hash per partition::

    prism:sem:v1:<partition>   hash   field: the entry's fingerprint
                                      value: expiry (10 ASCII digits, unix s), the
                                      vector (float32, little-endian), the question text

A lookup reads the whole partition in one round trip (HGETALL) and compares with numpy:
partitions are exact on everything but one text, so they stay small, and each keeps at
most ``cap`` records (the ones that expire last). A record expires with its entry: it
carries the entry's expiry and is skipped once past it, the hash itself expires with
its last record, and adding prunes expired records. A record whose entry has gone
anyway (deleted, evicted) is found when it would be served, and removed.

At scale, similarity search moves into the store (Redis 8 vector sets or Redis Stack's
FT.SEARCH KNN with a partition tag filter, or Upstash Vector with the partition as
namespace): another ``SemanticIndex``, nothing else changes.
"""

from __future__ import annotations

import contextlib
import struct
import time
from typing import NamedTuple, Protocol

from ..redis_client import NoScriptError, RedisClient

__all__ = ["INDEX_KEY_PREFIX", "IndexRecord", "RedisHashIndex", "SemanticIndex", "index_key"]

INDEX_KEY_PREFIX = "prism:sem:v1:"
_EXPIRY_DIGITS = 10

# KEYS[1] = the partition's hash; ARGV = field, value, expiry (unix s), cap, now.
# Adds the record; past the cap drops expired records, then the ones expiring first;
# keeps the hash until its last record expires (EXPIRETIME: Redis 7.0+).
_ADD_SCRIPT = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local cap, now = tonumber(ARGV[4]), tonumber(ARGV[5])
if redis.call('HLEN', KEYS[1]) > cap then
  local all = redis.call('HGETALL', KEYS[1])
  local kept = {}
  for i = 1, #all, 2 do
    local expires = tonumber(string.sub(all[i + 1], 1, 10))
    if expires <= now then redis.call('HDEL', KEYS[1], all[i])
    else kept[#kept + 1] = {expires, all[i]} end
  end
  if #kept > cap then
    table.sort(kept, function(a, b) return a[1] < b[1] end)
    for i = 1, #kept - cap do redis.call('HDEL', KEYS[1], kept[i][2]) end
  end
end
local expires = tonumber(ARGV[3])
if redis.call('EXPIRETIME', KEYS[1]) < expires then redis.call('EXPIREAT', KEYS[1], expires) end
return 1
"""


def index_key(partition: str) -> str:
    return INDEX_KEY_PREFIX + partition


class IndexRecord(NamedTuple):
    fingerprint: str  # the entry's: prism:v1:<fingerprint>
    expires: int
    vector: bytes  # float32, little-endian
    text: str


class SemanticIndex(Protocol):
    async def records(self, partition: str) -> list[IndexRecord]:
        """The partition's live records (expired ones are left out)."""
        ...

    async def add(
        self, partition: str, fingerprint: str, vector: bytes, text: str, expires: int
    ) -> None: ...

    async def remove(self, partition: str, fingerprint: str) -> None: ...


def encode_record(vector: bytes, text: str, expires: int) -> bytes:
    return b"%010d" % expires + struct.pack("<I", len(vector)) + vector + text.encode()


def decode_record(fingerprint: bytes | str, value: bytes) -> IndexRecord | None:
    try:
        expires = int(value[:_EXPIRY_DIGITS])
        (size,) = struct.unpack_from("<I", value, _EXPIRY_DIGITS)
        start = _EXPIRY_DIGITS + 4
        vector = value[start : start + size]
        if len(vector) != size or size % 4:
            return None
        text = value[start + size :].decode()
        fp = fingerprint.decode() if isinstance(fingerprint, bytes) else fingerprint
    except (ValueError, struct.error, UnicodeDecodeError):
        return None
    return IndexRecord(fp, expires, vector, text)


class RedisHashIndex:
    """``SemanticIndex`` on plain Redis hashes (see the module docstring)."""

    def __init__(self, redis: RedisClient, cap: int = 50) -> None:
        self._redis = redis
        self._cap = cap
        self._sha: bytes | None = None

    async def records(self, partition: str) -> list[IndexRecord]:
        reply = await self._redis.execute("HGETALL", index_key(partition))
        now = time.time()
        found: list[IndexRecord] = []
        for i in range(0, len(reply) - 1, 2):
            record = decode_record(reply[i], reply[i + 1])
            if record is not None and record.expires > now:
                found.append(record)
        return found

    async def add(
        self, partition: str, fingerprint: str, vector: bytes, text: str, expires: int
    ) -> None:
        args = (
            index_key(partition),
            fingerprint,
            encode_record(vector, text, expires),
            expires,
            self._cap,
            int(time.time()),
        )
        if self._sha is not None:
            with contextlib.suppress(NoScriptError):  # Redis restarted or was flushed
                await self._redis.execute("EVALSHA", self._sha, 1, *args)
                return
        self._sha = await self._redis.execute("SCRIPT", "LOAD", _ADD_SCRIPT)
        await self._redis.execute("EVALSHA", self._sha, 1, *args)

    async def remove(self, partition: str, fingerprint: str) -> None:
        await self._redis.execute("HDEL", index_key(partition), fingerprint)
