"""The semantic index: question vectors per partition, Redis the source of truth.

``SemanticIndex`` is what the semantic cache needs; ``RedisStreamIndex`` implements it on
plain Redis (6.2+: no search module, no vector sets; what Upstash serves too). One
stream per partition is its log::

    prism:sem:v2:<partition>   stream   f: the entry's fingerprint
                                        e: its expiry (unix s); "0" removes the fingerprint
                                        v: the vector (float16, little-endian)
                                        t: the question text

Every origin process keeps a ``Mirror`` of the partitions it has been asked about and
catches up before each search by reading only the entries added since the last one it
read (``XRANGE key (last-id +``: one round trip, empty when nothing is new, and run
while the question is being embedded). Searching is then in memory (``mirror.py``). The
stream is capped (``XADD MAXLEN ~``, the oldest first) and expires with its last
record; a record carries its entry's expiry and is skipped once past it, and a record
whose entry has gone anyway (deleted, evicted) is found when it would be served and
removed for every process (a removal entry). A process restarted, or one that dropped a
partition from its memory, reads the partition again from the start.

No miss for being early: the process that stores a question puts it in its own mirror
before the stream write (as soon as the exact entry has landed), and the add script
publishes the stream's key on ``NOTIFY_CHANNEL``, so every other process subscribed
(``notify.IndexNotifier``) catches up with a partition it mirrors at once, not at its
next question there. A lost notification costs only that: the catch-up before each
search still reads what is new.

Each engine's vectors have their own streams (``space``: "" for numpy's float32, the
first index, "int8" for onnxruntime's): ``prism:sem:v2:int8:<partition>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Protocol

from ...connection.redis_client import LoadedScript, RedisClient, RedisClientError

if TYPE_CHECKING:  # numpy is imported with the model, on the first opted-in request
    import numpy as np
    import numpy.typing as npt

    from .mirror import Candidate, Mirror

__all__ = [
    "INDEX_KEY_PREFIX",
    "NOTIFY_CHANNEL",
    "RedisStreamIndex",
    "SemanticIndex",
    "index_key",
]

INDEX_KEY_PREFIX = "prism:sem:v2:"
NOTIFY_CHANNEL = "prism:sem:v2:added"  # the add script publishes the stream's key here
READ_BATCH = 5000  # stream entries per XRANGE while catching up
MAX_RECORDS = 200_000  # per partition: the stream's cap
MAX_PARTITIONS = 4096  # mirrored in one process; the least recently asked go first

# KEYS[1] = the partition's stream; ARGV = fingerprint, expiry, vector, text, cap, channel.
# The stream expires with its last record (EXPIRETIME: Redis 7.0+); the key is published
# after the record is in, so a process notified always reads it.
_ADD_SCRIPT = """
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[5], '*',
  'f', ARGV[1], 'e', ARGV[2], 'v', ARGV[3], 't', ARGV[4])
