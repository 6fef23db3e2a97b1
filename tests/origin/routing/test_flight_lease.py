"""Shared flights across processes (``origin.routing.flight_lease``) on the test's real Redis:
two flight tables stand for two processes, each with its own fake router, so each test
decides exactly when the leader's provider answers, fails, goes silent or is abandoned."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis

from deploy.local.provider import closed_port
from origin import Settings
from origin.connection.redis_pipe import RedisPipe
from origin.governance.resumed_bill import Resumption
from origin.providers.base import UpstreamCompletion
from origin.routing.coalescing import FlightTable
from origin.routing.flight_lease import FlightLeases
from origin.routing.shared_call import Call
from prism import UpstreamError
from tests.fixtures.origin import origin_env
from tests.origin.routing.test_coalescing import (
    END,
    FINISH,
    HELLO,
    KEY,
    FakeRouter,
    Stores,
    call,
    follow,
    payloads,
    read_all,
)
from tests.polling import async_wait_for

pytestmark = pytest.mark.timeout(20)


class Process:
    """One origin process's part: its router, its stores, its leases and its table."""

    def __init__(self, url: str, wait_limit: float = 30.0, lease: float = 3.0) -> None:
        self.router = FakeRouter()
        self.stores = Stores()
        self.redis = RedisPipe(url, 1.0)
        self.outcomes: list[str] = []
        self.leases = FlightLeases(
            self.redis,
            url,
            lambda model, stream: wait_limit,
            self.outcomes.append,
            lease=lease,
        )
        self.table = FlightTable(self.router, self.stores, leases=self.leases)

    async def close(self) -> None:
        await self.leases.close()
        await self.redis.close()


@pytest.fixture
async def two(redis_url: str) -> AsyncIterator[tuple[Process, Process]]:
    pair = (Process(redis_url), Process(redis_url, lease=0.6))
    yield pair
    for process in pair:
        await process.close()


class Settled:
    """The bill a flight tells: paid (the answer) or joined."""

    def __init__(self) -> None:
        self.paid: list[UpstreamCompletion | None] = []
        self.joined_calls = 0

    def __call__(
        self,
        result: UpstreamCompletion | None,
        provider: str,
        upstream: str,
        resumption: Resumption | None = None,
    ) -> None:
        self.paid.append(result)

    def joined(self) -> None:
        self.joined_calls += 1


def billed(stream: bool, settled: Settled) -> Call:
    return call(stream)._replace(on_end=settled)


async def lead(process: Process, stream: bool, settled: Settled | None = None) -> Any:
    """Subscribe in ``process`` and wait until it holds the lease (its call started)."""
    subscription = process.table.subscribe(KEY, billed(stream, settled or Settled()))
    await async_wait_for(lambda: process.router.calls == 1, 5)
    return subscription


async def test_a_follower_relays_the_leaders_stream_live_and_pays_nothing(
    two: tuple[Process, Process],
) -> None:
    leader, other = two
    first = await lead(leader, stream=True)
    settled = Settled()
    joined = other.table.subscribe(KEY, billed(True, settled))
    leader.router.send(*HELLO)
    ours = await follow(first)
    theirs = await follow(joined)  # started: the leader's first events crossed over
    assert other.router.calls == 0
    leader.router.send(FINISH, b"data: [DONE]\n\n", END)
    mine, relayed = await asyncio.gather(read_all(ours), read_all(theirs))
    assert relayed == mine and payloads(relayed)[-1] == "[DONE]"
    assert other.router.calls == 0 and other.outcomes == ["follow"]
    assert leader.outcomes == ["lead"]
    assert len(leader.stores.stored) == 1 and other.stores.stored == []  # the leader stores
    assert settled.joined_calls == 1 and settled.paid == []


async def test_a_follower_of_a_json_call_gets_its_answer_and_provider(
    two: tuple[Process, Process],
) -> None:
    leader, other = two
    first = await lead(leader, stream=False)
    joined = other.table.subscribe(KEY, call(stream=False))
    waiting = asyncio.ensure_future(joined.answer())
    await asyncio.sleep(0)
    leader.router.answer.set()
    mine, theirs = await asyncio.gather(first.answer(), waiting)
    assert mine is not None and theirs is not None
    assert theirs.body == mine.body and theirs.completion == mine.completion
    assert joined.provider == first.provider == "Fake" and other.router.calls == 0


async def test_an_abandoned_call_is_taken_over_by_a_follower(two: tuple[Process, Process]) -> None:
    """The leader's clients all left: it stops paying, and the other process, whose
    clients still wait, takes the lease and calls (once)."""
    leader, other = two
    first = await lead(leader, stream=False)
    joined = other.table.subscribe(KEY, call(stream=False))
    waiting = asyncio.ensure_future(joined.answer())
    await async_wait_for(lambda: other.leases._pool is not None, 5)  # it follows
    first.leave()  # the leader's last client leaves: its call is cancelled
    await async_wait_for(lambda: other.router.calls == 1, 5)
    other.router.answer.set()
    answer = await waiting
    assert answer is not None
    assert answer.completion["choices"][0]["message"]["content"] == "Hi!"
    assert other.outcomes == ["take_over"] and leader.router.cancelled == 1


