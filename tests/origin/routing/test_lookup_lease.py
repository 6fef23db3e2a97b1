"""A miss's shared-flight lease taken in its Redis lookup (``origin.store.redis_cache``'s
``lookup_script``, ``origin.routing.flight_lease``'s ``taken``/``adopt``/``let_go``): the
script on the test's real Redis, then real origins on it answered by the local provider."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis

from deploy.local.provider import ProviderServer
from origin.connection.redis_pipe import RedisPipe
from origin.metrics import Metrics
from origin.routing.flight_lease import _CLAIM, _lease_key
from origin.store.redis_cache import RedisCache
from prism import Budget, Policy, entry_key, parse_chat_request, policy_key
from prism import headers as h
from prism.fingerprint import fingerprint
from tests.fixtures.origin import OriginFactory, RunningOrigin
from tests.polling import wait_for

pytestmark = pytest.mark.timeout(60)

CHAT = "/v1/chat/completions"
FP = "f" * 64
SHARED = "prism_origin_shared_flights_total"


@pytest.fixture
async def cache(redis_url: str) -> AsyncIterator[RedisCache]:
    pipe = RedisPipe(redis_url, 1.0)
    yield RedisCache(pipe, Metrics(), flight_lease_ms=30_000)
    await pipe.close()


async def test_a_miss_takes_its_flights_lease_and_the_next_names_its_holder(
    cache: RedisCache, admin: redis.Redis
) -> None:
    first = await cache.lookup("key1", FP, "acme", count=True)
    assert first.available and first.entry is None and first.leads
    assert first.flight is not None and first.flight.startswith(b"#")
    # The key the flights' own commands use, held for the lease's length.
    assert admin.get(_lease_key(FP)) == first.flight
    assert 29_000 < admin.pttl(_lease_key(FP)) <= 30_000
    second = await cache.lookup("key2", FP, "acme", count=True)
    assert second.entry is None and not second.leads and second.flight == first.flight


async def test_a_hit_a_revoked_key_and_a_lookup_without_an_entry_take_no_lease(
    cache: RedisCache, admin: redis.Redis
) -> None:
    admin.set(entry_key(FP), b"stored")
    hit = await cache.lookup("key1", FP, "acme", count=True)
    assert hit.entry == b"stored" and hit.flight is None and not hit.leads
    admin.delete(entry_key(FP))
    admin.sadd("prism:revoked", "gone")
    revoked = await cache.lookup("gone", FP, "acme", count=True)
    assert revoked.revoked and revoked.flight is None
    no_entry_asked = await cache.lookup("key1", None, "acme", count=True)
    assert no_entry_asked.flight is None and not no_entry_asked.leads
    assert admin.get(_lease_key(FP)) is None and admin.get("prism:flight:ids") is None


async def test_a_lookup_that_a_replica_may_answer_leaves_the_lease_to_the_claim(
    redis_url: str, admin: redis.Redis
) -> None:
    primary, replica = RedisPipe(redis_url, 1.0), RedisPipe(redis_url, 1.0)
    try:
        cache = RedisCache(primary, Metrics(), reader=replica, flight_lease_ms=30_000)
        found = await cache.lookup("key1", FP, "acme", count=True)
        assert found.entry is None and found.flight is None and not found.leads
        assert admin.get(_lease_key(FP)) is None
    finally:
        await primary.close()
        await replica.close()


# -- through the origin -------------------------------------------------------------------


def question(content: str, model: str = "gpt-4o-mini") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}]}


def lease_of(body: dict[str, Any]) -> str:
    return _lease_key(fingerprint("acme", CHAT, parse_chat_request(json.dumps(body))))


def post(origin: RunningOrigin, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        origin.url + CHAT, json=body, headers={"authorization": f"Bearer {key}"}, timeout=30
    )


def claims_loaded(admin: redis.Redis) -> bool:
    """Whether any process ever ran the separate claim (it is loaded on first use)."""
    sha = hashlib.sha1(_CLAIM.encode()).hexdigest()
    return bool(admin.script_exists(sha)[0])


def script_calls(admin: redis.Redis) -> int:
    stats: dict[str, Any] = admin.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def test_a_miss_through_the_origin_leads_with_the_lease_its_lookup_took(
    origin_factory: OriginFactory, api_key: str, admin: redis.Redis
) -> None:
    # The request log off: its window's batch (a script) would count within the second.
    origin = origin_factory(PRISM_FLIGHT_LEASE="30", PRISM_REQUEST_LOG="off")
    admin.script_flush()
    admin.config_resetstat()
    body = question("a lease in the lookup")
    answer = post(origin, api_key, body)
    assert answer.status_code == 200 and answer.headers[h.CACHE_LAYER] == "miss"
    assert origin.metric(SHARED, outcome="lead") == 1
    # The stored answer's lease lingers, naming the lookup's flight; no claim was ever run.
    held = admin.get(lease_of(body))
    assert isinstance(held, bytes) and held.startswith(b"#")
    assert not claims_loaded(admin)
    # Two scripts in all: the lookup (its claim too), and the stream's one write at the end.
    assert wait_for(lambda: script_calls(admin) == 2, 5)


def test_a_process_whose_lookup_finds_the_lease_held_follows_with_no_claim(
    origin_factory: OriginFactory, api_key: str, admin: redis.Redis, provider: ProviderServer
) -> None:
    leader, other = origin_factory(), origin_factory()
    admin.script_flush()
    provider.control.reset()
    provider.control.set_fault("latency", ms=800)
    body = question("two origins, one call")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, leader, api_key, body)
        assert wait_for(lambda: admin.get(lease_of(body)) is not None, 5)
        second = pool.submit(post, other, api_key, body)
        answers = [first.result(), second.result()]
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].json()["choices"] == answers[1].json()["choices"]
    assert provider.control.stats()["chat_requests"] == 1
    assert leader.metric(SHARED, outcome="lead") == 1
    assert other.metric(SHARED, outcome="follow") == 1
    assert not claims_loaded(admin)


def refused_after_its_lookup(
    origin: RunningOrigin, api_key: str, admin: redis.Redis, body: dict[str, Any], status: int
) -> None:
    """``body`` is refused, and the lease its lookup took is released long before it
    would lapse (30 s)."""
    assert admin.get("prism:flight:ids") is None
    refused = post(origin, api_key, body)
    assert refused.status_code == status, refused.text
    assert admin.get("prism:flight:ids") == b"1"  # the lookup took a lease
    assert wait_for(lambda: admin.get(lease_of(body)) is None, 5)


def test_a_model_the_policy_denies_releases_the_lease_its_lookup_took(
    origin_factory: OriginFactory, api_key: str, admin: redis.Redis
) -> None:
    origin = origin_factory(PRISM_FLIGHT_LEASE="30")
    admin.set(policy_key("acme"), Policy.parse('{"allow": ["gpt-4o"]}').encode())
    refused_after_its_lookup(origin, api_key, admin, question("denied", "gpt-4o-mini"), 403)


def test_a_budget_that_refuses_releases_the_lease_its_lookup_took(
    origin_factory: OriginFactory, api_key: str, admin: redis.Redis
) -> None:
    origin = origin_factory(PRISM_FLIGHT_LEASE="30")
    admin.set(policy_key("acme"), Policy(budget=Budget(0.0001, "day")).encode())
    body = {**question("over budget"), "max_tokens": 1000}
    refused_after_its_lookup(origin, api_key, admin, body, 429)


def test_a_request_that_joins_a_flight_running_here_releases_the_lease_its_lookup_took(
    origin_factory: OriginFactory, api_key: str, admin: redis.Redis, provider: ProviderServer
) -> None:
    """The running flight lost its lease (deleted here: as if it lapsed): an identical
    request's lookup takes it, joins the flight in its process, and lets the lease go."""
    origin = origin_factory(PRISM_FLIGHT_LEASE="30")
    provider.control.reset()
    provider.control.set_fault("latency", ms=3000)  # the call outlasts the checks below
    body = question("joined here")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, origin, api_key, body)
        assert wait_for(lambda: admin.get(lease_of(body)) is not None, 5)
        admin.delete(lease_of(body))
        second = pool.submit(post, origin, api_key, body)
        assert wait_for(lambda: admin.get("prism:flight:ids") == b"2", 5)
        assert wait_for(lambda: admin.get(lease_of(body)) is None, 5)
        assert not first.done()  # released while the call ran, not by its end
        answers = [first.result(), second.result()]
    assert [a.status_code for a in answers] == [200, 200]
    assert provider.control.stats()["chat_requests"] == 1
    assert origin.metric("prism_origin_coalesced_requests_total") == 1
