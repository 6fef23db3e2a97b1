"""One Redis connection shared by every request, with automatic pipelining.

Each request the origin answers sends a Redis command or two. Through a
connection pool each command costs a pool checkout and return, a write and a
read of its own. Here every command goes onto one connection: the commands
issued in one turn of the event loop leave in one write, and the replies,
which Redis sends in order, are matched to their callers in order (the way
ioredis' auto-pipelining and rueidis work). At 32 concurrent requests that is
one write and one read for all of them instead of 32 of each, and no pool.

A caller that stops waiting (a timeout, a cancelled request) leaves its reply
to be read and dropped, so the connection never gets out of step. When the
connection fails, every waiting command fails with ``ConnectionError`` and the
next command connects again. redis-py parses the URL; hiredis parses replies.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from typing import Any

import hiredis
from redis.asyncio.connection import SSLConnection, parse_url
from redis.exceptions import ConnectionError, NoScriptError, ResponseError

__all__ = ["RedisPipe"]

Arg = str | bytes | int


def pack(args: tuple[Arg, ...]) -> bytes:
    """A command as a RESP array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _error(reply: hiredis.ReplyError) -> ResponseError:
    message = str(reply)
    return NoScriptError(message) if message.startswith("NOSCRIPT") else ResponseError(message)


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: Any = None  # an asyncio or uvloop transport
        self.waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.lost = False
        self._reader = hiredis.Reader()
        self._outgoing: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def send(self, command: bytes, loop: asyncio.AbstractEventLoop) -> asyncio.Future[Any]:
        waiter = loop.create_future()
        self.waiting.append(waiter)
        if not self._outgoing:
            loop.call_soon(self._flush)  # after every command of this turn is queued
        self._outgoing.append(command)
        return waiter

    def _flush(self) -> None:
        outgoing, self._outgoing = self._outgoing, []
        if self.transport is not None and not self.lost:
            self.transport.write(outgoing[0] if len(outgoing) == 1 else b"".join(outgoing))

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        while (reply := self._reader.gets()) is not False:
            if not self.waiting:  # a reply nobody asked for: the stream is out of step
                self._fail(ConnectionError("Redis sent a reply that no command asked for"))
                return
            waiter = self.waiting.popleft()
            if waiter.done():  # its caller gave up; the reply is dropped, in order
                continue
            if isinstance(reply, hiredis.ReplyError):
                waiter.set_exception(_error(reply))
            else:
                waiter.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._fail(ConnectionError(f"Redis connection lost: {exc or 'closed'}"))

    def _fail(self, error: Exception) -> None:
        self.lost = True
        while self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_exception(error)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()


class RedisPipe:
    """``await pipe.execute("GET", key)``: commands from every request on one connection."""

    def __init__(self, url: str, connect_timeout: float = 1.0) -> None:
        options = parse_url(url)
        self._host: str = options.get("host", "127.0.0.1")
        self._port: int = options.get("port", 6379)
        self._path: str | None = options.get("path")
        self._tls = options.get("connection_class") is SSLConnection
        self._handshake: list[bytes] = []
        password, username = options.get("password"), options.get("username")
        if password:
            auth: tuple[Arg, ...] = ("AUTH", username, password) if username else ("AUTH", password)
            self._handshake.append(pack(auth))
        if options.get("db"):
            self._handshake.append(pack(("SELECT", options["db"])))
        self._connect_timeout = connect_timeout
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Lock | None = None

    async def execute(self, *args: Arg) -> Any:
        protocol = self._protocol
        if protocol is None or protocol.lost:
            protocol = await self._connect()
        return await protocol.send(pack(args), asyncio.get_running_loop())

    async def _connect(self) -> _Protocol:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            current = self._protocol
            if current is not None and not current.lost:
                return current  # another command connected while this one waited
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(self._connect_timeout):
                if self._path is not None:
                    _, protocol = await loop.create_unix_connection(_Protocol, self._path)
                else:
                    tls = ssl.create_default_context() if self._tls else None
                    _, protocol = await loop.create_connection(
                        _Protocol, self._host, self._port, ssl=tls
                    )
                try:
                    for command in self._handshake:
                        await protocol.send(command, loop)
                except BaseException:
                    protocol.connection_lost(None)
                    raise
            self._protocol = protocol
            return protocol

    def reset(self) -> None:
        """Drop the connection (after a timeout: Redis may be stuck); the next command
        connects again. Commands still waiting fail at once."""
        protocol, self._protocol = self._protocol, None
        if protocol is not None and not protocol.lost:
            protocol.connection_lost(None)

    async def close(self) -> None:
        self.reset()
