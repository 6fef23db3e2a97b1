"""The Redis window: each project's recent request records, for `prism logs`.

One stream per project, ``prism:log:{project}`` (records with no project, a refused
key's, in ``prism:log:-``), one entry per chunk of a batch (``_CHUNK`` records at most):
``n``, its record count, and ``r``, the records' JSON lines joined by newlines (the bytes
the buffer kept; JSON holds no raw newline). A record's place is its entry id and its
index in the entry. An entry of an older version, ``r`` alone, is one record: readers
split every entry the same way (``entry_lines``).

Bounded by records, not entries: ``prism:log-index:{project}`` lists the stream's entries
oldest first, as "{entry id} {n}", and ``prism:log-count:{project}`` counts their records.
After each write the oldest entries go, whole, while the newer ones alone hold ``window``
records or they are older than ``age`` (the newest always stays), then ``XTRIM MINID``
exact past them: the window keeps the project's last ``window`` records at least, and
fewer than one entry more. The three keys expire ``age`` after the last write, together.
A stream found without an index (an older version's, or its index evicted) is indexed as
one entry of its length in records, there before the first one indexed.

A request id finds its record without a scan: ``prism:log-ids:{hour}`` (the writer's epoch
hour) maps each id written that hour to "{project} {entry id} {index}", kept ``age`` and an
hour past the hour's last write; ``prism:log-id-hours`` lists the hours that have one, so
a reader asks each, newest first, in one round trip. ``prism:log-projects`` lists the
projects that have a window.

A batch is two round trips. First one plain XADD per chunk: the records never pass through
Lua, where each byte of a script's arguments costs Redis about 2.3 ns (measured: each
becomes a Lua string), so a chunk's 64 KB cost a script 150 µs before it did anything, and
a plain XADD 20 µs. Then, with the
entry ids, an HSET of each chunk's ids and one call of ``_INDEX`` per project (index,
count, trims, expiry): no command per record for this process to make or Redis to run, and
none holding Redis for more than a moment. Through this sink (``python -m
deploy.bench.log_window_memory``: 100,000 records into a window of 10,000, alternated with
the previous sink on a busy 2-core machine) a record costs Redis 1.9 µs of CPU, half of it
the HSET, where an entry and an id key per record in a script call per 100 cost 13 µs (6
on a quiet machine); and 762 bytes of memory with its id, where they cost 853.

A failed batch is retried by the buffer with the same list: its chunks are remembered as
far as each got (added, ids written, indexed), and the retry does the rest, so a failure
between the round trips writes nothing twice (a reply lost in a timeout still may: readers
show such a record once a page, and its id finds the newer copy). An entry whose indexing
never came is counted in no window, and goes with the first trim past it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from ..connection.redis_client import Arg, LoadedScript, RedisClient
from .record import Logged

__all__ = [
    "COUNT_FIELD",
    "COUNT_KEY_PREFIX",
    "HOURS_KEY",
    "IDS_KEY_PREFIX",
    "INDEX_KEY_PREFIX",
    "NO_PROJECT",
    "PROJECTS_KEY",
    "RECORDS_FIELD",
    "STREAM_KEY_PREFIX",
    "RedisWindowSink",
    "entry_lines",
    "entry_records",
    "ids_key",
    "stream_key",
]

STREAM_KEY_PREFIX = "prism:log:"
INDEX_KEY_PREFIX = "prism:log-index:"
COUNT_KEY_PREFIX = "prism:log-count:"
IDS_KEY_PREFIX = "prism:log-ids:"
HOURS_KEY = "prism:log-id-hours"
PROJECTS_KEY = "prism:log-projects"
NO_PROJECT = "-"  # the stream of records no project was identified for
COUNT_FIELD = "n"
RECORDS_FIELD = "r"
_LINES = RECORDS_FIELD.encode()


def stream_key(project: str) -> str:
    return STREAM_KEY_PREFIX + (project or NO_PROJECT)


def ids_key(hour: int | str) -> str:
    return f"{IDS_KEY_PREFIX}{hour}"


def entry_lines(fields: Sequence[bytes] | Mapping[bytes, bytes]) -> list[bytes]:
    """An entry's records' JSON lines, from its fields as a flat list (``[b"n", b"3",
    b"r", lines]``) or a mapping (redis-py's); none for an entry without ``r``."""
    if isinstance(fields, Mapping):
        lines = fields.get(_LINES)
        return [] if lines is None else lines.split(b"\n")
    for at in range(0, len(fields) - 1, 2):
        if fields[at] == _LINES:
            return fields[at + 1].split(b"\n")
    return []


def entry_records(fields: Sequence[bytes] | Mapping[bytes, bytes]) -> list[dict[str, Any]]:
    """An entry's records in the order written (one that is not a JSON object: {})."""
    found = []
    for line in entry_lines(fields):
        record = orjson.loads(line)
        found.append(record if isinstance(record, dict) else {})
    return found


_CHUNK = 100  # records per entry, and per HSET of ids: Redis runs a command whole
_AT = [b" %d" % at for at in range(_CHUNK)]  # an id's index in its entry, as its place ends

# One project's new entries indexed, the window trimmed. KEYS: the stream, its index, its
# count, the list of hours, the list of projects, the hour's ids (or ""). ARGV: the
# window (records), the oldest entry time kept (ms), the age (s), the project, the hour,
# the oldest hour still listed, then each new entry's id and record count, oldest first.
_INDEX = """
local stream, index, counter, ids = KEYS[1], KEYS[2], KEYS[3], KEYS[6]
local window, oldest, age = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local function parts(element)  -- "{entry id} {n}": the id and n
  local space = string.find(element, ' ', 1, true)
  return string.sub(element, 1, space - 1), tonumber(string.sub(element, space + 1))
end
local function place(id)  -- an entry id's ms and seq
  local dash = string.find(id, '-', 1, true)
  return tonumber(string.sub(id, 1, dash - 1)), tonumber(string.sub(id, dash + 1))
end
local function older(a, b)
  local a_ms, a_seq = place(a)
  local b_ms, b_seq = place(b)
  return a_ms < b_ms or (a_ms == b_ms and a_seq < b_seq)
end
local count = 0
if redis.call('EXISTS', index) == 1 then
  local counted = redis.call('GET', counter)
  if counted then
    count = tonumber(counted)
  else  -- lost on its own (evicted): counted again
    for _, element in ipairs(redis.call('LRANGE', index, 0, -1)) do
      local _, n = parts(element)
      count = count + n
    end
  end
else
  local first = ARGV[7]  -- the oldest new entry (a pooled client may add them in any order)
  for i = 9, #ARGV, 2 do
    if older(ARGV[i], first) then first = ARGV[i] end
  end
  local size = redis.call('XLEN', stream) - (#ARGV - 6) / 2
  local before = size > 0 and redis.call('XREVRANGE', stream, '(' .. first, '-', 'COUNT', 1)
  if before and #before > 0 then  -- entries no index lists: an older version's, one each
    redis.call('RPUSH', index, before[1][1] .. ' ' .. size)
    count = size
  end
end
local elements, in_order = {}, true
local last = redis.call('LINDEX', index, -1)
for i = 7, #ARGV, 2 do
  elements[#elements + 1] = ARGV[i] .. ' ' .. ARGV[i + 1]
  count = count + tonumber(ARGV[i + 1])
  local previous = i > 7 and ARGV[i - 2] or (last and parts(last))
  in_order = in_order and (not previous or older(previous, ARGV[i]))
end
if in_order then
  redis.call('RPUSH', index, unpack(elements))
else
  -- A later entry was indexed first (another writer's, or added first by a pooled
  -- client): each goes after the last one older than it.
  for _, element in ipairs(elements) do
    local id, k = parts(element), -1
    last = redis.call('LINDEX', index, -1)
    while last and older(id, (parts(last))) do
      k = k - 1
      last = redis.call('LINDEX', index, k)
    end
    if k == -1 then
      redis.call('RPUSH', index, element)
    elseif last then
      redis.call('LINSERT', index, 'AFTER', last, element)
    else
      redis.call('LPUSH', index, element)
    end
  end
end
-- The oldest go, read a few at a time, while the newer alone hold the window or they are
-- past the age; never the newest.
local size, gone, kept = redis.call('LLEN', index), 0, nil
while not kept and gone < size - 1 do
  local heads = redis.call('LRANGE', index, gone, gone + 15)
  for _, head in ipairs(heads) do
    local id, n = parts(head)
    if gone == size - 1 or (count - n < window and place(id) >= oldest) then
      kept = id
      break
    end
    gone, count = gone + 1, count - n
  end
end
if gone > 0 then
  redis.call('LPOP', index, gone)
  redis.call('XTRIM', stream, 'MINID', kept or parts(redis.call('LINDEX', index, 0)))
end
redis.call('SET', counter, count, 'EX', age)
redis.call('EXPIRE', stream, age)
redis.call('EXPIRE', index, age)
if ids ~= '' then
  -- The HSET may come after this call (a pooled client): a field now makes it expire
  redis.call('HSETNX', ids, '', '')
  redis.call('EXPIRE', ids, age + 3600)
  redis.call('ZADD', KEYS[4], ARGV[5], ARGV[5])
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. ARGV[6])
  redis.call('EXPIRE', KEYS[4], age + 3600)
end
redis.call('SADD', KEYS[5], ARGV[4])
return count
"""


class _Chunk:
    """One entry to be: its project, records' lines and ids; its entry id once added,
    and whether its ids and its entry have been indexed."""

    __slots__ = ("entry", "ids", "ids_written", "indexed", "lines", "project")

    def __init__(self, project: str) -> None:
        self.project = project
        self.lines: list[bytes] = []
        self.ids: list[str] = []
        self.entry: str | None = None
        self.ids_written = False
        self.indexed = False


class RedisWindowSink:
    """A ``RecordSink`` writing each project's window (``origin.requestlog.sink``)."""

    name = "redis"

    def __init__(
        self,
        redis: RedisClient,
        window: int,
        age: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._redis = redis
        self._window = window
        self._age = age
        self._clock = clock
        self._index = LoadedScript(_INDEX, 6)
        # The batch last failed and its chunks, each as far as it got (added, its ids
        # written, indexed): its retry (the same batch, from the buffer) does the rest.
        self._failed: tuple[Sequence[Logged], list[_Chunk]] | None = None

    async def write(self, records: Sequence[Logged]) -> None:
        failed, self._failed = self._failed, None
        chunks = failed[1] if failed is not None and failed[0] is records else _chunks(records)
        # What was added is indexed even when some of it failed. (The errors are returned,
        # not raised through try/finally: compiled, that re-raised a stale error.)
        error = await self._add_entries([chunk for chunk in chunks if chunk.entry is None])
        error = await self._index_entries([c for c in chunks if c.entry is not None]) or error
        if not all(chunk.indexed and chunk.ids_written for chunk in chunks):
            self._failed = (records, chunks)  # for the buffer's retry of the batch
        if error is not None:
            raise error

    async def _add_entries(self, chunks: list[_Chunk]) -> BaseException | None:
        """Each chunk's entry added, its id noted; the first error."""
        redis = self._redis
        added = await asyncio.gather(
            *(
                redis.execute(
                    "XADD",
                    STREAM_KEY_PREFIX + chunk.project,
                    "*",
                    COUNT_FIELD,
                    len(chunk.lines),
                    RECORDS_FIELD,
                    b"\n".join(chunk.lines),
                )
                for chunk in chunks
            ),
            return_exceptions=True,
        )
        for chunk, entry in zip(chunks, added, strict=True):
            if isinstance(entry, bytes):
                chunk.entry = entry.decode()
        return _first_error(added)

    async def _index_entries(self, chunks: list[_Chunk]) -> BaseException | None:
        """The ids and entries of ``chunks`` not yet indexed (a retry's: what failed);
        the first error."""
        now = self._clock()
        age = self._age
        hour = int(now // 3600)
        hours_key = ids_key(hour)
        redis = self._redis
        unindexed: dict[str, list[_Chunk]] = {}  # by project
        id_writes: list[_Chunk] = []
        commands = []
        for chunk in chunks:
            if not chunk.indexed:
                unindexed.setdefault(chunk.project, []).append(chunk)
            if chunk.ids_written:
                continue
            place = b"%s %s" % (chunk.project.encode(), str(chunk.entry).encode())
            fields: list[Arg] = []
            for request_id, at in zip(chunk.ids, _AT, strict=False):
                if request_id:
                    fields += (request_id, place + at)
            if fields:
                id_writes.append(chunk)
                commands.append(redis.execute("HSET", hours_key, *fields))
            else:
                chunk.ids_written = True
        has_ids = any(any(chunk.ids) for chunk in chunks)
        projects = list(unindexed.items())
        for project, project_chunks in projects:
            entries: list[Arg] = []
            for chunk in project_chunks:
                entries += (str(chunk.entry), len(chunk.lines))
            commands.append(
                self._index.run(
                    redis,
                    STREAM_KEY_PREFIX + project,
                    INDEX_KEY_PREFIX + project,
                    COUNT_KEY_PREFIX + project,
                    HOURS_KEY,
                    PROJECTS_KEY,
                    hours_key if has_ids else "",
                    self._window,
                    int((now - age) * 1000),
                    age,
                    project,
                    hour,
                    # An hour's ids are asked for while its entries may be kept: ``age``
                    # past it.
                    int((now - age) // 3600) - 1,
                    *entries,
                )
            )
        replies = await asyncio.gather(*commands, return_exceptions=True)
        written, indexed = replies[: len(id_writes)], replies[len(id_writes) :]
        for chunk, reply in zip(id_writes, written, strict=True):
            chunk.ids_written = not isinstance(reply, BaseException)
        for (_, project_chunks), reply in zip(projects, indexed, strict=True):
            for chunk in project_chunks:
                chunk.indexed = not isinstance(reply, BaseException)
        return _first_error(replies)

    async def close(self) -> None:
        await self._redis.close()


def _chunks(records: Sequence[Logged]) -> list[_Chunk]:
    """The records by project, ``_CHUNK`` at most a chunk, in their order."""
    chunks: list[_Chunk] = []
    open_chunks: dict[str, _Chunk] = {}  # each project's chunk being filled
    for line, _, project, request_id in records:
        chunk = open_chunks.get(project)
        if chunk is None or len(chunk.lines) >= _CHUNK:
            chunk = open_chunks[project] = _Chunk(project or NO_PROJECT)
            chunks.append(chunk)
        chunk.lines.append(line)
        chunk.ids.append(request_id)
    return chunks


def _first_error(replies: Sequence[object]) -> BaseException | None:
    for reply in replies:
        if isinstance(reply, BaseException):
            return reply
    return None
