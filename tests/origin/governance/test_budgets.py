"""Budgets at the origin, over real HTTP with a real Redis and the provider stand-in: the
reservation is atomic (200 concurrent misses admit exactly what the budget holds), settles
to the real cost, is released on failure and on a client leaving, refusals are 429s in
the OpenAI format and in the audit log, hits cost nothing, and a crashed process's
reservation does not hold the budget for ever."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from deploy.local.provider import ProviderServer
from deploy.local.redis import RedisServer
from origin.connection.redis_pipe import RedisPipe
from origin.governance.budgets import Budgets
from origin.governance.token_bounds import completion_token_bound, prompt_token_bound
from origin.providers.config import load_provider_config
from origin.providers.pricing import cost_micros, default_prices
from origin.providers.token_counts import tokens_of
from prism import Budget, Policy, decode_envelope, parse_chat_request, policy_key
from tests.fixtures.origin import (
    OriginFactory,
    RunningOrigin,
    budget_totals,
    redis_now_us,
    settled_budget,
)
from tests.polling import async_wait_for, wait_for
from tests.redis_replies import reply_as, stream_fields

CHAT = "/v1/chat/completions"
MODEL = "gpt-4o-mini"
PRICE = default_prices().price("p", MODEL)


@pytest.fixture
def providers_file(provider: ProviderServer, tmp_path: Path) -> Path:
    config = tmp_path / "providers.toml"
    config.write_text(
        f'[providers.p]\nbase_url = "{provider.url}/v1"\n'
        f'[models]\n"{MODEL}" = ["p"]\n"mystery-model" = ["p"]\n'
    )
    return config


@pytest.fixture
def origin(origin_factory: OriginFactory, providers_file: Path) -> RunningOrigin:
    return origin_factory(PRISM_PROVIDERS_FILE=str(providers_file))


def set_budget(admin: redis.Redis, usd: float, period: str = "day") -> None:
    admin.set(policy_key("acme"), Policy(budget=Budget(usd, period)).encode())


def body(content: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content or secrets.token_hex(8)}],
        "max_tokens": 1000,
        **extra,
    }


def post(origin: RunningOrigin, key: str, payload: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        origin.url + CHAT, json=payload, headers={"authorization": f"Bearer {key}"}, timeout=30
    )


def cost_of(usage: dict[str, Any]) -> int:
    tokens = tokens_of(usage)
    assert PRICE is not None and tokens is not None
    return cost_micros(PRICE, tokens)


def bound_of(origin: RunningOrigin, payload: dict[str, Any]) -> int:
    chat = parse_chat_request(json.dumps(payload))
    bound = origin.gateway.billing.budgets.bound(
        chat.model, prompt_token_bound(chat), completion_token_bound(chat)
    )
    assert bound is not None
    return bound


def decided(
    provider: ProviderServer, sent: Sequence[asyncio.Future[Any]], joined: float = 0
) -> int:
    """Requests decided: their call held at the provider (stalled until released), refused
    (answered: no call can answer while the stall holds), or ``joined`` to a held call."""
    held = int(provider.control.stats()["chat_requests"])
    return held + sum(f.done() for f in sent) + int(joined)


def joined(origin: RunningOrigin) -> float:
    return origin.metric("prism_origin_coalesced_requests_total")


def test_200_concurrent_misses_admit_exactly_what_the_budget_holds(
    origin: RunningOrigin, api_key: str, admin: redis.Redis, provider: ProviderServer
) -> None:
    payloads = [body(f"question {i:04d}") for i in range(200)]  # distinct, equal bounds
    bound = bound_of(origin, payloads[0])
    assert {bound_of(origin, p) for p in payloads} == {bound}
    assert PRICE is not None  # the bound is prompt bytes x input + max_tokens x output
    assert bound >= 1000 * PRICE.output
    limit = bound * 10 + bound // 2  # room for 10 reservations, not 11
    set_budget(admin, limit / 1_000_000)
    # The calls are held until every request has been decided (its call held at the
    # provider, or refused): every reservation is tried before any call settles and frees
    # money, however slowly the requests arrive.
    provider.control.set_fault("stall_before_first_byte", count=1000, seconds=60)

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=origin.url,
            headers={"authorization": f"Bearer {api_key}"},
            timeout=90,
            limits=httpx.Limits(max_connections=200),
        ) as http:
            sent = [asyncio.ensure_future(http.post(CHAT, json=p)) for p in payloads]
            await async_wait_for(lambda: decided(provider, sent) == len(sent), within=60)
            provider.control.release()
            return await asyncio.gather(*sent)

    responses = asyncio.run(run())
    admitted = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    assert len(admitted) == 10 and len(refused) == 190
    assert provider.control.stats()["chat_requests"] == 10
    error = refused[0].json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "budget_exceeded"
    assert "remains" in error["message"] and "may cost up to" in error["message"]
    assert int(refused[0].headers["retry-after"]) >= 1

    origin.wait_stored()
    state = settled_budget(admin, timeout=15)
    spent = sum(cost_of(r.json()["usage"]) for r in admitted)
    assert state == {"spent": spent, "reserved": 0, "held": 0}  # settled to the real cost
    assert 0 < spent <= limit


def test_a_miss_settles_to_its_real_cost_streamed_or_not(
    origin: RunningOrigin, api_key: str, admin: redis.Redis
) -> None:
    set_budget(admin, 5)
    answer = post(origin, api_key, body())
    assert answer.status_code == 200
    origin.wait_stored()
    first = cost_of(answer.json()["usage"])
    assert budget_totals(admin) == {"spent": first, "reserved": 0, "held": 0}

    # A stream that did not ask for usage: usage is asked upstream anyway (to cost it),
    # and the client still gets none.
    with httpx.stream(
        "POST",
        origin.url + CHAT,
        json=body(stream=True),
        headers={"authorization": f"Bearer {api_key}"},
        timeout=30,
    ) as streamed:
        text = streamed.read().decode()
    assert streamed.status_code == 200 and text.endswith("data: [DONE]\n\n")
    assert '"usage":{' not in text.replace(" ", "")
    origin.wait_stored()
    entries = [decode_envelope(admin.get(k)) for k in admin.keys("prism:v1:*")]
    stored = [e.usage for e in entries if e is not None and e.usage is not None]
    assert len(stored) == 2  # both entries carry usage, the stream's too
    assert budget_totals(admin) == {"spent": sum(map(cost_of, stored)), "reserved": 0, "held": 0}


def test_a_provider_error_or_a_client_leaving_releases_the_reservation(
    origin: RunningOrigin, api_key: str, admin: redis.Redis, provider: ProviderServer
) -> None:
    set_budget(admin, 5)
    provider.control.set_fault("status", status=400)
    failed = post(origin, api_key, body())
    assert failed.status_code == 400
    origin.wait_stored()
    assert budget_totals(admin) == {"spent": 0, "reserved": 0, "held": 0}

    provider.control.set_fault("truncated_stream", after_chunks=2)
    with httpx.stream(
        "POST",
        origin.url + CHAT,
        json=body(stream=True),
        headers={"authorization": f"Bearer {api_key}"},
        timeout=30,
    ) as cut:
        assert "error" in cut.read().decode()
    origin.wait_stored()
    assert budget_totals(admin) == {"spent": 0, "reserved": 0, "held": 0}

    provider.control.set_fault("latency", ms=5000)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            origin.url + CHAT,
            json=body(),
            headers={"authorization": f"Bearer {api_key}"},
            timeout=httpx.Timeout(30, read=0.5),
        )
    assert wait_for(lambda: budget_totals(admin) == {"spent": 0, "reserved": 0, "held": 0}, 10)


def test_a_request_that_does_not_fit_is_refused_before_any_call_and_audited(
    origin: RunningOrigin, api_key: str, admin: redis.Redis, provider: ProviderServer
) -> None:
    set_budget(admin, 0.0001)  # 100 micro-USD: less than 1000 completion tokens cost
    refused = post(origin, api_key, body())
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "budget_exceeded" and error["type"] == "rate_limit_error"
    assert error["message"].startswith(
        "This project's daily budget of $0.0001 does not cover this request: $0.0001 remains"
    )
    assert provider.control.stats()["chat_requests"] == 0
    assert budget_totals(admin) == {"spent": 0, "reserved": 0, "held": 0}
    small = post(origin, api_key, body(max_tokens=10))  # fits: admitted
    assert small.status_code == 200

    def refusal() -> dict[bytes, bytes] | None:
        for fields in stream_fields(bytes, admin.xrange("prism:audit")):
            if fields[b"action"] == b"budget.refuse":
                return fields
        return None

    record = wait_for(refusal)
    assert record[b"project"] == b"acme" and record[b"actor"].startswith(b"key:")
    detail = json.loads(record[b"detail"])
    assert detail["code"] == "budget_exceeded" and "remains" in detail["message"]


def test_an_unpriced_model_is_refused_under_a_budget_and_counted_without_one(
    origin: RunningOrigin, api_key: str, admin: redis.Redis
) -> None:
    set_budget(admin, 5)
    refused = post(origin, api_key, body(model="mystery-model"))
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "model_not_priced"
    unrouted = post(origin, api_key, body(model="no-such-model"))  # the router's own answer
    assert unrouted.status_code == 404 and unrouted.json()["error"]["code"] == "model_not_found"
    admin.delete(policy_key("acme"))
    assert post(origin, api_key, body(model="mystery-model")).status_code == 200
    origin.wait_stored()
    assert (
        origin.metric("prism_usage_unpriced_calls_total", project="acme", model="mystery-model")
        == 1
    )


def _commands(admin: redis.Redis) -> dict[str, int]:
    return {n: int(v["calls"]) for n, v in admin.info("commandstats").items()}


def test_a_hit_costs_nothing_and_records_what_it_saved(
    origin_factory: OriginFactory, providers_file: Path, api_key: str, admin: redis.Redis
) -> None:
    # The request log's batches are EVALSHA calls too: off, the count below is the lookups'.
    origin = origin_factory(PRISM_PROVIDERS_FILE=str(providers_file), PRISM_REQUEST_LOG="off")
    set_budget(admin, 5)
    payload = body()
    miss = post(origin, api_key, payload)
    origin.wait_stored()
    cost = cost_of(miss.json()["usage"])
    before = _commands(admin)
    for _ in range(3):
        hit = post(origin, api_key, payload)
        assert hit.headers["x-prism-edge-cache-layer"] == "redis"
    after = _commands(admin)
    assert after["cmdstat_evalsha"] - before["cmdstat_evalsha"] == 3  # the lookups only
    assert budget_totals(admin)["spent"] == cost  # unchanged by the hits
    labels = {"project": "acme", "model": MODEL}
    assert origin.metric("prism_usage_saved_usd_total", **labels) == pytest.approx(3 * cost / 1e6)
    assert origin.metric("prism_usage_cost_usd_total", **labels) == pytest.approx(cost / 1e6)
    day = datetime.now(UTC).strftime("%Y-%m-%d")

    def flushed() -> dict[str, int] | None:
        raw = admin.hgetall(f"prism:usage:acme:{day}")
        found = {reply_as(bytes, k).decode().split("|")[0]: int(v) for k, v in raw.items()}
        return found if found.get("requests.redis") == 3 else None

    usage = wait_for(flushed, 10)
    assert usage["saved_micros"] == 3 * cost and usage["cost_micros"] == cost
    assert usage["requests.miss"] == 1
    assert usage["tokens_in"] == miss.json()["usage"]["prompt_tokens"]
    assert 0 < admin.ttl(f"prism:usage:acme:{day}") <= 400 * 86_400


def test_without_a_budget_a_miss_makes_no_budget_command(
    origin: RunningOrigin, api_key: str, admin: redis.Redis
) -> None:
    assert post(origin, api_key, body()).status_code == 200  # scripts loaded, warm
    origin.wait_stored()
    before = _commands(admin)
    assert post(origin, api_key, body()).status_code == 200
    origin.wait_stored()
    after = _commands(admin)
    # The lookup (which takes the shared flight's lease too), and the stream's one write that
    # ends the flight and lets the lease linger (routing/flight_lease.py).
    assert after["cmdstat_evalsha"] - before["cmdstat_evalsha"] == 2
    assert not admin.keys("prism:budget:*")
    set_budget(admin, 5)
    before = _commands(admin)
    assert post(origin, api_key, body()).status_code == 200
    origin.wait_stored()
    after = _commands(admin)
    assert after["cmdstat_evalsha"] - before["cmdstat_evalsha"] == 2 + 2  # + reserve, settle


def test_identical_concurrent_misses_make_one_call_paid_once(
    origin: RunningOrigin, api_key: str, admin: redis.Redis, provider: ProviderServer
) -> None:
    set_budget(admin, 5)
    provider.control.set_fault("stall_before_first_byte", seconds=60)  # until all have joined
    payload = body()

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=origin.url, headers={"authorization": f"Bearer {api_key}"}, timeout=90
        ) as http:
            sent = [asyncio.ensure_future(http.post(CHAT, json=payload)) for _ in range(5)]
            await async_wait_for(lambda: decided(provider, sent, joined(origin)) == 5, within=60)
            provider.control.release()
            return await asyncio.gather(*sent)

    answers = asyncio.run(run())
    assert [r.status_code for r in answers] == [200] * 5
    assert provider.control.stats()["chat_requests"] == 1
    origin.wait_stored()
    cost = cost_of(answers[0].json()["usage"])
    assert wait_for(lambda: budget_totals(admin) == {"spent": cost, "reserved": 0, "held": 0})


def test_a_crashed_process_reservation_is_freed_after_its_hold(
    redis_url: str, admin: redis.Redis, providers_file: Path
) -> None:
    config = load_provider_config(providers_file, {})
    budget = Budget(0.001, "day")  # room for one request's bound, not two
    chat = parse_chat_request(json.dumps(body(max_tokens=1000)))
    bounds = (prompt_token_bound(chat), completion_token_bound(chat))

    async def run() -> None:
        crashed = Budgets(RedisPipe(redis_url), config, hold_seconds=30)
        before_ms = redis_now_us(admin) // 1000
        held = await crashed.reserve("acme", budget, MODEL, *bounds)  # never settled: it "crashed"
        after_ms = redis_now_us(admin) // 1000
        assert held is not None
        assert held.amount <= budget.micro_usd < 2 * held.amount
        # Held for its hold_seconds, by Redis's clock.
        deadline = admin.zscore(held.held, held.member)
        assert deadline is not None and before_ms + 30_000 <= deadline <= after_ms + 30_000
        other = Budgets(RedisPipe(redis_url), config, hold_seconds=60)
        with pytest.raises(Exception, match="does not cover this request"):
            await other.reserve("acme", budget, MODEL, *bounds)
        # The hold runs out (its deadline now just past, rather than waited for): the next
        # reservation frees it and is admitted.
        admin.zadd(held.held, {held.member: redis_now_us(admin) // 1000 - 1}, xx=True)
        assert await other.reserve("acme", budget, MODEL, *bounds)
        # A late settle of the freed reservation still counts what was spent, once.
        assert await crashed.settle(held, 7)

    asyncio.run(run())
    state = budget_totals(admin)
    assert state["spent"] == 7 and state["held"] == 1 and state["reserved"] > 0


def test_a_budget_that_cannot_be_checked_refuses_rather_than_admits(
    origin_factory: OriginFactory, providers_file: Path, api_key: str, tmp_path: Path
) -> None:
    with RedisServer(workdir=tmp_path) as own:
        origin = origin_factory(PRISM_PROVIDERS_FILE=str(providers_file), REDIS_URL=own.url)
        admin = redis.Redis.from_url(own.url)
        set_budget(admin, 5)
        assert post(origin, api_key, body()).status_code == 200  # the policy is now known
        origin.wait_stored()
        admin.close()
    # Redis is gone: the last policy seen still holds, and its budget cannot be checked.
    refused = post(origin, api_key, body())
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "budget_unavailable"
    assert refused.headers["retry-after"] == "1"
