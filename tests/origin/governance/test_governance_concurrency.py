"""Request limits, token limits and budgets under concurrency, through the real path:
origins over real HTTP on one real Redis, the local provider stand-in, 32 to 96 requests
in flight. Each checks what sequential tests cannot: that concurrent requests neither
take more than the limit allows nor leave requests refused below it (the leasing bug:
32 requests in flight drained the bucket ~30 times faster than they came), and that
everything reserved or admitted on a bound is settled to exactly the real usage.

Where a test needs the exact effect of its requests on a GCRA limit, it plants the
limit's state (its theoretical arrival time, TAT) half a period (or more) ahead of Redis's
clock: the bucket then never fills up during the test, so no refill is clamped away and
the TAT moves by exactly the permits (or tokens) taken, whatever the timing. Where many
requests must be decided before any call ends, the calls are held at the provider until
they are (``send_held``), not given a latency to race against."""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
import pytest
import redis

from deploy.local.delay_proxy import DelayProxy
from deploy.local.provider import ProviderServer
from deploy.local.redis import RedisServer
from deploy.policy_store import PolicyStore
from origin.governance.rate_limit_scripts import LEASE_SHARE
from origin.governance.request_leases import LEASE_SECONDS
from origin.governance.token_bounds import completion_token_bound, prompt_token_bound
from prism import Budget, Limit, RateLimits, parse_chat_request
from tests.fixtures.origin import (
    Origin,
    OriginFactory,
    RunningOrigin,
    redis_now_us,
    settled_budget,
)
from tests.fixtures.origin_workers import AnyOriginFactory
from tests.origin.governance.test_budgets import MODEL, bound_of, cost_of, providers_file
from tests.origin.governance.test_rate_limits import limit, primed, store
from tests.polling import async_wait_for, wait_for

__all__ = ["providers_file", "store"]  # fixtures, used by name

CHAT = "/v1/chat/completions"
LIMITS = "prism:limits:acme"
PERIOD_US = 60_000_000
COALESCED = "prism_origin_coalesced_requests_total"
# A Redis timeout well above a busy process's event-loop stalls, for the origins under many
# hundreds of requests at once: a lookup that timed out would be a bypass, admitted
# unchecked (as it must be when Redis is down), and these tests are about the limits.
PATIENT = {"redis_timeout": 10.0}
# The shapes a load is served by: (origin processes, workers each). One origin of two
# workers (`prism origin serve --workers 2`, spawned) must hold a limit as two origins do.
SHAPES = [(1, 1), (2, 1), (1, 2)]


def plant(admin: redis.Redis, field: str, ahead_us: int = PERIOD_US // 2) -> int:
    """Set a limit's TAT ``ahead_us`` ahead of Redis's clock (by default half a period):
    the bucket stays short of full through the test, so the TAT then moves by exactly
    what is taken. Returns the TAT planted."""
    tat = redis_now_us(admin) + ahead_us
    admin.hset(LIMITS, field, tat)
    return tat


def taken_since(admin: redis.Redis, field: str, planted: int, per_minute: int) -> int:
    """Permits (or tokens) a limit of ``per_minute`` has taken since its TAT was planted."""
    state = admin.hget(LIMITS, field)
    assert state is not None, f"{field} was deleted: the bucket refilled or all went back"
    return round((float(state) - planted) / (PERIOD_US / per_minute))


async def send_all(
    urls: Sequence[str],
    key: str,
    payloads: Sequence[dict[str, Any]],
    at_once: int,
    sent_at: list[float] | None = None,
    headers: dict[str, str] | None = None,
    answered: list[httpx.Response] | None = None,
) -> list[httpx.Response]:
    """POST every payload, ``at_once`` in flight, each sender on its own connection,
    round-robin over ``urls``; with ``sent_at``, the monotonic time each request was sent,
    by index; with ``answered``, each reply as it comes (as an ``httpx.Response``).

    The senders are aiohttp clients: the load generator costs a fraction of httpx's CPU per
    request, so the load stays well above the limits it is meant to outrun on a slow or
    busy machine too (tests here send many hundreds through an origin in this process).
    Each closes a connection idle for a second, before the origin's keep-alive timeout
    (5 s) would: reusing one the origin is closing at that moment fails the request."""
    replies: list[httpx.Response | None] = [None] * len(payloads)
    if sent_at is not None:
        sent_at[:] = [0.0] * len(payloads)
    indices = iter(range(len(payloads)))
    encoded: dict[int, bytes] = {}
    sent_headers = {
        "authorization": f"Bearer {key}",
        "content-type": "application/json",
        **(headers or {}),
    }

    async def sender() -> None:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1, keepalive_timeout=1.0),
            timeout=aiohttp.ClientTimeout(total=60),
            headers=sent_headers,
        ) as http:
            for index in indices:
                payload = payloads[index]
                body = encoded.get(id(payload))
                if body is None:
                    body = encoded[id(payload)] = orjson.dumps(payload)
                if sent_at is not None:
                    sent_at[index] = time.monotonic()
                url = urls[index % len(urls)] + CHAT
                async with http.post(url, data=body) as response:
                    content = await response.read()
                    reply = httpx.Response(
                        response.status, headers=list(response.raw_headers), content=content
                    )
                replies[index] = reply
                if answered is not None:
                    answered.append(reply)

    await asyncio.gather(*(sender() for _ in range(min(at_once, len(payloads)))))
    return [reply for reply in replies if reply is not None]


