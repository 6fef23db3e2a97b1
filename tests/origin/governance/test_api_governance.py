"""``/v1/embeddings`` and ``/v1/messages`` are governed as chat is, through the real origin,
real Redis and the provider stand-in: a budget refuses what does not fit (429
``budget_exceeded``, in Anthropic's format for messages), settles to the answer's real
cost and is released when the call fails; the token rate limit admits on the request's
bound with the x-ratelimit-* headers and refuses with a 429; usage counts each API's
requests by layer, tokens, cost and what its hits saved."""

from __future__ import annotations

import json
import math
import secrets
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from typer.testing import CliRunner

from deploy.cli import app
from deploy.local.provider import ProviderServer
from deploy.policy_store import PolicyStore
from origin.governance.audit import AUDIT_STREAM
from origin.providers.pricing import Price, cost_micros, default_prices
from origin.providers.token_counts import tokens_of
from prism import Budget, Policy, RateLimits, policy_key
from tests.fixtures.origin import OriginFactory, RunningOrigin, budget_totals
from tests.fixtures.provider import claude_and_local
from tests.polling import wait_for
from tests.redis_replies import reply_as, stream_fields

EMBEDDINGS = "/v1/embeddings"
MESSAGES = "/v1/messages"
EMBED_MODEL = "embed-test"  # priced by the providers file: 100 USD per million tokens
EMBED_PRICE = Price(input=100.0, output=0.0, cached_input=100.0, cache_write=100.0)
CLAUDE = "claude-sonnet-4-5"  # to the Anthropic stand-in, passed through
TRANSLATED = "gpt-4o-mini"  # to the OpenAI-compatible stand-in, translated


@pytest.fixture
def origin(
    origin_factory: OriginFactory, provider: ProviderServer, tmp_path: Path
) -> RunningOrigin:
    prices = f'[providers.local.prices]\n"{EMBED_MODEL}" = {{ input = 100, output = 0 }}\n'
    config = claude_and_local(provider, tmp_path, prices)
    return origin_factory(PRISM_PROVIDERS_FILE=str(config))


def set_budget(admin: redis.Redis, usd: float) -> None:
    admin.set(policy_key("acme"), Policy(budget=Budget(usd, "day")).encode())


SETTLED_NOTHING = {"spent": 0, "reserved": 0, "held": 0}


def embed(
    origin: RunningOrigin, key: str, text: str | list[str], timeout: Any = 30
) -> httpx.Response:
    return httpx.post(
        origin.url + EMBEDDINGS,
        json={"model": EMBED_MODEL, "input": text},
        headers={"authorization": f"Bearer {key}"},
        timeout=timeout,
    )


def message(
    origin: RunningOrigin,
    key: str,
    model: str,
    max_tokens: int = 200,
    timeout: Any = 30,
    **extra: Any,
) -> httpx.Response:
    payload = {
        "model": model,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": f"tell me about prisms {secrets.token_hex(4)}"}],
        **extra,
    }
    return httpx.post(
        origin.url + MESSAGES,
        json=payload,
        headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        timeout=timeout,
    )


def message_cost(usage: dict[str, Any], model: str) -> int:
    price, tokens = default_prices().price("any", model), tokens_of(usage)
    assert price is not None and tokens is not None
    return cost_micros(price, tokens)


# -- budgets --------------------------------------------------------------------------


def test_an_embeddings_budget_refuses_what_does_not_fit_and_settles_to_the_real_cost(
    origin: RunningOrigin, api_key: str, admin: redis.Redis, provider: ProviderServer
) -> None:
    set_budget(admin, 0.01)  # 10,000 micro-USD: 100 input tokens' bound at 100 USD/M
    refused = embed(origin, api_key, "word " * 40)  # 200 bytes: a bound of 20,000 micro-USD
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "budget_exceeded")
    assert "does not cover this request" in error["message"]
    assert int(refused.headers["retry-after"]) >= 1
    assert provider.control.stats()["paths"].get(EMBEDDINGS, 0) == 0  # refused before a call

    def audited() -> dict[str, Any] | None:
        for fields in stream_fields(bytes, admin.xrange(AUDIT_STREAM)):
            if fields[b"action"] == b"budget.refuse":
                detail: dict[str, Any] = json.loads(fields[b"detail"])
                return detail
        return None

    detail = wait_for(audited)
    assert (detail["path"], detail["code"]) == (EMBEDDINGS, "budget_exceeded")

    admitted = embed(origin, api_key, ["a prism", "splits light"])
    assert admitted.status_code == 200, admitted.text
    used = admitted.json()["usage"]["prompt_tokens"]
    origin.wait_stored()
    tokens = tokens_of(admitted.json()["usage"])
    assert tokens is not None
    spent = cost_micros(EMBED_PRICE, tokens)
    assert spent == used * 100 > 0
    assert wait_for(lambda: budget_totals(admin) == {"spent": spent, "reserved": 0, "held": 0})


