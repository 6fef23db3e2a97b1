"""Request coalescing on its own: ``FlightTable`` with a fake router, no server.

The fake router's calls are driven by hand (a queue of stream bytes, an event that
releases a JSON answer), so each test decides exactly when the provider answers,
fails or goes silent.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import orjson
import pytest

from origin.apis.chat import ChatOperation
from origin.providers.base import UpstreamCompletion, UpstreamStream
from origin.routing.coalescing import FlightTable
from origin.routing.operation import Operation
from origin.routing.router import Routed
from origin.routing.shared_call import Call, Storage
from origin.routing.subscription import ClientStream, Subscription
from prism import PrismError, UpstreamError, UpstreamTimeoutError
from tests.polling import async_wait_for

pytestmark = pytest.mark.timeout(10)  # a waiter left hanging fails fast

KEY = "f" * 64
BODY: dict[str, Any] = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "demo",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hi!"}, "finish_reason": "stop"}
    ],
}
END = object()  # the provider closes the body cleanly
CHAT = ChatOperation()


def event(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> bytes:
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "demo"}
    chunk["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}]
    return b"data: " + orjson.dumps({**chunk, **extra}) + b"\n\n"


HELLO = [
    event({"role": "assistant", "content": ""}),
    event({"content": "Hel"}),
    event({"content": "lo"}),
]
FINISH = event(finish="stop")


class FakeRouter:
    """``Router.complete`` / ``stream`` / ``stream_failed`` with answers fed by the test."""

    def __init__(self) -> None:
        self.calls = 0
        self.failed: list[PrismError] = []
        self.finished = 0
        self.fallback = False
        self.answer = asyncio.Event()  # releases complete()
        self.complete_error: BaseException | None = None
        self.cancelled = 0  # calls cancelled while waiting or streaming
        self.closed = 0  # streams released with aclose()
        self.feed: asyncio.Queue[bytes | BaseException | object] = asyncio.Queue()

    async def complete(
        self,
        body: dict[str, Any],
        model: str,
        op: Operation,
        tried: list[dict[str, Any]] | None = None,
    ) -> Routed[UpstreamCompletion]:
        self.calls += 1
        try:
            await self.answer.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.complete_error is not None:
            raise self.complete_error
        return Routed(
            UpstreamCompletion(orjson.dumps(ANSWER), ANSWER), "fake", "Fake", self.fallback
        )

    async def stream(
        self,
        body: dict[str, Any],
        model: str,
        op: Operation,
        tried: list[dict[str, Any]] | None = None,
    ) -> Routed[UpstreamStream]:
        self.calls += 1

        async def close() -> None:
            self.closed += 1

        return Routed(UpstreamStream(self._events(), close), "fake", "Fake", self.fallback)

    async def _events(self) -> AsyncIterator[bytes]:
        while True:
            try:
                item = await self.feed.get()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            if item is END:
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, bytes)
            yield item

    def stream_failed(self, routed: Routed[UpstreamStream], error: PrismError) -> None:
        self.failed.append(error)

    def stream_finished(self, routed: Routed[UpstreamStream]) -> None:
        self.finished += 1

    def redact(self, routed: Routed[object], message: str) -> str:
        return message.replace("sk-secret", "[redacted]")

    def send(self, *items: bytes | BaseException | object) -> None:
        for item in items:
            self.feed.put_nowait(item)


class Stores:
    """The cache write: records each store; its Redis write lands when the test says."""

    def __init__(self) -> None:
        self.stored: list[tuple[str, dict[str, Any], int, bool]] = []
        self.write: asyncio.Future[bool] | None = None

    def __call__(
        self,
        fingerprint: str,
        result: UpstreamCompletion,
        model: str,
        ttl: int,
        fallback: bool,
        semantic: object = None,
    ) -> asyncio.Future[bool]:
        self.stored.append((fingerprint, result.completion, ttl, fallback))
        self.write = asyncio.get_running_loop().create_future()
        return self.write


@pytest.fixture
def router() -> FakeRouter:
    return FakeRouter()


@pytest.fixture
def stores() -> Stores:
    return Stores()


@pytest.fixture
def table(router: FakeRouter, stores: Stores) -> FlightTable:
    return FlightTable(router, stores)


def call(
    stream: bool, store: bool = True, body: dict[str, Any] = BODY, request_id: str = "req-1"
) -> Call:
    return Call(
        op=CHAT,
        body=body,
        model="demo",
        stream=stream,
        request_id=request_id,
        storage=Storage(KEY, 3600) if store else None,
    )


async def read_all(stream: ClientStream) -> bytes:
    return b"".join([chunk async for chunk in stream])


async def follow(subscription: Subscription, include_usage: bool = False) -> ClientStream:
    assert await subscription.started()
    return subscription.follow(include_usage)


def payloads(sse: bytes) -> list[Any]:
    return [
        line[6:].decode() if line == b"data: [DONE]" else json.loads(line[6:])
        for line in sse.split(b"\n\n")
        if line
    ]


# -- sharing one call ------------------------------------------------------------------


async def test_identical_requests_share_one_call_and_all_get_the_answer(
    table: FlightTable, router: FakeRouter, stores: Stores
) -> None:
    subscriptions = [table.subscribe(KEY, call(stream=False)) for _ in range(20)]
    waiters = [asyncio.ensure_future(s.answer()) for s in subscriptions]
    await async_wait_for(lambda: router.calls == 1)  # the shared call is under way
    router.answer.set()
    answers = await asyncio.gather(*waiters)
    assert {a.body for a in answers if a is not None} == {orjson.dumps(ANSWER)}
    assert router.calls == 1
    assert len(stores.stored) == 1 and stores.stored[0][0] == KEY
    for subscription in subscriptions:
        subscription.leave()


async def test_an_answer_stays_joinable_until_its_redis_write_has_landed(
    table: FlightTable, router: FakeRouter, stores: Stores
) -> None:
    router.answer.set()
    async with table.subscribe(KEY, call(stream=False)) as first:
        assert await first.answer() is not None
    assert stores.write is not None and not stores.write.done()
    # A request that missed Redis while the entry was being written joins the answer.
    async with table.subscribe(KEY, call(stream=False)) as late:
        assert (await late.answer()) == (await first.answer())
    async with table.subscribe(KEY, call(stream=True)) as late_stream:
        sse = await read_all(await follow(late_stream))
    assert sse.endswith(b"data: [DONE]\n\n") and b"Hi!" in sse
    assert router.calls == 1 and len(table) == 1
    stores.write.set_result(True)
    await async_wait_for(lambda: len(table) == 0)


async def test_an_answer_not_stored_is_forgotten_at_once(
    table: FlightTable, router: FakeRouter, stores: Stores
) -> None:
    router.answer.set()
    async with table.subscribe(KEY, call(stream=False, store=False)) as subscription:
        assert await subscription.answer() is not None
    assert len(table) == 0 and stores.stored == []


async def test_no_key_never_joins(table: FlightTable, router: FakeRouter) -> None:
    router.answer.set()
    async with table.subscribe(None, call(False)) as a, table.subscribe(None, call(False)) as b:
        await asyncio.gather(a.answer(), b.answer())
    assert router.calls == 2 and len(table) == 0


async def test_fallback_answers_reach_the_store_as_such(
    table: FlightTable, router: FakeRouter, stores: Stores
) -> None:
    router.fallback = True
    router.answer.set()
    async with table.subscribe(KEY, call(stream=False)) as subscription:
        await subscription.answer()
        assert subscription.fallback and subscription.provider == "Fake"
    assert stores.stored[0][3] is True


# -- clients that leave ----------------------------------------------------------------


async def test_one_streaming_client_leaving_does_not_stop_the_others(
    table: FlightTable, router: FakeRouter, stores: Stores
) -> None:
    router.send(*HELLO[:2])
    first = await follow(table.subscribe(KEY, call(stream=True)))
    second = await follow(table.subscribe(KEY, call(stream=True)))
    assert b"Hel" in await anext(first)
    await first.aclose()
    router.send(HELLO[2], FINISH, b"data: [DONE]\n\n", END)
    text = "".join(
        p["choices"][0]["delta"].get("content") or ""
        for p in payloads(await read_all(second))
        if isinstance(p, dict)
    )
    assert text == "Hello"
    assert router.cancelled == 0 and router.calls == 1
    assert len(stores.stored) == 1


async def test_the_last_streaming_client_leaving_cancels_the_upstream_call(
    table: FlightTable, router: FakeRouter, stores: Stores
) -> None:
    router.send(*HELLO)
    clients = [await follow(table.subscribe(KEY, call(stream=True))) for _ in range(3)]
    for client in clients:
        await anext(client)
        await client.aclose()
    assert len(table) == 0  # forgotten at once: a new request does not join a dying call
    await async_wait_for(lambda: router.cancelled == 1 and router.closed == 1)
    assert stores.stored == [] and router.failed == []
    # the next identical request starts afresh
    router.send(*HELLO, FINISH, END)
    async with table.subscribe(KEY, call(stream=True)) as again:
        assert (await read_all(await follow(again))).endswith(b"data: [DONE]\n\n")
    assert router.calls == 2


async def test_a_json_client_that_goes_away_leaves_and_cancels_the_call(
    table: FlightTable, router: FakeRouter
) -> None:
    gone = asyncio.Event()
    async with table.subscribe(KEY, call(stream=False)) as subscription:
        waiting = asyncio.ensure_future(subscription.answer(gone.wait))
        await async_wait_for(lambda: router.calls == 1)  # the shared call is under way
        gone.set()
        assert await waiting is None
    await async_wait_for(lambda: router.cancelled == 1)
    assert len(table) == 0


async def test_a_json_client_going_away_leaves_the_call_to_those_still_waiting(
    table: FlightTable, router: FakeRouter, stores: Stores
) -> None:
    gone = asyncio.Event()
    leaver = table.subscribe(KEY, call(stream=False))
    stayer = table.subscribe(KEY, call(stream=False))
    leaving = asyncio.ensure_future(leaver.answer(gone.wait))
    staying = asyncio.ensure_future(stayer.answer(asyncio.Event().wait))
    await async_wait_for(lambda: router.calls == 1)  # the shared call is under way
    gone.set()
    assert await leaving is None
    leaver.leave()
    router.answer.set()
    assert (await staying) is not None
    stayer.leave()
    assert router.cancelled == 0 and len(stores.stored) == 1


async def test_a_waiting_client_is_woken_by_the_answer_and_left_uncancelled(
    table: FlightTable, router: FakeRouter
) -> None:
    """The wait runs in the client's own task, woken by cancelling it out of
    ``client_gone``: that cancel must never leak to the caller (nor a cancel from
    outside be swallowed)."""

    async def wait() -> tuple[object, int]:
        answer = await subscription.answer(asyncio.Event().wait)
        task = asyncio.current_task()
        assert task is not None
        await asyncio.sleep(0)  # a leaked cancel would land here
        return answer, task.cancelling()

    async with table.subscribe(KEY, call(stream=False)) as subscription:
        waiting = asyncio.ensure_future(wait())
        await async_wait_for(lambda: router.calls == 1)
        router.answer.set()
        answer, cancelling = await waiting
    assert answer is not None and cancelling == 0
    router.answer.clear()
    async with table.subscribe("another-key", call(stream=False)) as other:
        stopped = asyncio.ensure_future(other.answer(asyncio.Event().wait))
        await async_wait_for(lambda: router.calls == 2)
        stopped.cancel()  # the server stopping this request: it stays stopped
        with pytest.raises(asyncio.CancelledError):
            await stopped


async def test_a_streaming_client_gone_before_the_first_event_leaves(
    table: FlightTable, router: FakeRouter
) -> None:
    gone = asyncio.Event()
    async with table.subscribe(KEY, call(stream=True)) as subscription:
        waiting = asyncio.ensure_future(subscription.started(gone.wait))
        await async_wait_for(lambda: router.calls == 1)  # the shared call is under way
        gone.set()
        assert await waiting is False
    await async_wait_for(lambda: router.cancelled == 1 and router.closed == 1)


# -- failures --------------------------------------------------------------------------


async def test_an_upstream_error_reaches_every_waiter_and_frees_the_key(
    table: FlightTable, router: FakeRouter, stores: Stores, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="prism.origin")
    router.complete_error = UpstreamTimeoutError("Timed out waiting for provider 'fake'.")
    subscriptions = [
        table.subscribe(KEY, call(stream=False, request_id=f"req-{i}")) for i in range(5)
    ]
    streaming = table.subscribe(KEY, call(stream=True))  # a stream joining a JSON call
    waiters: list[Awaitable[object]] = [asyncio.ensure_future(s.answer()) for s in subscriptions]
    waiters.append(asyncio.ensure_future(streaming.started()))
    router.answer.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, UpstreamTimeoutError) and r.status == 504 for r in results)
    assert len(table) == 0 and stores.stored == []
    (record,) = caplog.records  # once, naming the request that started the call
    assert "request req-0 failed: 504 upstream_timeout" in record.getMessage()


async def test_an_unexpected_exception_ends_every_waiter_with_a_500_and_is_logged(
    table: FlightTable, router: FakeRouter, caplog: pytest.LogCaptureFixture
) -> None:
    router.complete_error = KeyError("a bug in a provider adapter")
    subscriptions = [
        table.subscribe(KEY, call(stream=False, request_id=f"req-{i}")) for i in range(5)
    ]
    router.answer.set()
    with caplog.at_level(logging.ERROR, logger="prism.origin"):
        results = await asyncio.gather(*[s.answer() for s in subscriptions], return_exceptions=True)
    for result in results:
        assert type(result) is PrismError
        assert (result.status, result.code) == (500, "internal_error")
    assert len(table) == 0
    (record,) = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert "req-0" in record.getMessage() and record.exc_info is not None
    router.complete_error = None  # the next identical request starts a fresh call
    async with table.subscribe(KEY, call(stream=False)) as again:
        assert await again.answer() is not None
    assert router.calls == 2


async def test_a_failure_before_the_first_event_is_raised_to_streaming_clients(
    table: FlightTable, router: FakeRouter
) -> None:
    router.send(UpstreamTimeoutError("Timed out waiting for provider 'fake'."))
    subscriptions = [table.subscribe(KEY, call(stream=True)) for _ in range(3)]
    results = await asyncio.gather(*[s.started() for s in subscriptions], return_exceptions=True)
    assert all(isinstance(r, UpstreamTimeoutError) for r in results)
    assert len(table) == 0 and router.closed == 1


@pytest.mark.parametrize(
    ("breakage", "code", "counted_here"),
    [
        (b"data: {not json\n\n", "upstream_malformed", True),
        (b'data: {"error": {"message": "overloaded"}}\n\n', "upstream_stream_error", True),
        (END, "upstream_truncated", True),  # closed cleanly before the finish_reason
        (UpstreamTimeoutError("Timed out waiting for provider 'fake'."), "upstream_timeout", False),
        (UpstreamError("Provider 'fake' failed: ClientPayloadError."), "bad_gateway", False),
    ],
)
async def test_a_stream_that_breaks_midway_ends_with_an_error_event_and_no_done(
    table: FlightTable,
    router: FakeRouter,
    stores: Stores,
    breakage: bytes | BaseException | object,
    code: str,
    counted_here: bool,
) -> None:
    router.send(*HELLO)
    early = await follow(table.subscribe(KEY, call(stream=True)))
    assert b"Hel" in await anext(early)
    json_client = table.subscribe(KEY, call(stream=False))
    router.send(breakage)
    late = await follow(table.subscribe(KEY, call(stream=True)))
    for client in (early, late):
        last = payloads(await read_all(client))[-1]
        assert isinstance(last, dict) and last["error"]["code"] == code
        assert last["error"]["message"]
    with pytest.raises(UpstreamError) as raised:  # a JSON client gets it as its error reply
        await json_client.answer()
    assert raised.value.code == code
    json_client.leave()
    assert "data: [DONE]" not in (await read_all(late)).decode()
    assert stores.stored == [] and len(table) == 0 and router.closed == 1
    # the router counts failures raised by the events iterator; the flight counts its own
    assert [e.code for e in router.failed] == ([code] if counted_here else [])


async def test_the_provider_message_of_a_mid_stream_error_is_kept(
    table: FlightTable, router: FakeRouter
) -> None:
    router.send(HELLO[0], b'data: {"error": {"message": "overloaded; key sk-secret"}}\n\n')
    client = await follow(table.subscribe(KEY, call(stream=True)))
    last = payloads(await read_all(client))[-1]
    assert "overloaded; key [redacted]" in last["error"]["message"]  # the router redacts


# -- streams that end ------------------------------------------------------------------


async def test_a_late_joiner_gets_the_events_so_far_then_the_live_ones(
    table: FlightTable, router: FakeRouter
) -> None:
    router.send(*HELLO[:2])
    early = await follow(table.subscribe(KEY, call(stream=True)))
    assert b"Hel" in await anext(early)
    late = await follow(table.subscribe(KEY, call(stream=True)))
    so_far = await anext(late)
    assert so_far == HELLO[0] + HELLO[1]
    router.send(HELLO[2], FINISH, b"data: [DONE]\n\n", END)
    rest = await read_all(late)
    assert rest == HELLO[2] + FINISH + b"data: [DONE]\n\n"
    assert (await read_all(early)).endswith(b"data: [DONE]\n\n")
    assert router.finished == 1  # told the router the answer is whole before reading on


async def test_a_stream_that_closes_cleanly_without_done_is_complete(
    table: FlightTable, router: FakeRouter, stores: Stores
) -> None:
    router.send(*HELLO, FINISH, END)  # every choice finished, then the body ends: no [DONE]
    client = await follow(table.subscribe(KEY, call(stream=True)))
    async with table.subscribe(KEY, call(stream=False)) as json_client:  # joins the stream
        sse = await read_all(client)
        answer = await json_client.answer()
    assert sse.endswith(FINISH + b"data: [DONE]\n\n")
    assert answer is not None and answer.completion["choices"][0]["message"]["content"] == "Hello"
    assert len(stores.stored) == 1 and router.failed == []


async def test_without_done_a_promised_usage_chunk_must_arrive(
    table: FlightTable, router: FakeRouter, stores: Stores
) -> None:
    body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    router.send(*HELLO, FINISH, END)  # the usage chunk the request asked for never came
    client = await follow(table.subscribe(KEY, call(stream=True, body=body)), include_usage=True)
    last = payloads(await read_all(client))[-1]
    assert last["error"]["code"] == "upstream_truncated"
    assert stores.stored == [] and [e.code for e in router.failed] == ["upstream_truncated"]


async def test_the_usage_chunk_goes_only_to_clients_that_asked(
    table: FlightTable, router: FakeRouter
) -> None:
    usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
    usage_chunk = (
        b"data: " + orjson.dumps({"id": "chatcmpl-1", "choices": [], "usage": usage}) + b"\n\n"
    )
    router.send(*HELLO, FINISH, usage_chunk, b"data: [DONE]\n\n", END)
    asked = await follow(table.subscribe(KEY, call(stream=True)), include_usage=True)
    not_asked = await follow(table.subscribe(KEY, call(stream=True)), include_usage=False)
    with_usage, without = await asyncio.gather(read_all(asked), read_all(not_asked))
    assert usage_chunk in with_usage and usage_chunk not in without
    assert with_usage.replace(usage_chunk, b"") == without
