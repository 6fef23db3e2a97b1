"""``/v1/responses`` is governed as chat is, through the real origin, real Redis and the
provider stand-ins: the model policy refuses with a 403, a budget settles to the
response's real cost and refuses what does not fit (429 ``budget_exceeded``), the token
limit admits on the prompt's bound plus ``max_output_tokens`` and settles to the usage,
and usage counts requests by layer, tokens, cost and what hits saved. Errors are OpenAI's."""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from deploy.local.provider import ProviderServer
from deploy.policy_store import PolicyStore
from origin.providers.pricing import cost_micros, default_prices
from origin.providers.token_counts import tokens_of
from prism import Budget, Policy, RateLimits, policy_key
from tests.fixtures.origin import OriginFactory, RunningOrigin, budget_totals
from tests.fixtures.provider import claude_and_local
from tests.polling import wait_for
from tests.redis_replies import reply_as

PATH = "/v1/responses"
CLAUDE = "claude-sonnet-4-5"  # through the Anthropic adapter to its stand-in
TRANSLATED = "gpt-4o-mini"  # to the OpenAI-compatible stand-in
MODELS = [CLAUDE, TRANSLATED]


@pytest.fixture
def origin(
    origin_factory: OriginFactory, provider: ProviderServer, tmp_path: Path
) -> RunningOrigin:
    return origin_factory(PRISM_PROVIDERS_FILE=str(claude_and_local(provider, tmp_path)))


@pytest.fixture
def store(redis_url: str) -> Iterator[PolicyStore]:
    policies = PolicyStore.from_url(redis_url)
    yield policies
    policies.close()


def respond(
    origin: RunningOrigin, key: str, model: str, max_output_tokens: int = 200, text: str = ""
) -> httpx.Response:
    payload = {
        "model": model,
        "max_output_tokens": max_output_tokens,
        "input": text or f"tell me about prisms {secrets.token_hex(4)}",
    }
    headers = {"authorization": f"Bearer {key}"}
    return httpx.post(origin.url + PATH, json=payload, headers=headers, timeout=30)


def cost_of(usage: dict[str, Any], model: str) -> int:
    price, tokens = default_prices().price("any", model), tokens_of(usage)
    assert price is not None and tokens is not None
    assert (tokens.prompt, tokens.completion) == (usage["input_tokens"], usage["output_tokens"])
    return cost_micros(price, tokens)


def test_a_denied_model_is_a_403_in_openai_format(
    origin: RunningOrigin, api_key: str, admin: redis.Redis, provider: ProviderServer
) -> None:
    admin.set(policy_key("acme"), Policy.parse('{"deny": ["gpt-4o*"]}').encode())
    refused = respond(origin, api_key, TRANSLATED)
    assert refused.status_code == 403
    assert refused.json()["error"]["type"] == "permission_error"
    assert refused.json()["error"]["code"] == "model_not_allowed"
    assert respond(origin, api_key, CLAUDE).status_code == 200
    assert provider.control.stats()["paths"] == {"/v1/messages": 1}


@pytest.mark.parametrize("model", MODELS)
def test_a_budget_settles_to_the_real_cost_and_refuses_what_does_not_fit(
    origin: RunningOrigin, api_key: str, admin: redis.Redis, provider: ProviderServer, model: str
) -> None:
    admin.set(policy_key("acme"), Policy(budget=Budget(5, "day")).encode())
    answered = respond(origin, api_key, model)
    assert answered.status_code == 200, answered.text
    origin.wait_stored()
    cost = cost_of(answered.json()["usage"], model)
    assert cost > 0
    assert wait_for(lambda: budget_totals(admin) == {"spent": cost, "reserved": 0, "held": 0})

    # what is spent, and 100 micro-USD more: not enough for 100,000 output tokens
    admin.set(policy_key("acme"), Policy(budget=Budget(cost / 1e6 + 0.0001, "day")).encode())
    calls = sum(provider.control.stats()["paths"].values())
    refused = respond(origin, api_key, model, max_output_tokens=100_000)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "budget_exceeded")
    assert int(refused.headers["retry-after"]) >= 1
    assert sum(provider.control.stats()["paths"].values()) == calls  # no provider call
    assert budget_totals(admin) == {"spent": cost, "reserved": 0, "held": 0}


def test_tokens_are_limited_with_max_output_tokens_and_settled_to_the_usage(
    origin: RunningOrigin, api_key: str, store: PolicyStore
) -> None:
    limits = RateLimits.from_dict({"project": {"tpm": 2000}})
    store.set("acme", rate_limits=limits, updated_by="t")
    started = time.monotonic()
    first = respond(origin, api_key, TRANSLATED, max_output_tokens=500)
    assert first.status_code == 200, first.text
    admitted_left = int(first.headers["x-ratelimit-remaining-tokens"])
    assert 1400 < admitted_left < 1500  # 500 for max_output_tokens, the rest the prompt's bound
    used = first.json()["usage"]["total_tokens"]
    origin.wait_stored()

    second = respond(origin, api_key, TRANSLATED, max_output_tokens=500)
    assert second.status_code == 200
    # Settled to the usage, not to the bound (the bucket refills a token every 30 ms).
    refilled = math.ceil((time.monotonic() - started) / 0.03)
    after = int(second.headers["x-ratelimit-remaining-tokens"])
    bound = 2000 - admitted_left
    assert 2000 - used - bound - 5 <= after <= 2000 - used - bound + refilled

    refused = respond(origin, api_key, TRANSLATED, max_output_tokens=5000)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("tokens", "rate_limit_exceeded")
    assert refused.headers["x-ratelimit-limit-tokens"] == "2000"
    assert "retry-after" in refused.headers


def usage_rows(admin: redis.Redis, model: str) -> dict[str, int]:
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    rows: dict[str, int] = {}
    for field, value in admin.hgetall(f"prism:usage:acme:{day}").items():
        counter, _, row_model = reply_as(bytes, field).decode().split("|")
        if row_model == model:
            rows[counter] = int(value)
    return rows


def test_usage_counts_requests_tokens_cost_and_hit_savings(
    origin: RunningOrigin, api_key: str, admin: redis.Redis
) -> None:
    text = f"prisms {secrets.token_hex(4)}"
    miss = respond(origin, api_key, CLAUDE, text=text)
    assert miss.headers["x-prism-edge-cache-layer"] == "miss"
    origin.wait_stored()
    hit = respond(origin, api_key, CLAUDE, text=text)
    assert hit.headers["x-prism-edge-cache-layer"] == "redis"
    usage = miss.json()["usage"]
    cost = cost_of(usage, CLAUDE)
    rows = wait_for(lambda: (r := usage_rows(admin, CLAUDE)).get("requests.redis") == 1 and r, 10)
    assert rows == {
        "requests.miss": 1,
        "requests.redis": 1,
        "tokens_in": usage["input_tokens"],
        "tokens_out": usage["output_tokens"],
        "cost_micros": cost,
        "saved_micros": cost,
    }