@pytest.mark.parametrize("model", [CLAUDE, TRANSLATED])
def test_a_messages_budget_settles_to_the_real_cost_and_refuses_in_anthropic_format(
    origin: RunningOrigin, api_key: str, admin: redis.Redis, provider: ProviderServer, model: str
) -> None:
    set_budget(admin, 5)
    answered = message(origin, api_key, model)
    assert answered.status_code == 200, answered.text
    origin.wait_stored()
    cost = message_cost(answered.json()["usage"], model)
    assert cost > 0
    assert wait_for(lambda: budget_totals(admin) == {"spent": cost, "reserved": 0, "held": 0})

    set_budget(admin, cost / 1_000_000 + 0.0001)  # what is spent, and 100 micro-USD more
    calls = sum(provider.control.stats()["paths"].values())
    refused = message(origin, api_key, model, max_tokens=100_000)
    assert refused.status_code == 429
    assert refused.json()["type"] == "error"
    error = refused.json()["error"]
    assert error["type"] == "rate_limit_error" and "budget" in error["message"]
    assert int(refused.headers["retry-after"]) >= 1
    assert sum(provider.control.stats()["paths"].values()) == calls  # no provider call
    assert budget_totals(admin) == {"spent": cost, "reserved": 0, "held": 0}


def test_a_failed_call_releases_the_reservation_for_both_apis(
    origin: RunningOrigin, api_key: str, admin: redis.Redis, provider: ProviderServer
) -> None:
    set_budget(admin, 5)
    # Held while the call runs, released when the client leaves it (the call is cancelled).
    for send in (lambda t: embed(origin, api_key, "a prism", t), lambda t: message(
        origin, api_key, CLAUDE, timeout=t)):  # fmt: skip
        provider.control.set_fault("latency", ms=3000)
        leaving = threading.Thread(target=_times_out, args=(send,))
        leaving.start()
        assert wait_for(lambda: (t := budget_totals(admin))["reserved"] > 0 and t["held"] == 1)
        leaving.join()
        assert wait_for(lambda: budget_totals(admin) == SETTLED_NOTHING, 10)
        provider.control.clear()

    provider.control.set_fault("status", status=400)
    assert embed(origin, api_key, "a prism").status_code == 400
    origin.wait_stored()
    assert budget_totals(admin) == SETTLED_NOTHING
    for model in (CLAUDE, TRANSLATED):
        provider.control.set_fault("status", status=400)
        failed = message(origin, api_key, model)
        assert failed.status_code == 400
        assert failed.json()["type"] == "error"  # Anthropic's format
        origin.wait_stored()
        assert budget_totals(admin) == SETTLED_NOTHING

    provider.control.set_fault("truncated_stream", after_chunks=2)
    cut = message(origin, api_key, CLAUDE, stream=True)
    assert "event: error" in cut.text
    origin.wait_stored()
    assert wait_for(lambda: budget_totals(admin) == SETTLED_NOTHING)


def _times_out(send: Any) -> None:
    with pytest.raises(httpx.ReadTimeout):
        send(httpx.Timeout(30, read=1.0))


# -- token rate limits ----------------------------------------------------------------


@pytest.fixture
def store(redis_url: str) -> Iterator[PolicyStore]:
    policies = PolicyStore.from_url(redis_url)
    yield policies
    policies.close()


def tpm(store: PolicyStore, limit: int) -> None:
    store.set("acme", rate_limits=RateLimits.from_dict({"project": {"tpm": limit}}), updated_by="t")


def test_embeddings_tokens_are_admitted_on_the_input_bound_and_settled_to_the_usage(
    origin: RunningOrigin, api_key: str, store: PolicyStore
) -> None:
    tpm(store, 1000)
    started = time.monotonic()
    first = embed(origin, api_key, "x" * 300)  # a bound of 300 tokens (one per byte)
    assert first.status_code == 200, first.text
    assert first.headers["x-ratelimit-limit-tokens"] == "1000"
    assert 700 <= int(first.headers["x-ratelimit-remaining-tokens"]) <= 705
    used = first.json()["usage"]["total_tokens"]
    assert used < 300
    origin.wait_stored()  # the settle runs after the response

    second = embed(origin, api_key, "y" * 300)
    assert second.status_code == 200
    left = int(second.headers["x-ratelimit-remaining-tokens"])
    # Settled: the first request now holds its usage, not its bound of 300 (the bucket
    # refills a token every 60 ms meanwhile).
    refilled = math.ceil((time.monotonic() - started) / 0.06)
    assert 1000 - used - 300 <= left <= 1000 - used - 300 + refilled

    refused = embed(origin, api_key, "z" * 1200)  # more than the limit itself
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("tokens", "rate_limit_exceeded")
    assert refused.headers["x-ratelimit-limit-tokens"] == "1000"
    assert "x-ratelimit-reset-tokens" in refused.headers and "retry-after" in refused.headers


