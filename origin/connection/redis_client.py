"""What the origin needs from a Redis client, one error tree for every client, and the
redis-py implementation (``PRISM_REDIS_CLIENT=redis-py``).

The origin normally runs on ``RedisPipe`` (``origin/connection/redis_pipe.py``: one auto-pipelined
connection). ``RedisPyClient`` is the way out: the same interface on redis-py's asyncio
client with a connection pool, the same timeout and the same errors, so ``RedisCache``
neither knows nor cares which one it has.

Every failure of a command is a ``RedisClientError``:

- ``RedisReplyError``: Redis answered with an error (the message is Redis's own text);
  ``NoScriptError`` when EVALSHA names a script Redis does not have.
- ``RedisConnectionError``: no connection (refused, lost, TLS, closed client);
  ``RedisTimeoutError`` when Redis did not answer in time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

import redis.exceptions
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

__all__ = [
    "Arg",
    "LoadedScript",
    "NoScriptError",
    "PreparedCommand",
    "RedisClient",
    "RedisClientError",
    "RedisConnectionError",
    "RedisPyClient",
    "RedisReplyError",
    "RedisTimeoutError",
    "pack",
    "reply_error",
]

Arg = str | bytes | int


class RedisClientError(Exception):
    """A Redis command failed; the one exception type callers of a ``RedisClient`` catch."""


class RedisReplyError(RedisClientError):
    """Redis answered the command with an error; ``str(error)`` is Redis's message."""


class NoScriptError(RedisReplyError):
    """EVALSHA named a script Redis does not have (restarted, flushed): load it again."""


class RedisConnectionError(RedisClientError):
    """No usable connection: refused, lost, TLS failure, or the client is closed."""


class RedisTimeoutError(RedisConnectionError):
    """Redis did not answer in time (the connection is dropped)."""


def reply_error(message: str) -> RedisReplyError:
    """Redis's error reply as our exception."""
    return NoScriptError(message) if message.startswith("NOSCRIPT") else RedisReplyError(message)


# RESP's length lines made once for the lengths most arguments have (keys, ids, counts):
# formatting one (``b"$%d\r\n" % n``) cost more than the rest of packing its argument.
_LENGTHS: Final = [b"$%d\r\n" % n for n in range(256)]
_ARITIES: Final = [b"*%d\r\n" % n for n in range(64)]
_CRLF: Final = b"\r\n"


def _add_bulks(parts: list[bytes], args: tuple[Arg, ...]) -> None:
    """Append each of ``args`` as a RESP bulk string: its length line, itself, CRLF (joined
    once, by the caller, with no copy of the argument before that)."""
    for arg in args:
        # Keys and ids are str: encoded directly, not through str() (the common case first).
        data = (
            arg.encode()
            if isinstance(arg, str)
            else arg
            if isinstance(arg, bytes)
            else str(arg).encode()
        )
        size = len(data)
        parts += (_LENGTHS[size] if size < 256 else b"$%d\r\n" % size, data, _CRLF)


def _arity(count: int) -> bytes:
    return _ARITIES[count] if count < 64 else b"*%d\r\n" % count


def pack(args: tuple[Arg, ...]) -> bytes:
    """A command as a RESP array of bulk strings."""
    parts = [_arity(len(args))]
    _add_bulks(parts, args)
    return b"".join(parts)


class PreparedCommand:
    """A command whose leading arguments are fixed (``EVALSHA sha 2 key``): each call adds
    only the arguments that change. The RESP encoding of the fixed part is made once."""

    __slots__ = ("_count", "_head", "leading")

    def __init__(self, *leading: Arg) -> None:
        self.leading = leading
        self._count = len(leading)
        head: list[bytes] = []
        _add_bulks(head, leading)
        self._head = b"".join(head)

    def pack(self, args: tuple[Arg, ...]) -> bytes:
        parts = [_arity(self._count + len(args)), self._head]
        _add_bulks(parts, args)
        return b"".join(parts)


class RedisClient(Protocol):
    """What the origin calls on Redis. Replies are Redis's raw replies (bytes, ints, lists,
    None); every failure is a ``RedisClientError``."""

    def execute(self, *args: Arg) -> Awaitable[Any]:
        """``await client.execute("GET", key)``: the reply."""
        ...

    def run(self, command: PreparedCommand, *args: Arg) -> Awaitable[Any]:
        """``command`` with ``args`` after its leading arguments."""
        ...

    def reset(self) -> None:
        """Drop the connection(s); commands waiting on them fail, the next one reconnects
        (after a failover, to reach the new primary)."""
        ...

    async def drain(self) -> None:
        """Until the client can take more bytes: a bulky writer awaits this first so that
        it queues behind no backlog of its own (requests' lookups are not held up)."""
        ...

    async def close(self) -> None:
        """Drop the connection(s) and refuse new commands."""
        ...