async def send_held(
    provider: ProviderServer,
    urls: Sequence[str],
    key: str,
    payloads: Sequence[dict[str, Any]],
    origin: Origin | None = None,
) -> list[httpx.Response]:
    """``send_all``, all at once, each call held at the provider (by a queued
    ``stall_before_first_byte``) until every request is decided: its call held there,
    refused (answered: no call answers while held) or joined to a held call (counted by
    ``origin``); then the calls are released. So every request is decided before any call
    ends, however slowly the requests arrive."""
    answered: list[httpx.Response] = []
    sending = asyncio.create_task(send_all(urls, key, payloads, len(payloads), answered=answered))

    def decided() -> bool:
        joined = origin.metric(COALESCED) if origin is not None else 0
        held = int(provider.control.stats()["chat_requests"])
        return held + len(answered) + joined >= len(payloads)

    await async_wait_for(decided, within=60)
    provider.control.release()
    return await sending


def statuses(responses: Sequence[httpx.Response]) -> dict[int, int]:
    found: dict[int, int] = {}
    for response in responses:
        found[response.status_code] = found.get(response.status_code, 0) + 1
    return found


# ------------------------------------------------------------------ request limits


@pytest.mark.parametrize(("processes", "workers"), SHAPES)
def test_load_under_a_leased_limit_is_all_admitted_and_takes_what_it_spends(
    any_origin_factory: AnyOriginFactory,
    api_key: str,
    store: PolicyStore,
    admin: redis.Redis,
    processes: int,
    workers: int,
) -> None:
    """1,200 hits, 64 in flight, against a limit far above them (leases of up to 200):
    none refused, and the bucket loses what was spent plus at most the two leases each
    process may hold unspent at a time (origin/governance/request_leases.py), each lasting a
    second. Before the fix, each request without a permit took a lease of its own."""
    origins = [any_origin_factory(workers, settings=PATIENT) for _ in range(processes)]
    payload = primed(origins[0], api_key)
    rpm, lease = 200 * LEASE_SHARE, 200
    limit(store, project={"rpm": rpm})
    # All but 2 s of a period ahead: what the load takes moves the TAT by well under a
    # second a second, so the bucket neither fills nor runs dry for nearly a minute,
    # however slowly the load is served.
    planted = plant(admin, "s.rpm", PERIOD_US - 2_000_000)
    requests = 1200
    started = time.monotonic()
    replies = asyncio.run(send_all([o.url for o in origins], api_key, [payload] * requests, 64))
    lifetimes = math.ceil((time.monotonic() - started) / LEASE_SECONDS) + 1
    assert statuses(replies) == {200: requests}
    assert {r.headers["x-prism-edge-cache-layer"] for r in replies} == {"redis"}
    taken = taken_since(admin, "s.rpm", planted, rpm)
    assert requests <= taken <= requests + 2 * lease * processes * workers * lifetimes