@pytest.mark.parametrize("model", [CLAUDE, TRANSLATED])
def test_messages_tokens_are_limited_with_max_tokens_and_refused_in_anthropic_format(
    origin: RunningOrigin, api_key: str, store: PolicyStore, model: str
) -> None:
    tpm(store, 2000)
    started = time.monotonic()
    first = message(origin, api_key, model, max_tokens=500)
    assert first.status_code == 200, first.text
    admitted_left = int(first.headers["x-ratelimit-remaining-tokens"])
    assert 1400 < admitted_left < 1500  # 500 for max_tokens, the rest the prompt's bound
    usage = first.json()["usage"]
    used = usage["input_tokens"] + usage["output_tokens"]
    origin.wait_stored()

    second = message(origin, api_key, model, max_tokens=500)
    assert second.status_code == 200
    # Settled to the Anthropic usage (input + output), not to the bound (the bucket
    # refills a token every 30 ms meanwhile).
    refilled = math.ceil((time.monotonic() - started) / 0.03)
    after = int(second.headers["x-ratelimit-remaining-tokens"])
    bound = 2000 - admitted_left
    assert 2000 - used - bound - 5 <= after <= 2000 - used - bound + refilled

    refused = message(origin, api_key, model, max_tokens=5000)
    assert refused.status_code == 429
    assert refused.json()["type"] == "error"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert "tokens per min" in refused.json()["error"]["message"]
    assert refused.headers["x-ratelimit-limit-tokens"] == "2000"
    assert "retry-after" in refused.headers


# -- usage ------------------------------------------------------------------------------


def usage_rows(admin: redis.Redis, model: str) -> dict[str, int]:
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    raw = admin.hgetall(f"prism:usage:acme:{day}")
    rows: dict[str, int] = {}
    for field, value in raw.items():
        counter, _, row_model = reply_as(bytes, field).decode().split("|")
        if row_model == model:
            rows[counter] = int(value)
    return rows


def test_usage_counts_each_apis_requests_tokens_cost_and_hit_savings(
    origin: RunningOrigin, api_key: str, admin: redis.Redis, redis_url: str
) -> None:
    batch = ["a prism", f"splits light {secrets.token_hex(4)}"]
    miss = embed(origin, api_key, batch)
    assert miss.headers["x-prism-edge-cache-layer"] == "miss"
    origin.wait_stored()
    for _ in range(2):
        assert embed(origin, api_key, batch).headers["x-prism-edge-cache-layer"] == "redis"
    tokens = miss.json()["usage"]["prompt_tokens"]
    cost = tokens * 100

    payload = {
        "model": CLAUDE,
        "max_tokens": 200,
        "messages": [{"role": "user", "content": f"prisms {secrets.token_hex(4)}"}],
    }
    headers = {"x-api-key": api_key, "anthropic-version": "2023-06-01"}
    answered = httpx.post(origin.url + MESSAGES, json=payload, headers=headers, timeout=30)
    assert answered.headers["x-prism-edge-cache-layer"] == "miss"
    origin.wait_stored()
    hit = httpx.post(origin.url + MESSAGES, json=payload, headers=headers, timeout=30)
    assert hit.headers["x-prism-edge-cache-layer"] == "redis"
    usage = answered.json()["usage"]
    message_spent = message_cost(usage, CLAUDE)

    embed_rows = wait_for(
        lambda: (r := usage_rows(admin, EMBED_MODEL)).get("requests.redis") == 2 and r, 10
    )
    assert embed_rows == {
        "requests.miss": 1,
        "requests.redis": 2,
        "tokens_in": tokens,
        "cost_micros": cost,
        "saved_micros": 2 * cost,
    }
    message_rows = wait_for(
        lambda: (r := usage_rows(admin, CLAUDE)).get("requests.redis") == 1 and r, 10
    )
    assert message_rows == {
        "requests.miss": 1,
        "requests.redis": 1,
        "tokens_in": usage["input_tokens"],
        "tokens_out": usage["output_tokens"],
        "cost_micros": message_spent,
        "saved_micros": message_spent,
    }
    # /metrics: the same totals by project and model.
    labels = {"project": "acme", "model": EMBED_MODEL}
    assert origin.metric("prism_usage_saved_usd_total", **labels) == pytest.approx(2 * cost / 1e6)
    assert origin.metric("prism_usage_cost_usd_total", **labels) == pytest.approx(cost / 1e6)
    claude = {"project": "acme", "model": CLAUDE}
    assert (
        origin.metric("prism_usage_tokens_total", direction="out", **claude)
        == (usage["output_tokens"])
    )
    assert origin.metric("prism_usage_saved_usd_total", **claude) == pytest.approx(
        message_spent / 1e6
    )
    # `prism usage` shows both APIs' rows.
    shown = CliRunner().invoke(
        app, ["usage", "--project", "acme", "--json", "--redis-url", redis_url]
    )
    assert shown.exit_code == 0, shown.output
    rows = {row["model"]: row for row in json.loads(shown.stdout)["rows"]}
    assert rows[EMBED_MODEL]["requests"]["redis"] == 2
    assert rows[EMBED_MODEL]["saved_usd"] == pytest.approx(2 * cost / 1e6)
    assert rows[CLAUDE]["tokens_out"] == usage["output_tokens"]
    assert rows[CLAUDE]["requests"] == {
        "redis": 1,
        "semantic": 0,
        "miss": 1,
        "bypass": 0,
        "coalesced": 0,
        "kv": 0,
    }
