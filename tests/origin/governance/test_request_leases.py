"""Request permits leased ahead of use, against a real Redis: a busy key asks Redis for
its permits in growing batches, two processes' leases together never exceed the limit,
small limits are still checked request by request, and a policy change ends the leases
at the next request."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from deploy.policy_store import PolicyStore
from origin.connection.redis_pipe import RedisPipe
from origin.governance.rate_limit_scripts import LEASE_SHARE
from origin.metrics import Metrics
from origin.store.redis_cache import RedisCache
from prism import RateLimits, entry_key
from tests.fixtures.origin import redis_now_us

KEY = "key1"


@pytest.fixture
def store(redis_url: str) -> Iterator[PolicyStore]:
    redis.Redis.from_url(redis_url).config_resetstat()  # `checks` counts from here
    policies = PolicyStore.from_url(redis_url)
    yield policies
    policies.close()


@pytest.fixture
async def caches(redis_url: str) -> AsyncIterator[list[RedisCache]]:
    """Two origin processes' caches: each its own connection and its own leases."""
    clients = [RedisPipe(redis_url, 2.0) for _ in range(2)]
    yield [RedisCache(client, Metrics()) for client in clients]
    for client in clients:
        await client.close()


def limit(store: PolicyStore, rpm: int) -> None:
    store.set("acme", rate_limits=RateLimits.from_dict({"project": {"rpm": rpm}}))


def checks(redis_url: str) -> int:
    """Rate checks Redis has run (each reads the limits' hash once)."""
    stats = redis.Redis.from_url(redis_url).info("commandstats")
    return int(stats.get("cmdstat_hmget", {}).get("calls", 0))


async def test_a_busy_key_takes_its_permits_in_growing_leases(
    caches: list[RedisCache], store: PolicyStore, redis_url: str
) -> None:
    limit(store, 1_000_000)  # leases of up to 1,000 permits
    cache = caches[0]
    remaining = []
    for _ in range(3000):
        found = await cache.lookup(KEY, None, "acme", count=True)
        assert found.rate is not None and found.rate[0] == 1
        remaining.append(found.rate[2])
    taken = checks(redis_url)
    assert taken < 20  # 1, 2, 4 ... 1,000: a dozen checks, not 3,000
    assert all(0 <= left <= 1_000_000 for left in remaining)
    # One fewer with each request; it may rise (the bucket refilled meanwhile) only when a
    # lease is taken or the next one starts being spent.
    assert sum(later > earlier for earlier, later in itertools.pairwise(remaining)) <= 2 * taken


async def test_two_processes_leasing_never_exceed_the_limit(
    caches: list[RedisCache], store: PolicyStore, redis_url: str
) -> None:
    rpm = 4 * LEASE_SHARE  # leases of up to 4
    limit(store, rpm)
    admitted = 0
    started = time.monotonic()
    for number in range(rpm + 400):
        found = await caches[number % 2].lookup(KEY, None, "acme", count=True)
        assert found.rate is not None
        admitted += found.rate[0]
    elapsed = time.monotonic() - started
    # Never beyond the bucket and what refilled meanwhile; short of it by at most the
    # permits each process leased and did not spend.
    assert rpm - 2 * 4 <= admitted <= rpm + int(elapsed * rpm / 60) + 1
    assert checks(redis_url) < (rpm + 400) * 0.7  # most requests spent a leased permit


async def test_small_limits_are_checked_request_by_request(
    caches: list[RedisCache], store: PolicyStore, redis_url: str
) -> None:
    limit(store, 2 * LEASE_SHARE - 1)  # a lease would be one permit: none is taken
    for _ in range(20):
        assert (await caches[0].lookup(KEY, None, "acme", count=True)).rate is not None
    assert checks(redis_url) == 20


async def test_a_policy_change_ends_the_leases_at_the_next_request(
    caches: list[RedisCache], store: PolicyStore
) -> None:
    cache = caches[0]
    limit(store, 1_000_000)
    for _ in range(50):  # a lease of many permits is held now
        await cache.lookup(KEY, None, "acme", count=True)
    limit(store, 3)
    verdicts = [(await cache.lookup(KEY, None, "acme", count=True)).rate for _ in range(4)]
    assert [rate[0] if rate else None for rate in verdicts] == [1, 1, 1, 0]
    assert verdicts[0] is not None and verdicts[0][1] == 3  # the new limit, at once
    store.clear("acme")
    assert (await cache.lookup(KEY, None, "acme", count=True)).rate is None


