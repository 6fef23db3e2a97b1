"""RedisPipe: against a real Redis, replies reach their callers, in order, through
timeouts, errors, a lost connection, a restarted server and a full socket; and, with a
fake transport, write back-pressure (pause/resume) loses and reorders nothing."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import ssl
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio
import trustme
import uvloop

from deploy.local.redis import RedisServer
from origin.connection.redis_client import (
    NoScriptError,
    PreparedCommand,
    RedisClientError,
    RedisConnectionError,
    RedisReplyError,
    RedisTimeoutError,
    pack,
)
from origin.connection.redis_pipe import RedisPipe, _Protocol
from tests.polling import async_wait_for


def test_pack_is_resp_array_of_bulk_strings() -> None:
    assert pack(("SET", b"k\r\n", 5)) == b"*3\r\n$3\r\nSET\r\n$3\r\nk\r\n\r\n$1\r\n5\r\n"
    prepared = PreparedCommand("EVALSHA", "ab" * 20, 2, "set")
    assert prepared.pack(("key", b"id")) == pack(("EVALSHA", "ab" * 20, 2, "set", "key", b"id"))


async def test_concurrent_commands_each_get_their_own_reply(redis_url: str) -> None:
    pipe = RedisPipe(redis_url)
    try:
        values = [os.urandom(64) for _ in range(300)]
        await asyncio.gather(*(pipe.execute("SET", f"k{i}", v) for i, v in enumerate(values)))
        got = await asyncio.gather(*(pipe.execute("GET", f"k{i}") for i in range(300)))
        assert got == values
        assert await pipe.execute("GET", "missing") is None
        assert await pipe.execute("INCRBY", "n", 7) == 7
    finally:
        await pipe.close()


async def test_a_caller_that_gives_up_does_not_shift_the_replies(redis_url: str) -> None:
    pipe = RedisPipe(redis_url)
    try:
        # BLPOP answers (nil) only after 0.3 s; its caller stops waiting long before.
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await pipe.execute("BLPOP", "empty-list", "0.3")
        await pipe.execute("SET", "after", b"mine")
        assert await pipe.execute("GET", "after") == b"mine"
    finally:
        await pipe.close()


async def test_error_replies_raise_and_the_connection_goes_on(redis_url: str) -> None:
    pipe = RedisPipe(redis_url)
    try:
        with pytest.raises(NoScriptError):
            await pipe.execute("EVALSHA", "0" * 40, 0)
        with pytest.raises(RedisReplyError, match="wrong number of arguments"):
            await pipe.execute("GET")
        assert await pipe.execute("PING") == b"PONG"
    finally:
        await pipe.close()


async def test_url_credentials_and_database_are_used(redis_url: str) -> None:
    admin = redis.Redis.from_url(redis_url)
    admin.acl_setuser(
        "piper", enabled=True, passwords=["+pipe-secret"], keys=["*"], commands=["+@all"]
    )
    host_port = redis_url.removeprefix("redis://").split("/")[0]
    pipe = RedisPipe(f"redis://piper:pipe-secret@{host_port}/3")
    try:
        await pipe.execute("SET", "in-db-3", b"yes")
        assert await pipe.execute("ACL", "WHOAMI") == b"piper"
        assert redis.Redis.from_url(f"redis://{host_port}/3").get("in-db-3") == b"yes"
        assert admin.get("in-db-3") is None
        refused = RedisPipe(f"redis://piper:wrong@{host_port}/0")
        with pytest.raises(RedisReplyError, match="WRONGPASS"):
            await refused.execute("PING")
    finally:
        await pipe.close()
        admin.acl_deluser("piper")
        admin.close()


async def _until_blocked(url: str) -> None:
    """Until Redis reports one client blocked (the command really left)."""
    client = redis.asyncio.Redis.from_url(url)

    async def blocked() -> bool:
        clients: int = (await client.info("clients"))["blocked_clients"]
        return clients == 1

    try:
        await async_wait_for(blocked, within=5)
    finally:
        await client.aclose()


async def test_lost_connection_fails_waiters_then_reconnects(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    server = RedisServer(workdir=tmp_path_factory.mktemp("pipe-redis")).start()
    pipe = RedisPipe(server.url)
    try:
        assert await pipe.execute("PING") == b"PONG"
        waiting = asyncio.ensure_future(pipe.execute("BLPOP", "never", "0"))
        await _until_blocked(server.url)
        server.stop()
        with pytest.raises(RedisConnectionError):
            await asyncio.wait_for(waiting, 5)
        with pytest.raises(RedisConnectionError):
            await pipe.execute("PING")
        server.start()
        assert await pipe.execute("PING") == b"PONG"
    finally:
        await pipe.close()
        server.stop()


async def test_under_concurrency_with_cancellations_every_answer_is_its_own(
    redis_url: str,
) -> None:
    pipe = RedisPipe(redis_url)
    rng = random.Random(7)
    try:
        values = {f"s{i}": os.urandom(rng.randrange(1, 4096)) for i in range(400)}
        await asyncio.gather(*(pipe.execute("SET", k, v) for k, v in values.items()))
        keys = [rng.choice(list(values)) for _ in range(2000)]
        calls = [asyncio.ensure_future(pipe.execute("GET", k)) for k in keys]
        for call in rng.sample(calls, 500):  # callers that give up before their reply
            call.cancel()
        results = await asyncio.gather(*calls, return_exceptions=True)
        answered = [(k, r) for k, r in zip(keys, results, strict=True) if isinstance(r, bytes)]
        cancelled = [r for r in results if isinstance(r, asyncio.CancelledError)]
        assert len(answered) == 1500 and len(cancelled) == 500
        assert all(values[k] == r for k, r in answered)
        assert await pipe.execute("GET", "s0") == values["s0"]  # still in step
    finally:
        await pipe.close()


async def test_rediss_urls_speak_tls_and_verify_the_server(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Upstash is TLS only: the pipe through a real TLS terminator in front of Redis."""
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    ca_file = tmp_path_factory.mktemp("tls") / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    redis_host, redis_port = redis_url.removeprefix("redis://").split("/")[0].split(":")

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(redis_host, int(redis_port))

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
            dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))

    terminator = await asyncio.start_server(relay, "127.0.0.1", 0, ssl=server_context)
    port = terminator.sockets[0].getsockname()[1]
    trusted = RedisPipe(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca_file}")
    untrusted = RedisPipe(f"rediss://127.0.0.1:{port}/0")  # the system CAs do not know ours
    try:
        await trusted.execute("SET", "over-tls", b"yes")
        assert await trusted.execute("GET", "over-tls") == b"yes"
        with pytest.raises(RedisConnectionError) as refused:
            await untrusted.execute("PING")
        assert isinstance(refused.value.__cause__, ssl.SSLCertVerificationError)
    finally:
        await trusted.close()
        await untrusted.close()
        terminator.close()