async def test_a_leader_lost_mid_stream_ends_its_followers_streams_with_an_error(
    two: tuple[Process, Process],
) -> None:
    """What a follower relayed cannot be spliced onto a new call: its clients' streams end
    with the error event, as a provider's broken stream does, and nobody calls again."""
    leader, other = two
    first = await lead(leader, stream=True)
    joined = other.table.subscribe(KEY, call(stream=True))
    leader.router.send(*HELLO)
    theirs = await follow(joined)
    first.leave()
    relayed = payloads(await read_all(theirs))
    assert relayed[-1]["error"]["code"] == "upstream_truncated"
    assert "[DONE]" not in relayed and other.router.calls == 0


async def test_a_leader_whose_call_outlives_its_lease_keeps_it_renewed(
    two: tuple[Process, Process],
) -> None:
    leader, other = two[1], two[0]  # the one whose lease lasts 0.6 s unrenewed
    first = await lead(leader, stream=False)
    joined = other.table.subscribe(KEY, call(stream=False))
    waiting = asyncio.ensure_future(joined.answer())
    await asyncio.sleep(2.0)  # the call itself takes this long: over three leases' worth
    leader.router.answer.set()
    assert await first.answer() is not None and await waiting is not None
    assert other.router.calls == 0 and other.outcomes == ["follow"]


async def test_after_redis_lost_its_scripts_a_flight_still_ends_for_its_followers(
    two: tuple[Process, Process], admin: redis.Redis
) -> None:
    leader, other = two
    first = leader.table.subscribe(KEY, call(stream=False, store=False))  # no lingering
    leader.router.answer.set()
    await first.answer()
    await async_wait_for(lambda: not admin.exists(f"prism:flight:{{{KEY}}}"), 5)  # released
    admin.script_flush()  # as a restarted Redis: every loaded script is gone
    leader.router.calls = 0
    leader.router.answer = asyncio.Event()
    second = await lead(leader, stream=False)
    joined = other.table.subscribe(KEY, call(stream=False))
    waiting = asyncio.ensure_future(joined.answer())
    leader.router.answer.set()
    assert await second.answer() is not None
    assert await asyncio.wait_for(waiting, 5) is not None and other.router.calls == 0


async def test_a_silent_leader_is_waited_for_only_up_to_the_first_byte_limit(
    redis_url: str,
) -> None:
    leader, other = Process(redis_url), Process(redis_url, wait_limit=0.3)
    try:
        await lead(leader, stream=False)  # and its provider never answers
        joined = other.table.subscribe(KEY, call(stream=False))
        other.router.answer.set()
        answer = await asyncio.wait_for(joined.answer(), 5)
        assert answer is not None and other.router.calls == 1 and other.outcomes == ["own"]
    finally:
        leader.router.answer.set()
        for process in (leader, other):
            await process.close()


async def test_a_stored_answers_lease_lingers_so_a_late_miss_does_not_call_again(
    two: tuple[Process, Process],
) -> None:
    """A process whose Redis lookup missed just before the entry landed follows the ended
    flight (its lease lingers) and gets the answer without a call."""
    leader, other = two
    first = await lead(leader, stream=False)
    leader.router.answer.set()
    await first.answer()
    late = other.table.subscribe(KEY, call(stream=False))
    answer = await asyncio.wait_for(late.answer(), 5)
    assert answer is not None and other.router.calls == 0 and other.outcomes == ["follow"]


async def test_a_failed_call_releases_its_lease_at_once(
    two: tuple[Process, Process], admin: redis.Redis
) -> None:
    leader, other = two
    leader.router.complete_error = UpstreamError("The provider failed.")
    first = await lead(leader, stream=False)
    leader.router.answer.set()
    with pytest.raises(UpstreamError):
        await first.answer()
    # Released right after its own clients heard (the lease itself would last 3 s).
    await async_wait_for(lambda: not admin.exists(f"prism:flight:{{{KEY}}}"), 1)
    other.router.answer.set()
    answer = await asyncio.wait_for(other.table.subscribe(KEY, call(False)).answer(), 5)
    assert answer is not None and other.router.calls == 1 and other.outcomes == ["lead"]


async def test_without_redis_each_process_calls_on_its_own(redis_url: str) -> None:
    down = Process(f"redis://127.0.0.1:{closed_port()}/0")
    try:
        down.router.answer.set()
        answer = await asyncio.wait_for(down.table.subscribe(KEY, call(False)).answer(), 5)
        assert answer is not None and down.router.calls == 1 and down.outcomes == ["own"]
    finally:
        await down.close()


def test_shared_flights_are_off_by_default_where_the_lookup_reads_a_replica() -> None:
    """The lease is taken on the primary: a far one would cost every miss its round trip."""
    base = origin_env("redis://127.0.0.1:6379/0", "http://127.0.0.1:9")
    assert Settings.from_env(base).flight_lease == 3.0
    replica = {**base, "PRISM_REDIS_READ_URL": "redis://127.0.0.1:6380/0"}
    assert Settings.from_env(replica).flight_lease == 0.0
    assert Settings.from_env({**replica, "PRISM_FLIGHT_LEASE": "2"}).flight_lease == 2.0