async def test_requests_in_flight_together_take_one_lease_not_one_each(
    caches: list[RedisCache], store: PolicyStore, redis_url: str
) -> None:
    """64 lookups of one key at a time: one of them asks for the next lease (ahead of
    need), the others spend leased permits or take exactly their own. Were each to ask,
    every round would take 64 leases and keep one, and the bucket would run dry at a
    fraction of the limit (it did: refusals at 1,800 a minute under a 20,000 limit)."""
    rpm = 200 * LEASE_SHARE  # leases of up to 200
    limit(store, rpm)
    admin = redis.Redis.from_url(redis_url)
    began_us = redis_now_us(admin)
    started = time.monotonic()
    rounds, at_once = 40, 64
    for _ in range(rounds):
        found = await asyncio.gather(
            *(caches[0].lookup(KEY, None, "acme", count=True) for _ in range(at_once))
        )
        assert all(f.rate is not None and f.rate[0] == 1 for f in found)
    elapsed = time.monotonic() - started
    # Each permit taken moves the key's TAT 60/rpm s on (from now, when it is behind).
    tat = float(
        admin.hget("prism:limits:acme", f"s.{KEY}.rpm")
        or admin.hget("prism:limits:acme", "s.rpm")
        or 0
    )
    taken = (tat - began_us) / (60e6 / rpm)
    requests = rounds * at_once
    assert taken <= requests + 2 * 200 + elapsed * rpm / 60 + 1
    assert checks(redis_url) < requests / 4


async def test_a_request_admitted_by_its_lease_gets_its_entry_when_the_ask_ahead_is_refused(
    caches: list[RedisCache], store: PolicyStore, admin: redis.Redis
) -> None:
    """The bucket is emptied behind this process's back (as another process's burst
    would), straight from Redis's clock: its ask ahead is refused at any machine speed,
    while the permits it leased still admit requests, each with its stored entry."""
    rpm = 8 * LEASE_SHARE  # leases of up to 8
    limit(store, rpm)
    admin.set(entry_key("fp"), b"stored answer")
    mine = caches[0]
    for _ in range(6):  # leases of 1, 2, 4: this process holds permits
        await mine.lookup(KEY, None, "acme", count=True)
    # Empty, and in deficit for a minute more: nothing refills while the lease is spent.
    admin.hset("prism:limits:acme", "s.rpm", redis_now_us(admin) + 2 * 60e6)
    admitted = []
    while (found := await mine.lookup(KEY, "fp", "acme", count=True)).rate and found.rate[0]:
        admitted.append(found.entry)
    assert admitted  # some were admitted from the lease
    assert admitted == [b"stored answer"] * len(admitted)
    assert found.rate is not None and not found.rate[0]  # then refused: the bucket is empty


async def test_a_key_below_its_lease_size_a_second_wastes_few_permits(
    caches: list[RedisCache], store: PolicyStore, admin: redis.Redis
) -> None:
    """Four keys at 40 requests a second, leases of up to 60: permits taken from the
    bucket (read from its state, kept ahead of Redis's clock) against requests admitted."""
    rpm, available = 60 * LEASE_SHARE, 2000
    step_us = 60e6 / rpm
    limit(store, rpm)
    cache = caches[0]
    # The bucket as after a burst: ``available`` permits in it, so its state stays ahead
    # of now and tells how many were taken.
    admin.hset("prism:limits:acme", "s.rpm", redis_now_us(admin) + 60e6 - available * step_us)
    began = redis_now_us(admin)
    admitted = 0

    async def key(name: str, per_second: float = 40, seconds: float = 5) -> None:
        nonlocal admitted
        start = time.monotonic()
        for i in range(int(per_second * seconds)):
            # The workload's pace (what is measured), not a wait for something to happen.
            await asyncio.sleep(max(0.0, start + i / per_second - time.monotonic()))
            found = await cache.lookup(name, None, "acme", count=True)
            assert found.rate is not None
            admitted += found.rate[0]

    await asyncio.gather(*(key(f"key{n}") for n in range(4)))
    ended = redis_now_us(admin)
    tat = float(admin.hget("prism:limits:acme", "s.rpm") or 0)
    assert tat > ended  # the bucket never filled: the count below holds
    taken = available + (ended - began) / step_us - (60e6 - (tat - ended)) / step_us
    assert admitted == 4 * 200
    assert taken - admitted <= 0.1 * taken