async def test_an_unresponsive_server_costs_one_timeout_for_all_waiting_commands() -> None:
    """A server that accepts but never answers (the handshake's SELECT hangs): twenty
    commands arriving together share one connection attempt and fail together."""
    accepted: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        await reader.read()  # until the client goes away

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pipe = RedisPipe(f"redis://127.0.0.1:{port}/1", timeout=0.3)
    try:
        started = time.monotonic()
        results = await asyncio.gather(
            *(pipe.execute("GET", f"k{i}") for i in range(20)), return_exceptions=True
        )
        elapsed = time.monotonic() - started
        assert all(isinstance(r, RedisTimeoutError) for r in results), results
        assert elapsed < 3.0  # one 0.3 s attempt, not twenty in turn (6 s)
        assert len(accepted) == 1
    finally:
        await pipe.close()
        server.close()
        for writer in accepted:
            writer.close()


def test_a_server_that_refuses_and_hangs_up_fails_every_command_at_once() -> None:
    """Redis at maxclients answers an error and closes: no command may wait forever.
    Run on uvloop, as the origin is: there the hang-up lands before the waiters resume."""

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"-ERR max number of clients reached\r\n")
        await writer.drain()
        writer.close()

    async def scenario() -> list[object]:
        server = await asyncio.start_server(refuse, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pipe = RedisPipe(f"redis://127.0.0.1:{port}/0", timeout=0.3)
        try:
            async with asyncio.timeout(2):
                results: list[object] = await asyncio.gather(
                    *(pipe.execute("PING") for _ in range(4)), return_exceptions=True
                )
                return results
        finally:
            await pipe.close()
            server.close()

    results = uvloop.run(scenario())
    assert all(isinstance(r, RedisClientError) for r in results), results


async def test_close_during_a_connection_attempt_is_no_cancellation_for_the_waiters() -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        await reader.read()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pipe = RedisPipe(f"redis://127.0.0.1:{port}/1", timeout=0.3)  # SELECT never answered
    try:
        waiting = asyncio.gather(*(pipe.execute("PING") for _ in range(2)), return_exceptions=True)
        await async_wait_for(lambda: accepted, within=5)
        await pipe.close()
        results = await waiting
        assert all(isinstance(r, RedisConnectionError) for r in results), results
        with pytest.raises(RedisConnectionError, match="closed"):
            await pipe.execute("PING")
    finally:
        server.close()
        for writer in accepted:
            writer.close()


class FakeTransport(asyncio.Transport):
    """Records writes; the test plays the socket's part (pause/resume, replies), and
    ``on_write`` what the socket does when written to."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closing = False
        self.on_write: Callable[[], None] | None = None

    def write(self, data: bytes | bytearray | memoryview[Any]) -> None:
        self.writes.append(bytes(data))
        if self.on_write is not None:
            self.on_write()

    def is_closing(self) -> bool:
        return self.closing

    def abort(self) -> None:
        self.closing = True


def _connected(timeout: float = 30.0) -> tuple[_Protocol, FakeTransport]:
    protocol, transport = _Protocol(timeout), FakeTransport()
    protocol.connection_made(transport)
    return protocol, transport


async def _next_turns() -> None:
    """Let the loop run the flushes scheduled so far (call_soon callbacks)."""
    for _ in range(3):
        await asyncio.sleep(0)


async def test_commands_sent_while_writing_is_paused_wait_and_leave_in_order() -> None:
    protocol, transport = _connected()
    loop = asyncio.get_running_loop()
    try:
        first = protocol.send(pack(("GET", "a")), loop)
        await _next_turns()
        assert transport.writes == [pack(("GET", "a"))]
        protocol.pause_writing()  # the socket's buffer is over its high-water mark
        queued = [protocol.send(pack(("GET", key)), loop) for key in "bcd"]
        await _next_turns()
        assert transport.writes == [pack(("GET", "a"))]  # nothing more written while paused
        queued.append(protocol.send(pack(("GET", "e")), loop))
        protocol.resume_writing()
        # Everything queued leaves at once, in the order it was sent.
        assert transport.writes[1:] == [b"".join(pack(("GET", key)) for key in "bcde")]
        await _next_turns()  # the flush scheduled before the pause finds nothing left
        assert len(transport.writes) == 2
        protocol.data_received(b"$1\r\nA\r\n$1\r\nB\r\n$-1\r\n-ERR no\r\n$1\r\nE\r\n")
        assert await first == b"A"
        results = await asyncio.gather(*queued, return_exceptions=True)
        assert results[:2] == [b"B", None] and results[3] == b"E"
        assert isinstance(results[2], RedisReplyError) and str(results[2]) == "ERR no"
    finally:
        protocol.connection_lost(None)


async def test_a_pause_during_a_flush_keeps_later_commands_queued() -> None:
    """The transport pauses from inside write() (as asyncio's do): what follows waits."""
    protocol, transport = _connected()
    loop = asyncio.get_running_loop()
    transport.on_write = protocol.pause_writing
    try:
        protocol.send(pack(("SET", "big", b"x" * 100)), loop)
        await _next_turns()
        assert len(transport.writes) == 1 and protocol.flow.write_paused
        later = protocol.send(pack(("PING",)), loop)
        await _next_turns()
        assert len(transport.writes) == 1
        transport.on_write = None
        protocol.resume_writing()
        assert transport.writes[1] == pack(("PING",))
        protocol.data_received(b"+OK\r\n+PONG\r\n")
        assert await later == b"PONG"
    finally:
        protocol.connection_lost(None)


async def test_drain_waits_for_resume_and_a_lost_connection_releases_it() -> None:
    protocol, _ = _connected()
    loop = asyncio.get_running_loop()
    await asyncio.wait_for(protocol.flow.drain(), 1)  # writable: at once
    protocol.pause_writing()
    draining = asyncio.ensure_future(protocol.flow.drain())
    await _next_turns()
    assert not draining.done()
    protocol.resume_writing()
    await asyncio.wait_for(draining, 1)

    protocol.pause_writing()
    draining = asyncio.ensure_future(protocol.flow.drain())
    queued = protocol.send(pack(("GET", "k")), loop)
    protocol.connection_lost(ConnectionResetError("reset by peer"))
    await asyncio.wait_for(draining, 1)  # nobody waits on a dead connection
    with pytest.raises(RedisConnectionError, match="reset by peer"):
        await queued


async def test_a_full_socket_pauses_the_pipe_and_nothing_is_lost_or_reordered(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A stopped Redis reads nothing: big writes fill the socket until the transport asks
    for a pause. Commands sent meanwhile wait; when Redis runs again every reply reaches
    its own caller."""
    server = RedisServer(workdir=tmp_path_factory.mktemp("paused-redis")).start()
    pipe = RedisPipe(server.url, timeout=30)
    pid = server.pid
    assert pid is not None
    try:
        assert await pipe.execute("PING") == b"PONG"
        os.kill(pid, signal.SIGSTOP)
        values = {f"big{i}": os.urandom(1 << 20) for i in range(64)}
        sets = []
        for key, value in values.items():
            sets.append(asyncio.ensure_future(pipe.execute("SET", key, value)))
            await asyncio.sleep(0)  # one write per command: the socket fills up
            if pipe.write_paused:
                break
        assert pipe.write_paused, "64 MiB did not fill the socket"
        drained = asyncio.ensure_future(pipe.drain())
        gets = [asyncio.ensure_future(pipe.execute("GET", key)) for key in list(values)[:3]]
        await _next_turns()
        assert not drained.done() and not any(get.done() for get in gets)
        os.kill(pid, signal.SIGCONT)
        assert await asyncio.wait_for(asyncio.gather(*sets), 20) == [b"OK"] * len(sets)
        await asyncio.wait_for(drained, 1)
        assert await asyncio.wait_for(asyncio.gather(*gets), 20) == [
            values[key] if i < len(sets) else None for i, key in enumerate(list(values)[:3])
        ]
        assert not pipe.write_paused
    finally:
        os.kill(pid, signal.SIGCONT)
        await pipe.close()
        server.stop()


async def test_one_large_read_of_many_replies_reaches_every_caller_in_order() -> None:
    """A read larger than the slice hiredis is fed at a time: replies that straddle slice
    edges, one larger than several slices, an error and a nil in the middle."""
    protocol, _ = _connected()
    loop = asyncio.get_running_loop()
    rng = random.Random(7)
    values = [os.urandom(rng.choice((1, 700, 5_000, 17_000))) for _ in range(150)]
    values[60] = os.urandom(100_000)
    try:
        waiters = [protocol.send(pack(("GET", str(i))), loop) for i in range(len(values) + 2)]
        read = b"".join(b"$%d\r\n%s\r\n" % (len(v), v) for v in values) + b"-ERR no\r\n$-1\r\n"
        assert len(read) > 10 * 16_384
        protocol.data_received(read)
        got = await asyncio.gather(*waiters, return_exceptions=True)
        assert got[: len(values)] == values
        assert isinstance(got[-2], RedisReplyError) and got[-1] is None
        assert not protocol.waiting and not protocol.lost
    finally:
        protocol.connection_lost(None)


async def test_a_large_read_with_a_reply_nobody_asked_for_fails_the_connection() -> None:
    protocol, transport = _connected()
    loop = asyncio.get_running_loop()
    asked = protocol.send(pack(("GET", "a")), loop)
    protocol.data_received(b"$40000\r\n" + b"a" * 40_000 + b"\r\n" + b"$1\r\nb\r\n" * 20_000)
    assert await asked == b"a" * 40_000
    assert protocol.lost and transport.closing