@pytest.mark.parametrize(("processes", "workers"), SHAPES)
@pytest.mark.parametrize("rpm", [1500, 2 * LEASE_SHARE + 400])  # unleased, leases of 2
def test_load_over_the_limit_admits_the_limit_no_more_no_less(
    any_origin_factory: AnyOriginFactory,
    api_key: str,
    store: PolicyStore,
    admin: redis.Redis,
    processes: int,
    workers: int,
    rpm: int,
) -> None:
    """900 hits, 64 in flight, with room for 200 left in the bucket: exactly those 200
    are admitted (and what refilled meanwhile), less at most the permits leased and left
    unspent, two leases a process. (The load must outrun the refill, 25 or 40 a second,
    to meet the limit: 700 more than the room are sent, so it does unless the 900 take
    over 28 or 17 s.)"""
    origins = [any_origin_factory(workers, settings=PATIENT) for _ in range(processes)]
    payload = primed(origins[0], api_key)
    limit(store, project={"rpm": rpm})
    lease = rpm // LEASE_SHARE if rpm >= 2 * LEASE_SHARE else 0
    room = 200
    began = redis_now_us(admin)
    plant(admin, "s.rpm", PERIOD_US - room * PERIOD_US // rpm)
    replies = asyncio.run(send_all([o.url for o in origins], api_key, [payload] * 900, 64))
    elapsed_us = redis_now_us(admin) - began
    counted = statuses(replies)
    refill = elapsed_us * rpm // PERIOD_US + 1
    assert set(counted) == {200, 429}, f"{elapsed_us / 1e6:.1f} s: the refill ({refill}) kept up"
    assert room - 2 * lease * processes * workers <= counted[200] <= room + refill
    refused = [r for r in replies if r.status_code == 429]
    assert {r.json()["error"]["type"] for r in refused} == {"requests"}
    assert {r.headers["x-ratelimit-limit-requests"] for r in refused} == {str(rpm)}


def test_a_limit_lowered_mid_load_binds_every_request_sent_after_it(
    origin_factory: OriginFactory, api_key: str, store: PolicyStore, admin: redis.Redis
) -> None:
    """Two origins leasing under 200,000 a minute, 64 in flight; after 300 answers the
    limit becomes 100. Every request sent after the change is judged by the new limit
    (leases taken under the old one are void), the new limit admits its bucket and no
    more, and nothing was refused under the old one."""
    first, second = origin_factory(settings=PATIENT), origin_factory(settings=PATIENT)
    payload = primed(first, api_key)
    limit(store, project={"rpm": 200 * LEASE_SHARE})
    requests, low = 1200, 100
    sent_at: list[float] = []
    changed_at = 0.0

    async def run() -> list[httpx.Response]:
        nonlocal changed_at
        load = asyncio.create_task(
            send_all([first.url, second.url], api_key, [payload] * requests, 64, sent_at)
        )
        answered = lambda: sum(1 for t in sent_at if t) >= 300 + 64  # noqa: E731
        await async_wait_for(answered, within=60, interval=0.001)
        await asyncio.to_thread(limit, store, project={"rpm": low})
        changed_at = time.monotonic()
        return await load

    began = redis_now_us(admin)
    replies = asyncio.run(run())
    elapsed_us = redis_now_us(admin) - began
    after = [r for r, t in zip(replies, sent_at, strict=True) if t > changed_at]
    assert len(after) > low  # enough load after the change to meet the new limit
    assert {r.headers["x-ratelimit-limit-requests"] for r in after} == {str(low)}
    under_low = [r for r in replies if r.headers["x-ratelimit-limit-requests"] == str(low)]
    admitted_low = sum(r.status_code == 200 for r in under_low)
    # The old limit's TAT is at most (1,200 + leases) x 0.3 ms ahead: a permit of 600 ms.
    assert low - 2 <= admitted_low <= low + elapsed_us * low // PERIOD_US + 1
    old = [r for r in replies if r.headers["x-ratelimit-limit-requests"] != str(low)]
    assert {r.status_code for r in old} == {200}


# -------------------------------------------------------------------- token limits


def chat_body(words: int, max_tokens: int, tag: str | None = None) -> dict[str, Any]:
    """A chat of ``words`` prompt words (the stand-in's prompt tokens) after a tag."""
    content = " ".join([tag or secrets.token_hex(4), *["ab"] * words])
    return {"model": "demo", "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens}  # fmt: skip


def token_bound(payload: dict[str, Any]) -> int:
    chat = parse_chat_request(json.dumps(payload))
    return prompt_token_bound(chat) + completion_token_bound(chat)


@pytest.mark.parametrize("workers", [1, 2])
def test_concurrent_misses_settle_the_token_limit_to_their_real_usage(
    any_origin_factory: AnyOriginFactory,
    api_key: str,
    store: PolicyStore,
    admin: redis.Redis,
    provider: ProviderServer,
    workers: int,
) -> None:
    """48 distinct misses at once whose bounds are far over what the bucket holds: as many
    are admitted as their bounds fit, and once every call has settled the limit has
    taken exactly their real usage (an unreturned bound or a double give-back moves the
    TAT by hundreds of tokens)."""
    origin = any_origin_factory(workers)
    tpm = 12_000  # 5 ms a token
    limit(store, project={"tpm": tpm})
    planted = plant(admin, "s.tpm")  # 6,000 tokens fit now
    payloads = [chat_body(30, 600) for _ in range(48)]
    bound = token_bound(payloads[0])
    assert {token_bound(p) for p in payloads} == {bound} and 48 * bound > tpm
    # The calls are held until every request is decided: all admitted before one settles.
    provider.control.set_fault("stall_before_first_byte", count=48, seconds=60)
    began = redis_now_us(admin)
    replies = asyncio.run(send_held(provider, [origin.url], api_key, payloads))
    elapsed_us = redis_now_us(admin) - began
    origin.wait_stored()  # the settles run after the response
    admitted = [r for r in replies if r.status_code == 200]
    refused = [r for r in replies if r.status_code == 429]
    assert len(admitted) + len(refused) == 48
    assert {r.json()["error"]["type"] for r in refused} == {"tokens"}
    room = tpm // 2 + elapsed_us * tpm // PERIOD_US
    assert tpm // 2 // bound <= len(admitted) <= room // bound
    used = sum(r.json()["usage"]["total_tokens"] for r in admitted)
    assert 0 < used < len(admitted) * bound
    wait_for(lambda: taken_since(admin, "s.tpm", planted, tpm) == used, timeout=5)


def test_coalesced_misses_take_one_calls_tokens(
    origin: RunningOrigin,
    api_key: str,
    store: PolicyStore,
    admin: redis.Redis,
    provider: ProviderServer,
) -> None:
    """32 identical misses at once make one provider call; the token limit ends up
    charged that one call's usage: the joiners take no tokens."""
    tpm = 60_000
    limit(store, project={"tpm": tpm})
    planted = plant(admin, "s.tpm")
    payload = chat_body(40, 200)
    assert 32 * token_bound(payload) < tpm // 2  # every bound fits at once
    provider.control.set_fault("latency", ms=300)
    replies = asyncio.run(send_all([origin.url], api_key, [payload] * 32, 32))
    assert statuses(replies) == {200: 32}
    assert provider.control.stats()["chat_requests"] == 1
    origin.wait_stored()
    used = replies[0].json()["usage"]["total_tokens"]
    wait_for(lambda: taken_since(admin, "s.tpm", planted, tpm) == used, timeout=5)


def test_requests_joining_a_call_in_flight_are_not_refused_tokens_they_do_not_use(
    origin: RunningOrigin,
    api_key: str,
    store: PolicyStore,
    admin: redis.Redis,
    provider: ProviderServer,
) -> None:
    """One call in flight holds its bound; seven identical requests then join it. They
    use no tokens (the one call's usage is settled to its starter), so none should be
    refused for tokens, as none is refused for budget."""
    tpm = 6_000  # 100 tokens a second refill: not a bound's worth during the test
    limit(store, project={"tpm": tpm})
    payload = chat_body(40, 200)
    bound = token_bound(payload)
    # Room for the starter's bound and not for a second one.
    plant(admin, "s.tpm", PERIOD_US - 3 * bound // 2 * PERIOD_US // tpm)
    provider.control.set_fault("stall_before_first_byte", seconds=60)  # until all have joined

    async def run() -> list[httpx.Response]:
        starter = asyncio.create_task(send_all([origin.url], api_key, [payload], 1))
        await async_wait_for(lambda: provider.control.stats()["chat_requests"] == 1)
        joiners = asyncio.create_task(send_all([origin.url], api_key, [payload] * 7, 7))
        await async_wait_for(lambda: origin.metric(COALESCED) == 7, within=60)
        provider.control.release()
        return [*await starter, *await joiners]

    replies = asyncio.run(run())
    assert provider.control.stats()["chat_requests"] == 1
    assert statuses(replies) == {200: 8}, [r.text for r in replies if r.status_code != 200]


# ------------------------------------------------------------------------- budgets


def set_budget_and_tokens(store: PolicyStore, usd: float, tpm: int | None = None) -> None:
    limits = RateLimits(project=Limit(tpm=tpm)) if tpm is not None else None
    store.set("acme", budget=Budget(usd, "day"), rate_limits=limits, updated_by="test")


def priced_body(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": 1000, **extra}  # fmt: skip


@pytest.mark.parametrize("token_limit", [False, True])
def test_concurrent_misses_and_coalesced_groups_spend_exactly_their_calls(
    origin_factory: OriginFactory,
    providers_file: Path,
    api_key: str,
    store: PolicyStore,
    admin: redis.Redis,
    provider: ProviderServer,
    token_limit: bool,
) -> None:
    """96 misses at once: 32 distinct questions and 8 questions asked 8 times each,
    against a budget with room for 20 reservations (with and without a token limit).
    Never more reserved than the budget; once settled nothing is reserved or held and
    the spend is exactly the real cost of the calls made, each paid once."""
    origin = origin_factory(PRISM_PROVIDERS_FILE=str(providers_file))
    payloads = [priced_body(f"single {i:03d}") for i in range(32)]
    payloads += [priced_body(f"shared {i:03d}") for i in range(8) for _ in range(8)]
    bound = bound_of(origin, payloads[0])
    assert {bound_of(origin, p) for p in payloads} == {bound}
    budget = bound * 20 + bound // 2
    set_budget_and_tokens(store, budget / 1_000_000, 10_000_000 if token_limit else None)
    # The calls are held until every request is decided: every reservation is tried
    # before any call settles and frees money.
    provider.control.set_fault("stall_before_first_byte", count=100, seconds=60)
    replies = asyncio.run(send_held(provider, [origin.url], api_key, payloads, origin))
    admitted = [r for r in replies if r.status_code == 200]
    refused = [r for r in replies if r.status_code == 429]
    assert len(admitted) + len(refused) == 96
    assert {r.json()["error"]["code"] for r in refused} == {"budget_exceeded"}
    calls = provider.control.stats()["chat_requests"]
    assert 0 < calls <= 20  # every call reserved its bound first
    origin.wait_stored()
    answered = {r.json()["choices"][0]["message"]["content"]: r.json()["usage"] for r in admitted}
    assert len(answered) == calls  # one call per question answered, joiners included
    spent = sum(cost_of(usage) for usage in answered.values())
    state = settled_budget(admin)
    assert state == {"spent": spent, "reserved": 0, "held": 0}
    assert spent <= budget


def test_streams_left_mid_call_release_or_pay_once(
    origin_factory: OriginFactory,
    providers_file: Path,
    api_key: str,
    store: PolicyStore,
    admin: redis.Redis,
    provider: ProviderServer,
) -> None:
    """16 streams at once stall mid-answer; every client that started one leaves, and
    for half of them a second client has joined and reads on. The 8 abandoned calls are
    released (cost nothing), the 8 joined ones are paid once, to their usage."""
    origin = origin_factory(PRISM_PROVIDERS_FILE=str(providers_file))
    set_budget_and_tokens(store, 5, 1_000_000)
    payloads = [
        priced_body(f"stream {i:02d}", stream=True, stream_options={"include_usage": True})
        for i in range(16)
    ]
    # Stalled until released below (the minute is only a backstop).
    provider.control.set_fault("stall_mid_stream", count=16, after_chunks=2, seconds=60)

    async def run() -> list[bytes]:
        async with httpx.AsyncClient(
            base_url=origin.url,
            headers={"authorization": f"Bearer {api_key}"},
            timeout=30,
            limits=httpx.Limits(max_connections=64),
        ) as http:
            left = asyncio.Event()

            async def start(payload: dict[str, Any]) -> None:
                async with http.stream("POST", CHAT, json=payload) as started:
                    assert started.headers["x-prism-edge-cache-layer"] == "miss"
                    received = started.aiter_raw()  # kept: dropping it closes the stream
                    assert (await anext(received)).startswith(b"data: ")
                    await left.wait()  # leaves once every joiner has joined

            async def join(payload: dict[str, Any]) -> bytes:
                async with http.stream("POST", CHAT, json=payload) as joined:
                    assert joined.status_code == 200
                    return await joined.aread()

            starters = [asyncio.create_task(start(p)) for p in payloads]
            await async_wait_for(lambda: provider.control.stats()["open_streams"] == 16)
            joiners = [asyncio.create_task(join(p)) for p in payloads[::2]]
            await async_wait_for(
                lambda: origin.metric("prism_origin_coalesced_requests_total") == 8
            )
            left.set()
            await asyncio.gather(*starters)
            # The calls no one joined were cancelled when their starters left, mid-stall.
            await async_wait_for(lambda: provider.control.stats()["open_streams"] == 8)
            assert provider.control.stats()["streams_completed"] == 0
            provider.control.release()  # the joined calls go on
            return list(await asyncio.gather(*joiners))

    raws = asyncio.run(run())
    origin.wait_stored()
    usages = []
    for raw in raws:
        assert raw.endswith(b"data: [DONE]\n\n")
        events = [json.loads(e) for e in raw.decode().split("data: ")[1:-1]]
        usages.append(events[-1]["usage"])
    assert provider.control.stats()["chat_requests"] == 16
    spent = sum(cost_of(usage) for usage in usages)
    state = settled_budget(admin)
    assert state == {"spent": spent, "reserved": 0, "held": 0}


@pytest.mark.parametrize("workers", [1, 2])
def test_every_provider_call_is_paid_under_identical_load_with_a_token_limit(
    any_origin_factory: AnyOriginFactory,
    providers_file: Path,
    api_key: str,
    store: PolicyStore,
    admin: redis.Redis,
    provider: ProviderServer,
    redis_server: RedisServer,
    workers: int,
) -> None:
    """One question asked every 2 ms for 0.6 s (not stored: each request joins the call
    in flight or starts one), under a budget and a token limit, Redis 20 ms away as a
    hosted Redis is: every provider call made is paid, so the spend is the number of
    calls times one call's cost. (Requests that see a call in flight and have their
    tokens admitted while it ends start a call no budget pays for: a dozen a call.)"""
    with DelayProxy(redis_server.host, redis_server.port, 0.01) as far:
        origin = any_origin_factory(
            workers,
            PRISM_PROVIDERS_FILE=str(providers_file),
            REDIS_URL=f"redis://{far.host}:{far.port}/0",
            settings=PATIENT,  # a budget check that timed out would be a 503
        )
        set_budget_and_tokens(store, 5, 100_000_000)
        payload = priced_body("the same question")
        provider.control.set_fault("latency", count=-1, ms=50)

        async def run() -> list[httpx.Response]:
            async with httpx.AsyncClient(
                base_url=origin.url,
                headers={"authorization": f"Bearer {api_key}", "cache-control": "no-store"},
                timeout=30,
                limits=httpx.Limits(max_connections=400),
            ) as http:
                sent = []
                for _ in range(300):  # paced load, not synchronisation: arrivals spread out
                    sent.append(asyncio.create_task(http.post(CHAT, json=payload)))
                    await asyncio.sleep(0.002)
                return list(await asyncio.gather(*sent))

        replies = asyncio.run(run())
        provider.control.clear()
        assert statuses(replies) == {200: 300}
        origin.wait_stored()
        calls = provider.control.stats()["chat_requests"]
        cost = cost_of(replies[0].json()["usage"])
        state = settled_budget(admin)
        assert state == {"spent": calls * cost, "reserved": 0, "held": 0}, f"{calls} calls"
