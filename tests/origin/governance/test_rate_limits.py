"""Rate limits over real HTTP with a real Redis: one limit held exactly by two origins,
OpenAI's 429 and headers, Retry-After, key and project limits, token limits settled to
the answer's usage, refusals in /metrics and (batched) in the audit log."""

from __future__ import annotations

import asyncio
import functools
import json
import math
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis
from typer.testing import CliRunner

from deploy.cli import app
from deploy.local.ports import free_port
from deploy.local.provider import ProviderServer
from deploy.local.redis import RedisServer
from deploy.policy_store import PolicyStore
from origin.connection.redis_pipe import RedisPipe
from origin.governance.audit import AUDIT_STREAM, AuditWriter
from origin.governance.rate_limit_headers import duration
from origin.governance.rate_limiter import RefusalLog
from origin.providers.pricing import cost_micros, default_prices
from origin.providers.token_counts import tokens_of
from prism import Budget, KeyRing, Limit, RateLimits
from tests.fixtures.origin import (
    AccessLines,
    Origin,
    OriginFactory,
    RunningOrigin,
    budget_totals,
    origin_env,
    redis_now_us,
)
from tests.fixtures.stacks import CLI_START
from tests.polling import async_wait_for, wait_for
from tests.redis_replies import stream_fields

CHAT = "/v1/chat/completions"
PRICED = "gpt-4o-mini"  # a model with a price, for budgets


@pytest.fixture
def store(redis_url: str) -> Iterator[PolicyStore]:
    policies = PolicyStore.from_url(redis_url)
    yield policies
    policies.close()


def limit(store: PolicyStore, **parts: object) -> None:
    """Set acme's rate limits as `prism policy set` does (record and hash)."""
    store.set("acme", rate_limits=RateLimits.from_dict(parts), updated_by="test")


def body(**extra: object) -> dict[str, object]:
    return {
        "model": "demo",
        "messages": [{"role": "user", "content": secrets.token_hex(6)}],
    } | extra


def post(
    origin: Origin, key: str, payload: dict[str, object], http: httpx.Client | None = None
) -> httpx.Response:
    send = http.post if http is not None else httpx.post
    return send(
        origin.url + CHAT, json=payload, headers={"authorization": f"Bearer {key}"}, timeout=30
    )


def primed(origin: Origin, key: str) -> dict[str, object]:
    """A body whose answer is in Redis (stored before any limit is set)."""
    payload = body()
    assert post(origin, key, payload).status_code == 200
    origin.wait_stored()
    assert post(origin, key, payload).headers["x-prism-edge-cache-layer"] == "redis"
    return payload


def test_two_origins_hold_one_limit_exactly(
    origin_factory: OriginFactory, api_key: str, store: PolicyStore, redis_url: str
) -> None:
    first, second = origin_factory(), origin_factory()
    payload = primed(first, api_key)
    limit(store, project={"rpm": 30})

    clients = [httpx.Client(timeout=30) for _ in range(2)]
    started = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        replies = list(
            pool.map(
                lambda i: post((first, second)[i % 2], api_key, payload, clients[i % 2]),
                range(100),
            )
        )
    elapsed = time.monotonic() - started
    for http in clients:
        http.close()

    admitted = [r for r in replies if r.status_code == 200]
    refused = [r for r in replies if r.status_code == 429]
    assert len(admitted) + len(refused) == 100
    # GCRA: a full bucket of 30, then one more every 2 s (60 s / 30) of Redis's clock.
    assert 30 <= len(admitted) <= 30 + int(elapsed / 2)
    if elapsed < 2:
        assert len(admitted) == 30
    assert {r.headers["x-prism-edge-cache-layer"] for r in admitted} == {"redis"}
    assert {r.request.url.port for r in admitted} == {
        httpx.URL(first.url).port,
        httpx.URL(second.url).port,
    }  # both origins admitted some: the limit is shared, not per process
    assert sorted(int(r.headers["x-ratelimit-remaining-requests"]) for r in admitted)[:1] == [0]
    error = refused[0].json()["error"]
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "requests"
    assert error["message"].startswith(
        "Rate limit reached for project acme on requests per min (RPM): Limit 30, Requested 1."
    )
    for response in refused:
        assert response.headers["x-ratelimit-limit-requests"] == "30"
        assert response.headers["x-ratelimit-remaining-requests"] == "0"
        assert 1 <= int(response.headers["retry-after"]) <= 2
        assert 0 < int(response.headers["retry-after-ms"]) <= 2000
    # Refused requests took nothing: the state is what 30 (or so) admissions left.
    state = redis.Redis.from_url(redis_url).hget("prism:limits:acme", "s.rpm")
    assert state is not None
    assert first.metric(
        "prism_rate_limited_total", project="acme", kind="requests", scope="project"
    ) + second.metric(
        "prism_rate_limited_total", project="acme", kind="requests", scope="project"
    ) == len(refused)


