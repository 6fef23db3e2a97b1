"""The Redis window: each project's recent request records, for `prism logs`.

One capped stream per project, ``prism:log:{project}`` (records with no project, a refused
key's, in ``prism:log:-``): each record is one entry whose field ``r`` holds its JSON,
kept while it is among the project's last ``window`` and younger than ``age`` seconds
(``XADD … MAXLEN ~``, then ``XTRIM … MINID ~`` once per project and batch; the stream
itself expires ``age`` after its last write). A request id finds its record without a
scan: ``prism:log-id:{id}`` holds "{project} {entry id}" for as long as the window keeps
it. ``prism:log-projects`` lists the projects that have a window.

A batch is a script call per project in it and ``_CHUNK`` records (``_APPEND``: the
entries, their id keys, the trims), sent together: one round trip, no per-record command
for this process to make, and Redis never busy with one call for more than a millisecond
or two (a call of 1,000 records held every other client for 10-20 ms). A failed call
fails the batch (the buffer retries it, so an entry may be written twice; the reader
drops repeated ids).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..connection.redis_client import Arg, LoadedScript, RedisClient
from .record import encoded

__all__ = [
    "ID_KEY_PREFIX",
    "NO_PROJECT",
    "PROJECTS_KEY",
    "RECORD_FIELD",
    "STREAM_KEY_PREFIX",
    "RedisWindowSink",
    "id_key",
    "stream_key",
]

STREAM_KEY_PREFIX = "prism:log:"
ID_KEY_PREFIX = "prism:log-id:"
PROJECTS_KEY = "prism:log-projects"
NO_PROJECT = "-"  # the stream of records no project was identified for
RECORD_FIELD = "r"


def stream_key(project: str) -> str:
    return STREAM_KEY_PREFIX + (project or NO_PROJECT)


def id_key(request_id: str) -> str:
    return ID_KEY_PREFIX + request_id


# One project's part of a batch in one command: each record appended (the stream capped
# at ARGV[1] entries, about), its id key set to "{project} {entry id}" for ARGV[3] seconds,
# then the stream trimmed to entries from ARGV[2] (ms) on, kept ARGV[3] seconds past this
# write, and the project listed. ARGV[4] is the project, ARGV[5] the id keys' prefix, then
# one argument per record: its request id, a newline (no header value holds one), its
# JSON (one argument, not two: each costs this process its encoding). The id keys are
# made here, from the prefix, as the entry ids they hold are known only here.
_CHUNK = 100  # records per script call: Redis runs a call whole, so other clients wait
_APPEND = """
local stream, window, age, project, prefix = KEYS[1], ARGV[1], ARGV[3], ARGV[4], ARGV[5]
for i = 6, #ARGV do
  local record = ARGV[i]
  local newline = string.find(record, '\\n', 1, true)
  local entry = redis.call(
    'XADD', stream, 'MAXLEN', '~', window, '*', 'r', string.sub(record, newline + 1))
  if newline > 1 then
    redis.call('SET', prefix .. string.sub(record, 1, newline - 1), project .. ' ' .. entry,
      'EX', age)
  end
end
redis.call('XTRIM', stream, 'MINID', '~', ARGV[2])
redis.call('EXPIRE', stream, age)
redis.call('SADD', KEYS[2], project)
return #ARGV - 5
"""


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
        self._append = LoadedScript(_APPEND, 2)

    async def write(self, records: Sequence[Mapping[str, Any]]) -> None:
        chunks: list[tuple[str, list[Arg]]] = []
        open_chunks: dict[str, list[Arg]] = {}  # each project's chunk being filled
        for record in records:
            project = record.get("project") or NO_PROJECT
            args = open_chunks.get(project)
            if args is None or len(args) >= _CHUNK:
                args = open_chunks[project] = []
                chunks.append((project, args))
            args.append(b"%s\n%s" % (str(record.get("id") or "").encode(), encoded(record)))
        oldest = int((self._clock() - self._age) * 1000)
        redis, append, window, age = self._redis, self._append, self._window, self._age
        replies = await asyncio.gather(
            *(
                append.run(
                    redis,
                    STREAM_KEY_PREFIX + project,
                    PROJECTS_KEY,
                    window,
                    oldest,
                    age,
                    project,
                    ID_KEY_PREFIX,
                    *args,
                )
                for project, args in chunks
            ),
            return_exceptions=True,
        )
        _raise_first(replies)

    async def close(self) -> None:
        await self._redis.close()


def _raise_first(replies: Sequence[object]) -> None:
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply
