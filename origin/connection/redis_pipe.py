"""One Redis connection shared by every request, with automatic pipelining.

Each request the origin answers sends a Redis command or two. Through a
connection pool each command costs a pool checkout and return, a write and a
read of its own. Here every command goes onto one connection: the commands
issued in one turn of the event loop leave in one write, and the replies,
which Redis sends in order, are matched to their callers in order (the way
ioredis' auto-pipelining and rueidis work). At 32 concurrent requests that is
one write and one read for all of them instead of 32 of each, and no pool.

Time limits are per connection, not per command: one timer checks a few times
per ``timeout`` whether the oldest unanswered command is overdue, and if so the
connection is dropped and every command on it fails with ``RedisTimeoutError`` (a
stalled Redis stalls them all anyway). So a command waits at most about 1.25 x
``timeout`` and costs no timer of its own. A caller that stops waiting (a
cancelled request) leaves its reply to be read and dropped, so the connection
never gets out of step. When the connection fails, every waiting command fails
and the next command connects again.

When the socket cannot take more (the transport calls ``pause_writing``), commands
keep their place in the queue and leave together, in order, when it resumes; a
bulky writer can ``await pipe.drain()`` first. Every failure is a
``RedisClientError`` (``origin/connection/redis_client.py``).

Not for blocking commands (BLPOP and the like): they would hold up every
command behind them. redis-py parses the URL; hiredis parses the replies.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import Awaitable, Mapping
from typing import Any

import hiredis
from redis.asyncio.connection import SSLConnection, parse_url

from .redis_client import (
    Arg,
    PreparedCommand,
    RedisConnectionError,
    RedisTimeoutError,
    pack,
    reply_error,
)

__all__ = ["RedisPipe"]

# hiredis moves the unread rest of its buffer to the front each time it hands out a reply
# (once 1 KiB has been read): fed a whole read of N replies it copies the read about N/2
# times over (32 cached answers of 5 KB: 4 µs a reply instead of under 1). Fed in slices
# this size, no copy is larger than a slice.
_FEED_BYTES = 4_096


class _FlowControl:
    """The transport's write pause, as an event a writer can wait on (as uvicorn's)."""

    __slots__ = ("_writable", "write_paused")

    def __init__(self) -> None:
        self.write_paused = False
        self._writable = asyncio.Event()
        self._writable.set()

    async def drain(self) -> None:
        await self._writable.wait()

    def pause_writing(self) -> None:
        self.write_paused = True
        self._writable.clear()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._writable.set()


class _Protocol(asyncio.Protocol):
    def __init__(self, timeout: float) -> None:
        self.transport: Any = None  # an asyncio or uvloop transport
        self.lost = False
        # Unanswered commands, oldest first: (caller's future, when it was sent).
        self.waiting: collections.deque[tuple[asyncio.Future[Any], float]] = collections.deque()
        self._reader = hiredis.Reader()
        # Commands not yet written, in the order they were sent.
        self._outgoing: list[bytes] = []
        self.flow = _FlowControl()
        self._timeout = timeout
        self._watchdog: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self._watch()

    def _watch(self) -> None:
        waiting = self.waiting
        if waiting and time.monotonic() - waiting[0][1] > self._timeout:
            self._fail(RedisTimeoutError(f"Redis did not answer within {self._timeout} s"))
            return
        loop = asyncio.get_running_loop()
        self._watchdog = loop.call_later(self._timeout / 4, self._watch)

    def send(self, command: bytes, loop: asyncio.AbstractEventLoop) -> asyncio.Future[Any]:
        waiter = loop.create_future()
        if self.lost:  # closed between being handed out and this command: nobody would answer
            waiter.set_exception(RedisConnectionError("Redis connection lost"))
            return waiter
        self.waiting.append((waiter, time.monotonic()))
        if not self._outgoing:
            loop.call_soon(self._flush)  # after every command of this turn is queued
        self._outgoing.append(command)
        return waiter

    def _flush(self) -> None:
        # While the transport is paused the commands stay queued, in order, and
        # resume_writing writes them. (A flush scheduled before a resume finds none.)
        outgoing = self._outgoing
        if self.flow.write_paused or not outgoing:
            return
        self._outgoing = []
        if not self.lost:
            self.transport.write(outgoing[0] if len(outgoing) == 1 else b"".join(outgoing))

    def pause_writing(self) -> None:
        self.flow.pause_writing()

    def resume_writing(self) -> None:
        self.flow.resume_writing()
        self._flush()

    def data_received(self, data: bytes) -> None:
        size = len(data)
        if size <= _FEED_BYTES:
            self._reader.feed(data)
            self._deliver()
            return
        for start in range(0, size, _FEED_BYTES):
            self._reader.feed(data, start, min(_FEED_BYTES, size - start))
            if not self._deliver():
                return

    def _deliver(self) -> bool:
        """Hand every complete reply to its waiter, in order; False when the stream is
        out of step (the connection is then failed)."""
        while (reply := self._reader.gets()) is not False:
            if not self.waiting:  # a reply nobody asked for: the stream is out of step
                self._fail(RedisConnectionError("Redis sent a reply that no command asked for"))
                return False
            waiter = self.waiting.popleft()[0]
            if waiter.done():  # its caller gave up; the reply is dropped, in order
                continue
            if isinstance(reply, hiredis.ReplyError):
                waiter.set_exception(reply_error(str(reply)))
            else:
                waiter.set_result(reply)
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(RedisConnectionError(f"Redis connection lost: {exc or 'closed'}"))

    def _fail(self, error: Exception) -> None:
        self.lost = True
        self._outgoing = []
        self.flow.resume_writing()  # nothing more to wait for here: drainers go on and fail
        if self._watchdog is not None:
            self._watchdog.cancel()
        while self.waiting:
            waiter = self.waiting.popleft()[0]
            if not waiter.done():
                waiter.set_exception(error)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()


def _tls_context(options: Mapping[str, Any]) -> ssl.SSLContext:
    """For ``rediss://`` (Upstash): verified against the system's CAs, or ``?ssl_ca_certs=``;
    ``?ssl_check_hostname=false`` skips the name check and ``?ssl_cert_reqs=none`` all
    verification (never do that in production)."""
    context = ssl.create_default_context(cafile=options.get("ssl_ca_certs"))
    if options.get("ssl_check_hostname") is False:
        context.check_hostname = False
    if options.get("ssl_cert_reqs") in ("none", ssl.CERT_NONE):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class RedisPipe:
    """``await pipe.execute("GET", key)``: commands from every request on one connection."""

    def __init__(self, url: str, timeout: float = 1.0) -> None:
        options: Mapping[str, Any] = parse_url(url)
        self._host: str = options.get("host", "127.0.0.1")
        self._port: int = options.get("port", 6379)
        self._path: str | None = options.get("path")
        self._tls = (
            _tls_context(options) if options.get("connection_class") is SSLConnection else None
        )
        self._handshake: list[bytes] = []
        password, username = options.get("password"), options.get("username")
        if password:
            auth: tuple[Arg, ...] = ("AUTH", username, password) if username else ("AUTH", password)
            self._handshake.append(pack(auth))
        if options.get("db"):
            self._handshake.append(pack(("SELECT", options["db"])))
        self.timeout = timeout  # for connecting, and for any command's answer
        self._protocol: _Protocol | None = None
        self._attempt: asyncio.Future[_Protocol] | None = None
        self._closed = False

    def execute(self, *args: Arg) -> Awaitable[Any]:
        """``await pipe.execute("GET", key)``: the reply, or the error Redis answered."""
        return self._send(pack(args))

    def run(self, command: PreparedCommand, *args: Arg) -> Awaitable[Any]:
        """``command`` with ``args`` after its leading arguments."""
        return self._send(command.pack(args))

    def _send(self, data: bytes) -> Awaitable[Any]:
        # The hot path: when connected this is the reply's future itself, with no
        # coroutine around it.
        protocol = self._protocol
        if protocol is None or protocol.lost:
            return self._connect_and_send(data)
        return protocol.send(data, asyncio.get_running_loop())

    async def _connect_and_send(self, data: bytes) -> Any:
        protocol = await self._connect()
        return await protocol.send(data, asyncio.get_running_loop())

    async def _connect(self) -> _Protocol:
        """The connection, opened if needed. Every command that finds none waits on the
        same attempt, so an unreachable Redis costs one timeout for all of them, not one
        each in turn."""
        if self._closed:
            raise RedisConnectionError("the Redis pipe is closed")
        attempt = self._attempt
        if attempt is None or (attempt.done() and not self._usable(attempt)):
            attempt = self._attempt = asyncio.ensure_future(self._open())
        # Shielded: one caller giving up does not cancel the attempt the others wait on.
        return await asyncio.shield(attempt)

    @staticmethod
    def _usable(attempt: asyncio.Future[_Protocol]) -> bool:
        return not attempt.cancelled() and attempt.exception() is None and not attempt.result().lost

    async def _open(self) -> _Protocol:
        try:
            return await self._open_connection()
        except TimeoutError:  # asyncio.timeout's own: connecting or the handshake took too long
            raise RedisTimeoutError(
                f"Redis did not accept a connection within {self.timeout} s"
            ) from None
        except OSError as error:  # refused, unreachable, TLS verification
            refused = RedisConnectionError(f"cannot connect to Redis: {error}")
            refused.__cause__ = error  # as well: compiled, `from` alone loses it
            raise refused from error

    async def _open_connection(self) -> _Protocol:
        loop = asyncio.get_running_loop()

        def protocol_factory() -> _Protocol:
            return _Protocol(self.timeout)

        async with asyncio.timeout(self.timeout):
            if self._path is not None:
                _, protocol = await loop.create_unix_connection(protocol_factory, self._path)
            else:
                _, protocol = await loop.create_connection(
                    protocol_factory, self._host, self._port, ssl=self._tls
                )
            try:
                for command in self._handshake:
                    await protocol.send(command, loop)
                if self._closed:
                    raise RedisConnectionError("the Redis pipe is closed")
            except BaseException:
                protocol.connection_lost(None)
                raise
        self._protocol = protocol
        return protocol

    @property
    def write_paused(self) -> bool:
        """Whether the socket has asked for a pause in writing (commands wait, queued)."""
        protocol = self._protocol
        return protocol is not None and protocol.flow.write_paused

    async def drain(self) -> None:
        """Until the connection can take more bytes (at once when it can, or has none)."""
        protocol = self._protocol
        if protocol is not None and protocol.flow.write_paused:
            await protocol.flow.drain()

    def reset(self) -> None:
        """Drop the connection; the next command connects again. Commands still waiting
        fail at once. (A failed or stalled connection drops itself: this is for Redis
        answering that it can no longer serve writes, after a failover.)"""
        protocol, self._protocol = self._protocol, None
        if protocol is not None and not protocol.lost:
            protocol.connection_lost(None)

    async def close(self) -> None:
        """Drop the connection and refuse new commands. A connection attempt in progress
        is not cancelled (its waiters would see a cancellation that is not theirs): it
        fails on its own, as soon as it sees the pipe closed."""
        self._closed = True
        self.reset()