@pytest.mark.timeout(300)  # two `prism` processes' start-up (CLI_START), on a slow machine
def test_two_origin_processes_hold_one_limit_exactly(
    redis_url: str, provider: ProviderServer, api_key: str, store: PolicyStore
) -> None:
    """The same over `prism origin serve` processes, each with its own Redis connection."""
    ports = [free_port() for _ in range(2)]
    env = origin_env(redis_url, provider.url, PATH="/usr/bin:/bin")
    serve = [sys.executable, "-m", "deploy.cli", "origin", "serve", "--admin-port", "0"]
    serve += ["--workers", "1"]
    servers = [
        subprocess.Popen(
            [*serve, "--port", str(port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for port in ports
    ]
    urls = [f"http://127.0.0.1:{port}" for port in ports]

    def up(url: str) -> bool:
        try:
            return httpx.get(url + "/healthz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        for url in urls:
            wait_for(functools.partial(up, url), timeout=CLI_START, interval=0.05)
        limit(store, project={"rpm": 30})
        payload = body()
        headers = {"authorization": f"Bearer {api_key}"}
        clients = [httpx.Client(timeout=30) for _ in urls]
        started = time.monotonic()
        with ThreadPoolExecutor(16) as pool:
            statuses = list(
                pool.map(
                    lambda i: (
                        (
                            clients[i % 2].post(urls[i % 2] + CHAT, json=payload, headers=headers)
                        ).status_code
                    ),
                    range(100),
                )
            )
        for client in clients:
            client.close()
        elapsed = time.monotonic() - started
    finally:
        for server in servers:
            server.kill()  # nothing to drain: every answer has been read
        for server in servers:
            server.wait(10)
    assert set(statuses) == {200, 429}
    assert 30 <= statuses.count(200) <= 30 + int(elapsed / 2)
    if elapsed < 2:
        assert statuses.count(200) == 30


def test_success_headers_count_down_and_reset_says_when_the_bucket_is_full(
    origin: RunningOrigin, api_key: str, store: PolicyStore
) -> None:
    payload = primed(origin, api_key)
    limit(store, key={"rpm": 6})  # one request every 10 s refills
    seen = []
    for _ in range(3):
        response = post(origin, api_key, payload)
        assert response.status_code == 200
        seen.append(
            (
                response.headers["x-ratelimit-limit-requests"],
                response.headers["x-ratelimit-remaining-requests"],
                response.headers["x-ratelimit-reset-requests"],
            )
        )
        assert "x-ratelimit-limit-tokens" not in response.headers  # no token limit set
    assert [(lim, left) for lim, left, _ in seen] == [("6", "5"), ("6", "4"), ("6", "3")]
    resets = [reset for _, _, reset in seen]
    assert resets[0].endswith("s") and 9 < float(resets[0].removesuffix("s")) <= 10
    assert 19 < float(resets[2].removesuffix("s")) <= 30


def test_a_request_after_retry_after_is_admitted(
    origin: RunningOrigin, api_key: str, store: PolicyStore
) -> None:
    payload = primed(origin, api_key)
    limit(store, key={"rpm": 60})  # a full bucket of 60, then one a second
    with httpx.Client(timeout=30) as http:
        while True:
            sent_at = time.monotonic()  # no later than the refusal, on any clock skew
            refused = post(origin, api_key, payload, http)
            if refused.status_code != 200:
                break
        assert refused.status_code == 429
        wait_ms = int(refused.headers["retry-after-ms"])
        assert 0 < wait_ms <= 1000 and refused.headers["retry-after"] == "1"
        admitted_at = wait_for(
            lambda: post(origin, api_key, payload, http).status_code == 200 and time.monotonic(),
            timeout=10,
            interval=0.01,
        )
    # Not before the wait it was told; soon after it (polling every 10 ms on a busy machine).
    assert wait_ms / 1000 <= admitted_at - sent_at <= wait_ms / 1000 + 5


def test_key_and_project_limits_and_a_key_override(
    origin: RunningOrigin, key_ring: KeyRing, store: PolicyStore
) -> None:
    limit(store, project={"rpm": 5}, key={"rpm": 2}, keys={"bigkey01": {"rpm": 4}})
    a, b = key_ring.mint("acme", "keyaaaa1"), key_ring.mint("acme", "keybbbb1")
    big = key_ring.mint("acme", "bigkey01")

    def statuses(key: str, n: int) -> list[int]:
        return [post(origin, key, body()).status_code for _ in range(n)]

    assert statuses(a, 3) == [200, 200, 429]  # each key: 2
    refusal = post(origin, a, body())
    assert refusal.json()["error"]["message"].startswith("Rate limit reached for key keyaaaa1")
    assert statuses(b, 2) == [200, 200]
    # The project's 5th request is the override key's 1st; its 2nd meets the project limit.
    assert statuses(big, 2) == [200, 429]
    refusal = post(origin, big, body())
    assert refusal.json()["error"]["message"].startswith("Rate limit reached for project acme")
    assert refusal.headers["x-ratelimit-limit-requests"] == "5"
    assert origin.metric("prism_rate_limited_total", project="acme", kind="requests", scope="key")
    # Another project is not limited by acme's limits.
    assert statuses(key_ring.mint("globex"), 3) == [200, 200, 200]


def test_override_lifts_one_key_above_the_per_key_limit(
    origin: RunningOrigin, key_ring: KeyRing, store: PolicyStore
) -> None:
    limit(store, key={"rpm": 1}, keys={"bigkey01": {"rpm": 3}})
    big, small = key_ring.mint("acme", "bigkey01"), key_ring.mint("acme", "smallkey")
    assert [post(origin, big, body()).status_code for _ in range(4)] == [200, 200, 200, 429]
    assert [post(origin, small, body()).status_code for _ in range(2)] == [200, 429]


def test_tokens_are_admitted_on_the_bound_and_settled_to_the_usage(
    origin: RunningOrigin, api_key: str, store: PolicyStore
) -> None:
    limit(store, project={"tpm": 2000})
    started = time.monotonic()
    first = post(origin, api_key, body(max_tokens=500))
    assert first.status_code == 200
    assert first.headers["x-prism-edge-cache-layer"] == "miss"
    admitted_left = int(first.headers["x-ratelimit-remaining-tokens"])
    assert first.headers["x-ratelimit-limit-tokens"] == "2000"
    assert 1400 < admitted_left < 1500  # the bound: 500 completion + the prompt's bound
    used = first.json()["usage"]["total_tokens"]
    origin.wait_stored()  # the settle runs after the response, like the cache write

    second = post(origin, api_key, body(max_tokens=1))
    assert second.status_code == 200
    # Settled: the first request now costs its usage, not its bound (what refilled in
    # between comes on top: 2000 a minute is a token every 30 ms).
    refilled = math.ceil((time.monotonic() - started) / 0.03)
    after = int(second.headers["x-ratelimit-remaining-tokens"])
    bound_2 = 2000 - admitted_left - 500 + 1  # the same prompt bound, max_tokens 1
    assert 2000 - used - bound_2 <= after <= 2000 - used - bound_2 + refilled

    # A hit costs no tokens: no token headers, and the tokens left do not move.
    origin.wait_stored()
    hit = post(origin, api_key, json.loads(second.request.content))
    assert hit.headers["x-prism-edge-cache-layer"] == "redis"
    assert "x-ratelimit-remaining-tokens" not in hit.headers

    too_large = post(origin, api_key, body(max_tokens=5000))
    assert too_large.status_code == 429
    error = too_large.json()["error"]
    assert (error["type"], error["code"]) == ("tokens", "rate_limit_exceeded")
    assert error["message"].startswith("Request too large for project acme on tokens per min")
    assert too_large.headers["x-ratelimit-limit-tokens"] == "2000"
    assert (
        origin.metric("prism_rate_limited_total", project="acme", kind="tokens", scope="project")
        == 1
    )


def test_a_token_refusal_gives_the_request_slot_back_and_streams_settle(
    origin: RunningOrigin, api_key: str, store: PolicyStore
) -> None:
    limit(store, key={"rpm": 3, "tpm": 1000})
    streamed = post(origin, api_key, body(max_tokens=600, stream=True))
    assert streamed.status_code == 200 and "data: [DONE]" in streamed.text
    assert streamed.headers["x-ratelimit-remaining-requests"] == "2"
    origin.wait_stored()
    # The stream settled: the next 600 fit again although two bounds of 600+ would not.
    # (Unsettled, the bucket would hold 1000 - 650 and refill 650 only in ~40 s.)
    second = post(origin, api_key, body(max_tokens=600))
    assert second.status_code == 200, second.text
    refused = post(origin, api_key, body(max_tokens=5000))  # more than the limit itself
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "tokens"
    assert refused.headers["x-ratelimit-limit-tokens"] == "1000"
    # ...and it gave its request slot back: one request of the three is still left.
    last = post(origin, api_key, body(max_tokens=1))
    assert last.status_code == 200
    assert last.headers["x-ratelimit-remaining-requests"] == "0"


def test_refusals_reach_the_audit_log_batched(
    origin: RunningOrigin, api_key: str, store: PolicyStore, redis_url: str
) -> None:
    admin = redis.Redis.from_url(redis_url, decode_responses=True)
    limit(store, project={"rpm": 1})
    statuses = [post(origin, api_key, body()).status_code for _ in range(20)]
    assert statuses.count(429) == 19

    def refusals() -> list[dict[str, str]]:
        records = stream_fields(str, admin.xrange(AUDIT_STREAM))
        return [r for r in records if r["action"] == "ratelimit.refuse"]

    logged = wait_for(refusals, timeout=5)
    origin.wait_stored()
    assert len(refusals()) == 1  # the first at once; the other 18 wait for the interval
    assert json.loads(logged[0]["detail"]) == {"kind": "requests", "scope": "project", "count": 1}
    assert logged[0]["actor"].startswith("key:")
    shown = CliRunner().invoke(app, ["audit", "--project", "acme"], env={"REDIS_URL": redis_url})
    assert shown.exit_code == 0, shown.output
    assert "ratelimit.refuse" in shown.stdout
    assert "1 x over the project requests limit" in shown.stdout
    assert 'rate limits {"project": {"rpm": 1}}' in shown.stdout  # the policy.set record


def test_no_limits_no_rate_state_and_the_models_list_does_not_count(
    origin: RunningOrigin, api_key: str, store: PolicyStore, redis_url: str
) -> None:
    store.set("acme", deny=["o1*"], updated_by="test")  # a policy without rate limits
    response = post(origin, api_key, body())
    assert response.status_code == 200
    assert not any(name.startswith("x-ratelimit") for name in response.headers)
    admin = redis.Redis.from_url(redis_url)
    assert admin.exists("prism:limits:acme") == 0

    limit(store, project={"rpm": 1})
    models = httpx.get(origin.url + "/v1/models", headers={"authorization": f"Bearer {api_key}"})
    assert models.status_code == 200 and "x-ratelimit-limit-requests" not in models.headers
    assert post(origin, api_key, body()).status_code == 200  # the one request: not taken
    store.set("acme", rate_limits=None, updated_by="test")  # removed: not limited at once
    assert admin.exists("prism:limits:acme") == 0
    assert post(origin, api_key, body()).status_code == 200


@pytest.mark.parametrize(
    ("ms", "text"),
    [(0, "0s"), (12, "12ms"), (1000, "1s"), (1500, "1.5s"), (360_000, "6m0s"),
     (61_250, "1m1.25s"), (3_600_000, "1h0m0s")],
)  # fmt: skip
def test_reset_durations_are_written_as_openai_writes_them(ms: int, text: str) -> None:
    assert duration(ms) == text


def test_rate_limits_validate_with_clear_messages() -> None:
    assert RateLimits.from_dict({"project": {"rpm": 5}}).project == Limit(rpm=5)
    for bad, message in [
        ({}, "set at least one limit"),
        ({"project": {"rpm": 0}}, "rate_limits.project.rpm: must be between 1"),
        ({"key": {"tpm": "9"}}, "rate_limits.key.tpm: must be a whole number"),
        ({"key": {"rps": 9}}, "rate_limits.key.rps: unknown field"),
        ({"keys": {"no": {"rpm": 1}}}, "rate_limits.keys: 'no' is not a key id"),
        ({"keys": {"abcdefgh": {}}}, "rate_limits.keys.abcdefgh: set rpm, tpm or both"),
        ({"global": {}}, "rate_limits.global: unknown field"),
    ]:
        with pytest.raises(ValueError, match=message):
            RateLimits.from_dict(bad)


async def test_refusals_after_the_first_become_one_record_with_their_count(
    redis_url: str,
) -> None:
    pipe = RedisPipe(redis_url, 2.0)
    writer = AuditWriter(pipe)
    tasks: list[asyncio.Future[None]] = []
    log = RefusalLog(writer, lambda work: tasks.append(asyncio.ensure_future(work)), 0.05)
    for _ in range(500):
        log.record("acme", "keyaaaa1", "requests", "key")
    log.record("acme", "keybbbb1", "tokens", "project")
    admin = redis.Redis.from_url(redis_url, decode_responses=True)

    def details() -> list[dict[str, object]]:
        return [json.loads(f["detail"]) for f in stream_fields(str, admin.xrange(AUDIT_STREAM))]

    await async_wait_for(lambda: len(details()) >= 3, within=5)
    await asyncio.gather(*tasks)

    def canonical(items: list[dict[str, object]]) -> list[str]:
        return sorted(json.dumps(item, sort_keys=True) for item in items)

    assert canonical(details()) == canonical(
        [
            {"kind": "requests", "scope": "key", "count": 1},
            {"kind": "tokens", "scope": "project", "count": 1},
            {"kind": "requests", "scope": "key", "count": 499, "within_seconds": 0.05},
        ]
    )  # 501 refusals, three records
    await pipe.close()


@pytest.fixture
def priced_providers(provider: ProviderServer, tmp_path: Path) -> Path:
    config = tmp_path / "providers.toml"
    config.write_text(
        f'[providers.p]\nbase_url = "{provider.url}/v1"\n[models]\n"{PRICED}" = ["p"]\n'
    )
    return config


@pytest.fixture
def priced_origin(origin_factory: OriginFactory, priced_providers: Path) -> RunningOrigin:
    return origin_factory(PRISM_PROVIDERS_FILE=str(priced_providers))


def test_tokens_go_back_when_the_budget_refuses_or_the_request_joins_a_call(
    priced_origin: RunningOrigin, api_key: str, store: PolicyStore, provider: ProviderServer
) -> None:
    origin = priced_origin
    tiny = Budget(0.0001, "day")  # less than 1000 completion tokens cost
    store.set("acme", budget=tiny, rate_limits=RateLimits(project=Limit(tpm=6000)))
    refused = post(origin, api_key, body(model=PRICED, max_tokens=1000))
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exceeded"
    small = post(origin, api_key, body(model=PRICED, max_tokens=10))
    assert small.status_code == 200, small.text
    # Only the small request's bound is out (at 100 tokens a second, little refilled).
    own_bound = 6000 - int(small.headers["x-ratelimit-remaining-tokens"])
    assert 10 < own_bound < 200

    store.set("acme", budget=Budget(5, "day"), rate_limits=RateLimits(project=Limit(tpm=6000)))
    origin.wait_stored()
    provider.control.set_fault("latency", ms=300)
    payload = body(model=PRICED, max_tokens=1000)

    async def together() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=origin.url, headers={"authorization": f"Bearer {api_key}"}, timeout=30
        ) as http:
            return await asyncio.gather(*(http.post(CHAT, json=payload) for _ in range(4)))

    answers = asyncio.run(together())
    provider.control.clear()
    assert [r.status_code for r in answers] == [200] * 4
    assert provider.control.stats()["chat_requests"] == 2  # the small one, and these four's
    origin.wait_stored()
    used = answers[0].json()["usage"]["total_tokens"]
    after = post(origin, api_key, body(model=PRICED, max_tokens=10))
    left = int(after.headers["x-ratelimit-remaining-tokens"])
    # Out now: one call's usage (joiners gave their bounds back) and this request's bound,
    # less what refilled since (100 a second); four unsettled bounds would be over 4,000.
    assert 6000 - used - 2 * own_bound - 300 <= left <= 6000 - used - own_bound + 300


def test_a_stream_left_by_its_starter_is_settled_once_to_its_usage_when_the_call_ends(
    origin_factory: OriginFactory,
    priced_providers: Path,
    api_key: str,
    store: PolicyStore,
    provider: ProviderServer,
    admin: redis.Redis,
    access_lines: AccessLines,
) -> None:
    """The client that started a streamed call leaves mid-stream while a client that
    joined it keeps reading: the tokens and the money the call goes on to use are settled
    when it ends, once, to its real usage; nothing is given back at the starter's leaving.

    Were the starter's charge settled when it left (its TokenCharge or its Charge told
    "no answer"), its whole token bound would go back and the call's end would find the
    charge settled already: the limit's state would end at the starter's admission time
    (or be deleted, being in the past), not ``used`` tokens later, and the budget would
    have spent 0, not the call's cost. Both assertions at the end fail then."""
    origin = origin_factory(PRISM_PROVIDERS_FILE=str(priced_providers), PRISM_ACCESS_LOG="on")
    tpm = 800  # one token every 75 ms: the call's usage is ~10 s of the bucket
    store.set("acme", budget=Budget(5, "day"), rate_limits=RateLimits(project=Limit(tpm=tpm)))
    # The stand-in counts a word as a token; the bound counts bytes (three a word here):
    # a usage large against the bound, and still far in the bucket's future when the call
    # ends, however late that is.
    content = " ".join([secrets.token_hex(4), *["ab"] * 100])
    payload = {
        "model": PRICED,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 40,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    # The role and the first words, then silence until the joiner has joined and the
    # starter has left (released below; the minute is only a backstop).
    provider.control.set_fault("stall_mid_stream", after_chunks=2, seconds=60)

    async def run() -> tuple[int, int, httpx.Response, bytes]:
        async with httpx.AsyncClient(
            base_url=origin.url, headers={"authorization": f"Bearer {api_key}"}, timeout=30
        ) as http:

            async def join() -> tuple[httpx.Response, bytes]:
                async with http.stream("POST", CHAT, json=payload) as joined:
                    return joined, await joined.aread()

            before = redis_now_us(admin)
            async with http.stream(
                "POST", CHAT, json=payload, headers={"x-request-id": "starter"}
            ) as starter:
                admitted = redis_now_us(admin)  # the starter's tokens were admitted in between
                assert starter.status_code == 200
                assert starter.headers["x-prism-edge-cache-layer"] == "miss"
                received = starter.aiter_raw()  # kept: dropping it would close the stream
                assert (await anext(received)).startswith(b"data: ")
                joiner = asyncio.create_task(join())
                await async_wait_for(
                    lambda: origin.metric("prism_origin_coalesced_requests_total") == 1
                )
            # The starter hung up; its access log line is written once the origin has
            # closed its stream (and so left the call).
            await async_wait_for(lambda: access_lines.of("starter"))
            stats = provider.control.stats()
            # ...while the call was still stalled: the tokens it goes on to use are not
            # known yet.
            assert (stats["open_streams"], stats["streams_completed"]) == (1, 0)
            provider.control.release()
            joined, raw = await joiner
            return before, admitted, joined, raw

    before, admitted, joined, raw = asyncio.run(run())
    origin.wait_stored()  # the settles run after the response, like the cache write

    # The joiner got the whole answer, from the one call.
    assert joined.status_code == 200
    assert raw.endswith(b"data: [DONE]\n\n")
    chunks = [json.loads(event) for event in raw.decode().split("data: ")[1:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["prompt_tokens"] == 101
    assert provider.control.stats()["chat_requests"] == 1
    assert provider.control.stats()["streams_completed"] == 1
    stored = post(origin, api_key, {**payload, "stream": False})  # what the call stored
    assert stored.headers["x-prism-edge-cache-layer"] == "redis"
    assert stored.json()["choices"][0]["message"]["content"] == text

    # Tokens: the joiner took none (it joined); the starter's were settled to
    # the call's usage when the call ended. The limit's state (GCRA's theoretical arrival
    # time) is then the starter's admission time plus ``used`` tokens' worth of the
    # bucket, whatever has refilled since.
    used = usage["total_tokens"]
    state = admin.hget("prism:limits:acme", "s.tpm")
    assert state is not None, "the tokens were all given back"
    admitted_at = float(state) - used * 60_000_000 / tpm
    assert before - 1000 <= admitted_at <= admitted + 1000  # within 1 ms; a token is 75

    # Money: the call's real cost, spent once; nothing left reserved.
    price = default_prices().price("p", PRICED)
    tokens = tokens_of(usage)
    assert price is not None and tokens is not None
    cost = cost_micros(price, tokens)
    assert cost > 0
    assert budget_totals(admin) == {"spent": cost, "reserved": 0, "held": 0}


def test_an_origin_reading_a_replica_holds_the_same_limit_on_the_primary(
    origin_factory: OriginFactory,
    provider: ProviderServer,
    api_key: str,
    tmp_path: Path,
) -> None:
    """One limit across regions: the near origin on the primary, the far one looking up
    on a replica (which cannot write); the limit's state lives on the primary."""
    (tmp_path / "primary").mkdir()
    (tmp_path / "replica").mkdir()
    with RedisServer(workdir=tmp_path / "primary") as primary:
        replica = RedisServer(workdir=tmp_path / "replica", replica_of=primary).start()
        try:
            reader = redis.Redis.from_url(replica.url)
            wait_for(lambda: reader.info("replication").get("master_link_status") == "up", 10)
            near = origin_factory(origin_env(primary.url, provider.url))
            far = origin_factory(
                origin_env(primary.url, provider.url, PRISM_REDIS_READ_URL=replica.url)
            )
            policies = PolicyStore.from_url(primary.url)
            policies.set("acme", rate_limits=RateLimits(key=Limit(rpm=4)), updated_by="test")
            policies.close()
            wait_for(lambda: reader.exists("prism:limits:acme"), 5)  # replicated
            statuses = [post((near, far)[i % 2], api_key, body()).status_code for i in range(6)]
            assert statuses == [200, 200, 200, 200, 429, 429]
            refused = post(far, api_key, body())
            assert refused.json()["error"]["type"] == "requests"
            assert refused.headers["x-ratelimit-limit-requests"] == "4"
            assert far.metric("prism_redis_errors_total", op="lookup_replica") == 0
            reader.close()
        finally:
            replica.stop()


def test_the_request_limit_holds_on_every_api_route(
    origin: RunningOrigin, api_key: str, store: PolicyStore
) -> None:
    limit(store, project={"rpm": 2})
    auth = {"authorization": f"Bearer {api_key}"}
    embedding = {"model": "m", "input": secrets.token_hex(6)}
    first = httpx.post(origin.url + "/v1/embeddings", json=embedding, headers=auth, timeout=30)
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert post(origin, api_key, body()).status_code == 200  # chat takes the second slot
    refused = httpx.post(origin.url + "/v1/embeddings", json=embedding, headers=auth, timeout=30)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(refused.headers["retry-after"]) >= 1
