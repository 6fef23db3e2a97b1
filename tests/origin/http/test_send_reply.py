"""A streamed reply is pumped in the request's own task, watched for the client leaving."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import pytest

from origin.http.asgi import send_reply
from origin.http.responses import Reply
from tests.polling import async_wait_for


class _Stream:
    """Yields ``chunks``, then waits for ever (unless ``end``); records its close."""

    def __init__(self, chunks: list[bytes], end: bool = False, fail: bool = False) -> None:
        self._chunks = list(chunks)
        self._end = end
        self._fail = fail
        self.closed = False

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> bytes:
        if self._chunks:
            return self._chunks.pop(0)
        if self._fail:
            raise RuntimeError("broken stream")
        if self._end:
            raise StopAsyncIteration
        await asyncio.Event().wait()  # a provider that has gone quiet
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        self.closed = True


class _Client:
    def __init__(self) -> None:
        self.gone = asyncio.Event()
        self.sent: list[MutableMapping[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, event: MutableMapping[str, Any]) -> None:
        self.sent.append(event)


async def test_a_stream_is_sent_whole_and_closed() -> None:
    client, stream = _Client(), _Stream([b"a", b"b"], end=True)
    await send_reply(Reply(200, {}, b"", stream), client.receive, client.send)
    bodies = [event.get("body") for event in client.sent[1:]]
    assert bodies == [b"a", b"b", b""]
    assert stream.closed
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_the_client_leaving_ends_a_quiet_stream_at_once() -> None:
    client, stream = _Client(), _Stream([b"a"])
    sending = asyncio.ensure_future(
        send_reply(Reply(200, {}, b"", stream), client.receive, client.send)
    )
    await async_wait_for(lambda: len(client.sent) == 2)
    client.gone.set()
    await asyncio.wait_for(sending, 5)  # returns (no error): nobody is left to answer
    assert stream.closed
    assert sending.result() is None


async def test_a_broken_stream_raises_and_is_closed() -> None:
    client, stream = _Client(), _Stream([b"a"], fail=True)
    with pytest.raises(RuntimeError, match="broken stream"):
        await send_reply(Reply(200, {}, b"", stream), client.receive, client.send)
    assert stream.closed


async def test_a_cancelled_request_stays_cancelled() -> None:
    client, stream = _Client(), _Stream([])
    sending = asyncio.ensure_future(
        send_reply(Reply(200, {}, b"", stream), client.receive, client.send)
    )
    await async_wait_for(lambda: len(client.sent) == 1)
    sending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sending
    assert stream.closed