local expires = tonumber(ARGV[2])
if redis.call('EXPIRETIME', KEYS[1]) < expires then redis.call('EXPIREAT', KEYS[1], expires) end
redis.call('PUBLISH', ARGV[6], KEYS[1])
return 1
"""


def index_key(partition: str, space: str = "") -> str:
    return INDEX_KEY_PREFIX + (f"{space}:" if space else "") + partition


class SemanticIndex(Protocol):
    async def refresh(self, partition: str) -> int:
        """Catch up with the partition; how many records it holds (0: empty)."""
        ...

    def nearest(
        self, partition: str, vector: npt.NDArray[np.float32], threshold: float, count: int
    ) -> list[Candidate]:
        """Up to ``count`` live records scoring at least ``threshold``, best first
        (as of the last ``refresh``)."""
        ...

    async def add(
        self, partition: str, fingerprint: str, vector: bytes, text: str, expires: int
    ) -> None:
        """Index a question (``vector``: float32, little-endian) until ``expires``."""
        ...

    async def remove(self, partition: str, fingerprint: str) -> None: ...


def _fields(raw: list[Any]) -> dict[bytes, bytes]:
    return {raw[i]: raw[i + 1] for i in range(0, len(raw) - 1, 2)}


class RedisStreamIndex:
    """``SemanticIndex`` on a Redis stream per partition (see the module docstring)."""

    def __init__(
        self,
        redis: RedisClient,
        dimensions: int = 384,
        max_records: int = MAX_RECORDS,
        max_partitions: int = MAX_PARTITIONS,
    ) -> None:
        self._redis = redis
        self._dimensions = dimensions
        self._max_records = max_records
        self._max_partitions = max_partitions
        self._mirrors: OrderedDict[str, Mirror] = OrderedDict()
        self._reading: dict[str, asyncio.Future[int]] = {}  # one catch-up per partition
        self._add = LoadedScript(_ADD_SCRIPT, 1)
        self.space = ""
        self._prefix = index_key("")
        self._woken: set[str] = set()  # partitions being caught up after a notification
        self._again: set[str] = set()  # ...and notified again meanwhile
        self._tasks: set[asyncio.Task[None]] = set()

    def use_space(self, space: str) -> None:
        """Index another engine's vectors (their own streams); forgets what is mirrored."""
        if space != self.space:
            self.space, self._prefix = space, index_key("", space)
            self._mirrors.clear()

    def mirror(self, partition: str) -> Mirror | None:
        return self._mirrors.get(partition)

    async def refresh(self, partition: str) -> int:
        running = self._reading.get(partition)
        if running is not None:  # another lookup is reading it: share that read
            return await asyncio.shield(running)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieve)
        self._reading[partition] = future
        try:
            count = await self._catch_up(partition)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as error:
            future.set_exception(error)
            raise
        else:
            future.set_result(count)
            return count
        finally:
            del self._reading[partition]

    async def _catch_up(self, partition: str) -> int:
        from .mirror import Mirror

        mirror = self._mirrors.get(partition)
        if mirror is None:
            mirror = self._mirrors[partition] = Mirror(self._dimensions)
            while len(self._mirrors) > self._max_partitions:
                self._mirrors.popitem(last=False)
        self._mirrors.move_to_end(partition)
        key = self._prefix + partition
        while True:
            start = b"-" if mirror.last_id == b"-" else b"(" + mirror.last_id
            entries = await self._redis.execute("XRANGE", key, start, "+", "COUNT", READ_BATCH)
            if entries:
                self._apply(mirror, entries)
            if len(entries) < READ_BATCH:
                break
        if mirror.size and mirror.dead * 2 >= mirror.size:
            mirror.compact(time.time())
        return mirror.live

    def _apply(self, mirror: Mirror, entries: list[Any]) -> None:
        width = mirror.dimensions * 2
        fingerprints: list[str] = []
        expiries: list[int] = []
        vectors: list[bytes] = []
        texts: list[str] = []

        def flush() -> None:
            if fingerprints:
                mirror.append(fingerprints, expiries, b"".join(vectors), texts)
                for column in (fingerprints, expiries, vectors, texts):
                    column.clear()

        for entry_id, raw in entries:
            mirror.last_id = entry_id
            fields = _fields(raw)
            try:
                fingerprint = fields[b"f"].decode()
                expires = int(fields[b"e"])
                if expires == 0:  # a removal: after the rows before it
                    flush()
                    mirror.remove(fingerprint)
                    continue
                vector, text = fields[b"v"], fields[b"t"].decode()
            except (KeyError, ValueError, UnicodeDecodeError):
                continue  # not a record this version wrote
            if len(vector) != width:
                if mirror.size or fingerprints or len(vector) % 2:
                    continue  # another model's: the partition's first record decides
                mirror.resize(len(vector) // 2)
                width = len(vector)
            if mirror.holds(fingerprint, expires):
                continue  # this process's own record, mirrored when it was stored
            fingerprints.append(fingerprint)
            expiries.append(expires)
            vectors.append(vector)
            texts.append(text)
        flush()

    def nearest(
        self, partition: str, vector: npt.NDArray[np.float32], threshold: float, count: int
    ) -> list[Candidate]:
        mirror = self._mirrors.get(partition)
        if mirror is None:
            return []
        return mirror.nearest(vector, threshold, count, time.time())

    async def add(
        self, partition: str, fingerprint: str, vector: bytes, text: str, expires: int
    ) -> None:
        import numpy as np

        half = np.frombuffer(vector, dtype="<f4").astype("<f2").tobytes()
        self._mirror_own(partition, fingerprint, expires, half, text)
        key = self._prefix + partition
        args = (key, fingerprint, expires, half, text, self._max_records, NOTIFY_CHANNEL)
        await self._add.run(self._redis, *args)

    def _mirror_own(
        self, partition: str, fingerprint: str, expires: int, half: bytes, text: str
    ) -> None:
        """This process's own record, findable here before the stream write returns."""
        from .mirror import Mirror

        mirror = self._mirrors.get(partition)
        if mirror is None:  # read from the start at the next catch-up, this row kept
            mirror = self._mirrors[partition] = Mirror(self._dimensions)
            while len(self._mirrors) > self._max_partitions:
                self._mirrors.popitem(last=False)
        if len(half) != mirror.dimensions * 2:
            if mirror.size or len(half) % 2:
                return  # another model's width: the stream's first record decides
            mirror.resize(len(half) // 2)
        mirror.append([fingerprint], [expires], half, [text])

    def notified(self, key: bytes) -> None:
        """A record was added to the stream ``key``: catch up now if it is mirrored here."""
        name = key.decode(errors="replace")
        if not name.startswith(self._prefix):
            return
        partition = name[len(self._prefix) :]
        if partition not in self._mirrors:
            return  # never asked here: read in full when it is
        if partition in self._woken:
            self._again.add(partition)
            return
        self._woken.add(partition)
        task = asyncio.get_running_loop().create_task(self._wake(partition))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def notified_all(self) -> None:
        """Notifications may have been lost (the subscription was down): catch up all."""
        for partition in list(self._mirrors):
            self.notified((self._prefix + partition).encode())

    async def _wake(self, partition: str) -> None:
        try:
            while True:
                self._again.discard(partition)
                running = self._reading.get(partition)
                if running is not None:  # it may have read before the new record: wait
                    with contextlib.suppress(Exception):
                        await asyncio.shield(running)
                with contextlib.suppress(RedisClientError):
                    await self.refresh(partition)
                if partition not in self._again:
                    return
        finally:
            self._woken.discard(partition)

    def stop(self) -> None:
        """Cancel the catch-ups notifications started."""
        for task in list(self._tasks):
            task.cancel()

    async def remove(self, partition: str, fingerprint: str) -> None:
        mirror = self._mirrors.get(partition)
        if mirror is not None:
            mirror.remove(fingerprint)
        # NOMKSTREAM: a removal never recreates a stream that has expired.
        await self._redis.execute(
            "XADD", self._prefix + partition, "NOMKSTREAM", "*", "f", fingerprint, "e", "0"
        )


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