def _translate(error: Exception) -> RedisClientError:
    """redis-py's exception as ours (redis-py strips the error code off Redis's message;
    it is put back, so READONLY and the like read the same from either client)."""
    if isinstance(error, redis.exceptions.ResponseError):
        message = str(error)
        if getattr(error, "status_code", None):  # redis-py 6+; older ones keep the code
            message = f"{error.status_code} {message}"
        return reply_error(message)
    if isinstance(error, (redis.exceptions.TimeoutError, TimeoutError)):
        return RedisTimeoutError(f"Redis did not answer in time: {error}")
    return RedisConnectionError(f"Redis connection failed: {error}")


class RedisPyClient:
    """``RedisClient`` on redis-py's asyncio client: a bounded pool of connections, each
    command on a connection of its own. No retries: one ``timeout`` bounds connecting,
    waiting for a free connection and each reply, as with the pipe."""

    def __init__(self, url: str, timeout: float = 1.0, max_connections: int = 64) -> None:
        self.timeout = timeout
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=timeout,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )
        self._redis = Redis(connection_pool=pool)
        # Raw replies, as the pipe gives them (no per-command conversion to bool, str ...).
        self._redis.response_callbacks.clear()
        self._execute: Callable[..., Awaitable[Any]] = self._redis.execute_command
        self._pool = pool
        self._closed = False
        self._resets: set[asyncio.Task[None]] = set()

    async def execute(self, *args: Arg) -> Any:
        if self._closed:
            raise RedisConnectionError("the Redis client is closed")
        try:
            return await self._execute(*args)
        except (redis.exceptions.RedisError, OSError) as error:
            translated = _translate(error)
            translated.__cause__ = error  # as well: compiled, `from` alone loses it
            raise translated from error

    def run(self, command: PreparedCommand, *args: Arg) -> Awaitable[Any]:
        return self.execute(*command.leading, *args)

    def reset(self) -> None:
        # redis-py disconnects asynchronously; held so the task is not collected.
        task = asyncio.ensure_future(self._disconnect())
        self._resets.add(task)
        task.add_done_callback(self._resets.discard)

    async def _disconnect(self) -> None:
        with contextlib.suppress(redis.exceptions.RedisError, OSError):
            await self._pool.disconnect(inuse_connections=True)

    async def drain(self) -> None:
        """Nothing to wait for: each pooled connection drains its own writes."""

    async def close(self) -> None:
        self._closed = True
        if self._resets:
            await asyncio.gather(*self._resets)
        await self._redis.aclose(close_connection_pool=True)


class LoadedScript:
    """A Lua script of ``keys`` keys run by EVALSHA: loaded on first use, and again after
    Redis lost it (restarted or flushed). ``run`` takes the keys, then the arguments;
    ``fixed``, the leading keys every run passes (packed once)."""

    __slots__ = ("_command", "_fixed", "_keys", "_source")

    def __init__(self, source: str, keys: int = 0, *fixed: Arg) -> None:
        self._source = source
        self._keys = keys
        self._fixed = fixed
        self._command: PreparedCommand | None = None

    def start(self, redis: RedisClient, *args: Arg) -> Awaitable[Any]:
        """``run`` with no coroutine around the reply once the script is loaded, for a
        write that needs no task of its own. A reply of ``NoScriptError`` (Redis lost the
        script) fails that write, and the next call loads the script again."""
        command = self._command
        if command is None:
            return self.run(redis, *args)
        reply = redis.run(command, *args)
        if isinstance(reply, asyncio.Future):
            reply.add_done_callback(self._check)
        return reply

    def _check(self, reply: asyncio.Future[Any]) -> None:
        if not reply.cancelled() and isinstance(reply.exception(), NoScriptError):
            self._command = None

    async def run(self, redis: RedisClient, *args: Arg) -> Any:
        command = self._command
        if command is not None:
            try:  # not contextlib.suppress: a context manager object and two calls per run
                return await redis.run(command, *args)
            except NoScriptError:
                pass  # Redis restarted or was flushed: load it again
        sha = await redis.execute("SCRIPT", "LOAD", self._source)
        self._command = PreparedCommand("EVALSHA", sha, self._keys, *self._fixed)
        return await redis.run(self._command, *args)
