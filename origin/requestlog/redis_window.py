"""The Redis window: each project's recent request records, for `prism logs`.

One capped stream per project, ``prism:log:{project}`` (records with no project, a refused
key's, in ``prism:log:-``): each record is one entry whose field ``r`` holds its JSON,
kept while it is among the project's last ``window`` and younger than ``age`` seconds
(``XADD … MAXLEN ~``, then ``XTRIM … MINID ~`` once per project and batch; the stream
itself expires ``age`` after its last write). A request id finds its record without a
scan: ``prism:log-id:{id}`` holds "{project} {entry id}" for as long as the window keeps
it. ``prism:log-projects`` lists the projects that have a window.

A batch is one pipelined round trip for the entries, and one for the id keys (they
name the entry ids the first round gave). A failed command fails the batch (the buffer
retries it, so an entry may be written twice; the reader drops repeated ids).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from ..connection.redis_client import RedisClient, RedisReplyError

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

    async def write(self, records: Sequence[Mapping[str, Any]]) -> None:
        redis, window = self._redis, self._window
        projects: dict[str, str] = {}  # project -> its stream's key
        adds = []
        for record in records:
            project = record.get("project") or NO_PROJECT
            key = projects.get(project)
            if key is None:
                key = projects[project] = STREAM_KEY_PREFIX + project
            adds.append(
                redis.execute(
                    "XADD", key, "MAXLEN", "~", window, "*", RECORD_FIELD, orjson.dumps(record)
                )
            )
        oldest = int((self._clock() - self._age) * 1000)
        upkeep = []
        for key in projects.values():
            upkeep.append(redis.execute("XTRIM", key, "MINID", "~", oldest))
            upkeep.append(redis.execute("EXPIRE", key, self._age))
        upkeep.append(redis.execute("SADD", PROJECTS_KEY, *projects))
        replies = await asyncio.gather(*adds, *upkeep, return_exceptions=True)
        _raise_first(replies)
        ids = []
        for record, entry in zip(records, replies, strict=False):
            request_id = record.get("id")
            if request_id:
                where = f"{record.get('project') or NO_PROJECT} {_text(entry)}"
                ids.append(redis.execute("SET", ID_KEY_PREFIX + request_id, where, "EX", self._age))
        _raise_first(await asyncio.gather(*ids, return_exceptions=True))

    async def close(self) -> None:
        await self._redis.close()


def _raise_first(replies: Sequence[object]) -> None:
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply


def _text(entry: object) -> str:
    if isinstance(entry, bytes):
        return entry.decode()
    if isinstance(entry, str):
        return entry
    raise RedisReplyError(f"XADD answered {entry!r}, not an entry id")
