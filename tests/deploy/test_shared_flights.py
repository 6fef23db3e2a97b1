"""One provider call per question across processes (origin/routing/flight_lease.py), for
real: `prism origin serve` processes (4 workers of one, or two origins on their own ports)
sharing the test's Redis, the local provider stand-in counting what it is asked."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Sequence

import httpx
import orjson
import pytest
import redis

from deploy.local.provider import ProviderServer
from deploy.local.provider_settings import ProviderSettings
from tests.fixtures.origin_workers import WorkersOrigin, WorkersOriginFactory
from tests.polling import wait_for

pytestmark = pytest.mark.timeout(300)  # `prism` processes' start-up on a slow machine

CHAT = "/v1/chat/completions"
SHARED = "prism_origin_shared_flights_total"


def question(content: str, stream: bool) -> dict[str, object]:
    return {"model": "demo", "messages": [{"role": "user", "content": content}], "stream": stream}


async def ask_all(
    urls: Sequence[str], key: str, body: dict[str, object], count: int
) -> list[tuple[int, bytes]]:
    """``count`` identical requests at once, each on a connection of its own (so a
    multi-worker origin's kernel hands them to its workers), spread over ``urls``."""
    async with httpx.AsyncClient(
        headers={"authorization": f"Bearer {key}"},
        timeout=60,
        limits=httpx.Limits(max_keepalive_connections=0, max_connections=count),
    ) as http:

        async def one(index: int) -> tuple[int, bytes]:
            answer = await http.post(urls[index % len(urls)] + CHAT, json=body)
            return answer.status_code, answer.content

        return await asyncio.gather(*(one(i) for i in range(count)))


def text_of(status: int, body: bytes, stream: bool) -> str:
    """The answer's text: the message, or the stream's deltas (which must end whole)."""
    assert status == 200, body[:300]
    if not stream:
        answer = orjson.loads(body)
        assert answer["choices"][0]["finish_reason"] == "stop"
        return str(answer["choices"][0]["message"]["content"])
    events = [line[6:] for line in body.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"[DONE]", body[-300:]
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)


def following(admin: redis.Redis) -> int:
    """Connections blocked reading a shared flight's stream: a process following a call."""
    return sum(1 for client in admin.client_list() if client.get("cmd") == "xread")


def shared(origins: Sequence[WorkersOrigin], outcome: str) -> float:
    return sum(origin.metric(SHARED, outcome=outcome) for origin in origins)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_200_identical_misses_over_4_workers_make_one_provider_call(
    workers_origin_factory: WorkersOriginFactory,
    provider: ProviderServer,
    api_key: str,
    stream: bool,
) -> None:
    origin = workers_origin_factory(4)
    provider.control.reset()
    # The call takes long enough for all 200 to arrive while it runs.
    provider.control.set_fault("latency", ms=1500)
    results = asyncio.run(ask_all([origin.url], api_key, question("one call", stream), 200))
    texts = {text_of(status, body, stream) for status, body in results}
    assert len(texts) == 1 and texts != {""}
    assert provider.control.stats()["chat_requests"] == 1
    assert shared([origin], "lead") == 1
    assert shared([origin], "follow") >= 1  # the other workers followed the leader's call


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_two_origins_on_their_own_ports_share_one_call(
    workers_origin_factory: WorkersOriginFactory,
    provider: ProviderServer,
    api_key: str,
    stream: bool,
) -> None:
    origins = [workers_origin_factory(1), workers_origin_factory(1)]
    provider.control.reset()
    provider.control.set_fault("latency", ms=1000)
    urls = [origin.url for origin in origins]
    results = asyncio.run(ask_all(urls, api_key, question("two origins", stream), 200))
    texts = {text_of(status, body, stream) for status, body in results}
    assert len(texts) == 1
    assert provider.control.stats()["chat_requests"] == 1
    assert shared(origins, "lead") == 1 and shared(origins, "follow") == 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_killed_leader_is_replaced_and_every_follower_is_answered(
    workers_origin_factory: WorkersOriginFactory,
    provider: ProviderServer,
    admin: redis.Redis,
    api_key: str,
    stream: bool,
) -> None:
    """The leader's process dies during its call: its lease lapses, the other origin takes
    over (one more call, not one per client) and every one of its clients is answered."""
    leader, follower = (workers_origin_factory(1, PRISM_FLIGHT_LEASE="1") for _ in range(2))
    provider.control.reset()
    provider.control.set_fault("stall_before_first_byte", seconds=60)  # the leader's call
    body = question("the leader dies", stream)

    async def scenario() -> list[tuple[int, bytes]]:
        first = asyncio.ensure_future(ask_all([leader.url], api_key, body, 1))
        await asyncio.to_thread(
            wait_for, lambda: provider.control.stats()["chat_requests"] == 1, 30
        )
        rest = asyncio.ensure_future(ask_all([follower.url], api_key, body, 50))
        # The follower process waits on the leader's flight before the leader dies.
        await asyncio.to_thread(wait_for, lambda: following(admin) >= 1, 30)
        os.kill(leader.process.pid, signal.SIGKILL)
        answers = await rest
        first.cancel()
        return answers

    answers = asyncio.run(scenario())
    texts = {text_of(status, content, stream) for status, content in answers}
    assert len(texts) == 1
    assert provider.control.stats()["chat_requests"] == 2
    assert follower.metric(SHARED, outcome="take_over") == 1


def test_a_failure_is_not_shared_each_process_calls_again(
    workers_origin_factory: WorkersOriginFactory, admin: redis.Redis, api_key: str
) -> None:
    """The leader's call fails: its clients get the error, the other process's clients are
    not handed it as their answer but make a call of their own (one for the process)."""
    with ProviderServer(ProviderSettings(latency_ms=1000)) as slow:
        env = {"OPENAI_BASE_URL": slow.url + "/v1"}
        origins = [workers_origin_factory(1, env), workers_origin_factory(1, env)]
        slow.control.set_fault("status", status=400)  # the first call only
        body = question("the leader fails", False)

        async def scenario() -> list[list[tuple[int, bytes]]]:
            first = asyncio.ensure_future(ask_all([origins[0].url], api_key, body, 10))
            await asyncio.to_thread(wait_for, lambda: slow.control.stats()["chat_requests"], 30)
            rest = asyncio.ensure_future(ask_all([origins[1].url], api_key, body, 10))
            await asyncio.to_thread(wait_for, lambda: following(admin) >= 1, 30)
            return list(await asyncio.gather(first, rest))

        failed, answered = asyncio.run(scenario())
        assert {status for status, _ in failed} == {400}
        assert {status for status, _ in answered} == {200}
        assert slow.control.stats()["chat_requests"] == 2
        assert origins[1].metric(SHARED, outcome="own") == 1
