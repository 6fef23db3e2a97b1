"""The request log through the real path: a real origin, real Redis, the stand-in provider;
each kind of request appears once in `prism logs --json` with what happened to it."""

from __future__ import annotations

import concurrent.futures
import json
import secrets
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from typer.testing import CliRunner

from deploy.cli import app
from deploy.local.provider import ProviderServer
from deploy.local.redis import RedisServer
from deploy.policy_store import PolicyStore
from prism import Budget, LogRules, RateLimits
from tests.fixtures.origin import OriginFactory, RunningOrigin
from tests.fixtures.semantic import calls
from tests.polling import wait_for

runner = CliRunner()
CHAT = "/v1/chat/completions"


@pytest.fixture
def origin(origin_factory: OriginFactory) -> RunningOrigin:
    # A busy machine is no Redis outage: a lookup slow past the default timeout would be
    # served as one (no rate limit, no cache), and these tests say what each layer logs.
    return origin_factory(settings={"redis_timeout": 5.0})


def post(
    origin: RunningOrigin, key: str, request_id: str, content: str | None = None, **extra: Any
) -> httpx.Response:
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": content or request_id}],
    }
    return httpx.post(
        origin.url + CHAT,
        json={**body, **extra},
        headers={"authorization": f"Bearer {key}", "x-request-id": request_id},
        timeout=30,
    )


def logs(redis_url: str, *args: str) -> list[dict[str, Any]]:
    """`prism logs --json *args`, one record per line."""
    result = runner.invoke(app, ["logs", "--json", *args], env={"REDIS_URL": redis_url})
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.output.splitlines() if line]


def logged(redis_url: str, ids: set[str], *args: str) -> dict[str, dict[str, Any]]:
    """The records of ``ids`` once every one of them is in the window."""

    def all_there() -> dict[str, dict[str, Any]] | None:
        records = [r for r in logs(redis_url, "--limit", "1000", *args) if r["id"] in ids]
        found = {r["id"]: r for r in records}
        return found if set(found) == ids else None

    found = wait_for(all_there, timeout=30)
    records = [r for r in logs(redis_url, "--limit", "1000", *args) if r["id"] in ids]
    assert len(records) == len(ids)  # each once
    return found


def test_each_kind_of_request_appears_once_with_its_layer_status_and_error(
    origin: RunningOrigin, api_key: str, provider: ProviderServer, redis_url: str
) -> None:
    assert post(origin, api_key, "rl-miss", "the question").status_code == 200
    origin.wait_stored()
    assert post(origin, api_key, "rl-hit", "the question").status_code == 200
    forged = api_key[:-4] + "AAAA"
    assert post(origin, forged, "rl-401").status_code == 401
    bad = httpx.post(
        origin.url + CHAT,
        json={"model": "gpt-4o-mini"},
        headers={"authorization": f"Bearer {api_key}", "x-request-id": "rl-400"},
    )
    assert bad.status_code == 400
    provider.control.set_fault("status", count=10, status=503)  # every try of the next one
    assert post(origin, api_key, "rl-503").status_code == 503
    provider.control.clear()

    found = logged(redis_url, {"rl-miss", "rl-hit", "rl-401", "rl-400", "rl-503"})
    miss, hit = found["rl-miss"], found["rl-hit"]
    assert miss["layer"] == "miss" and miss["status"] == 200 and miss["source"] == "origin"
    assert miss["project"] == "acme" and miss["api"] == "chat" and miss["model"] == "gpt-4o-mini"
    assert miss["provider"] == "openai" and miss["answered_model"] == "gpt-4o-mini"
    assert miss["tokens_in"] > 0 and miss["tokens_out"] > 0 and miss["cost_usd"] > 0
    assert [a["status"] for a in miss["attempts"]] == [200]
    assert {"auth", "parse", "redis", "upstream"} <= set(miss["stages"])
    assert 0 < miss["ttfb_ms"] <= miss["total_ms"]
    assert len(miss["fingerprint"]) == 64 and miss["key"]  # the key's id
    assert hit["layer"] == "redis" and hit["cost_usd"] == 0 and hit["saved_usd"] > 0
    assert hit["fingerprint"] == miss["fingerprint"] and "attempts" not in hit
    assert set(hit["stages"]) == {"auth", "parse", "redis"}

    refused = found["rl-401"]
    assert refused["status"] == 401 and refused["error"] == "invalid_api_key"
    assert refused["layer"] == "refused" and "project" not in refused and "key" not in refused
    invalid = found["rl-400"]
    assert invalid["status"] == 400 and invalid["layer"] == "refused"
    assert invalid["error"] == "invalid_request" and invalid["project"] == "acme"
    failed = found["rl-503"]
    assert failed["status"] == 503 and failed["error"] == "upstream_unavailable"
    assert failed["layer"] == "miss" and "tokens_out" not in failed
    assert len(failed["attempts"]) >= 2  # retried before it gave up
    assert all(a["status"] == 503 and a["provider"] == "openai" for a in failed["attempts"])

    everything = json.dumps(logs(redis_url, "--limit", "1000"))
    assert api_key not in everything and forged not in everything

    # The filters, and one request whole by its id.
    assert {r["id"] for r in logs(redis_url, "--project", "acme", "--status", "error")} == {
        "rl-400",
        "rl-503",
    }
    assert [r["id"] for r in logs(redis_url, "--layer", "redis")] == ["rl-hit"]
    assert [r["id"] for r in logs(redis_url, "--project", "-")] == ["rl-401"]
    assert logs(redis_url, "--project", "acme", "--since", "1d", "--limit", "2")[-1]["id"] == (
        "rl-503"
    )
    assert logs(redis_url, "--until", "1h") == []
    assert [r["id"] for r in logs(redis_url, "--key", hit["key"], "--model", "gpt-4o-mini")][
        :2
    ] == ["rl-miss", "rl-hit"]
    (whole,) = logs(redis_url, "--id", "rl-503")
    assert whole["attempts"] == failed["attempts"] and whole["stages"] == failed["stages"]
    table = runner.invoke(app, ["logs", "--id", "rl-503"], env={"REDIS_URL": redis_url})
    assert table.exit_code == 0 and "Provider attempts" in table.output
    assert "upstream_unavailable" in table.output
    missing = runner.invoke(app, ["logs", "--id", "nope"], env={"REDIS_URL": redis_url})
    assert missing.exit_code == 1 and "no record" in missing.output


def test_rate_limit_and_budget_refusals_are_recorded_as_refused(
    origin: RunningOrigin, api_key: str, redis_url: str
) -> None:
    store = PolicyStore(redis.Redis.from_url(redis_url, decode_responses=True))
    store.set("acme", rate_limits=RateLimits.from_dict({"key": {"rpm": 1}}), updated_by="t")
    assert post(origin, api_key, "rl-rate-ok").status_code == 200
    assert post(origin, api_key, "rl-rate-429").status_code == 429
    store.set("acme", budget=Budget(0.000001, "day"), updated_by="t")
    budget = post(origin, api_key, "rl-budget", max_tokens=4000)
    assert budget.status_code in (402, 429)
    refused = budget.json()["error"]["code"]

    found = logged(redis_url, {"rl-rate-ok", "rl-rate-429", "rl-budget"})
    assert found["rl-rate-ok"]["status"] == 200
    limited = found["rl-rate-429"]
    assert limited["status"] == 429 and limited["error"] == "rate_limit_exceeded"
    assert limited["layer"] == "refused" and limited["key"] == found["rl-rate-ok"]["key"]
    over = found["rl-budget"]
    assert over["status"] == budget.status_code and over["error"] == refused == "budget_exceeded"
    assert over["layer"] == "refused" and "attempts" not in over


def test_a_request_that_joins_another_call_is_coalesced(
    origin: RunningOrigin, api_key: str, provider: ProviderServer, redis_url: str
) -> None:
    provider.control.set_fault("stall_before_first_byte", count=1, seconds=10)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        lead = pool.submit(post, origin, api_key, "rl-lead", "the same")
        wait_for(lambda: calls(provider) == 1)  # the lead's call is in flight
        join = pool.submit(post, origin, api_key, "rl-join", "the same")
        wait_for(lambda: origin.metric("prism_origin_coalesced_requests_total") == 1)
        provider.control.release()
        assert lead.result().status_code == join.result().status_code == 200
    found = logged(redis_url, {"rl-lead", "rl-join"})
    assert found["rl-lead"]["layer"] == "miss"
    joined = found["rl-join"]
    assert joined["layer"] == "coalesced" and joined["provider"] == "openai"
    assert joined["attempts"] == found["rl-lead"]["attempts"]
    assert "cost_usd" not in joined  # the lead's call pays


def test_bodies_only_with_the_policy_and_redacted(
    origin: RunningOrigin, api_key: str, redis_url: str
) -> None:
    secret = "sk-ant-api03-" + secrets.token_urlsafe(24)
    aws = "AKIA" + secrets.token_hex(8).upper()
    prompt = f"my key is {secret}, aws {aws}, mail me at someone@example.com"
    assert post(origin, api_key, "rl-no-body", prompt).status_code == 200
    store = PolicyStore(redis.Redis.from_url(redis_url, decode_responses=True))
    store.set("acme", log=LogRules(bodies=True), updated_by="t")
    assert post(origin, api_key, "rl-body", prompt + " again").status_code == 200
    store.set("acme", log=LogRules(bodies=True, redact_emails=True), updated_by="t")
    assert post(origin, api_key, "rl-body-emails", prompt + " once more").status_code == 200

    found = logged(redis_url, {"rl-no-body", "rl-body", "rl-body-emails"})
    assert "body" not in found["rl-no-body"]
    body = found["rl-body"]["body"]
    asked = body["request"]["messages"][0]["content"]
    assert asked.startswith("my key is [REDACTED], aws [REDACTED]")
    assert "someone@example.com" in asked
    assert isinstance(body["response"], str) and body["response"]
    emails = found["rl-body-emails"]["body"]["request"]["messages"][0]["content"]
    assert "someone@example.com" not in emails and "[REDACTED]" in emails
    everything = json.dumps(logs(redis_url, "--limit", "1000"))
    assert secret not in everything and aws not in everything


def test_follow_prints_a_new_request_as_it_comes(
    origin: RunningOrigin, api_key: str, redis_url: str
) -> None:
    import subprocess
    import sys
    import threading

    assert post(origin, api_key, "rl-before").status_code == 200
    logged(redis_url, {"rl-before"})
    follower = subprocess.Popen(
        [sys.executable, "-m", "deploy.cli", "logs", "--follow", "--json", "-p", "acme", "-n", "1"],
        env={"REDIS_URL": redis_url, "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(
        target=lambda: lines.extend(iter(follower.stdout.readline, "")),  # type: ignore[union-attr]
        daemon=True,
    )
    reader.start()
    try:
        wait_for(lambda: any("rl-before" in line for line in lines))  # the newest, then waits
        assert post(origin, api_key, "rl-after").status_code == 200
        wait_for(lambda: any("rl-after" in line for line in lines))
        ids = [json.loads(line)["id"] for line in lines]
        assert ids == ["rl-before", "rl-after"]
    finally:
        follower.terminate()
        follower.wait(10)


def test_a_redis_outage_neither_fails_nor_slows_requests_and_the_records_arrive_after(
    origin_factory: OriginFactory, api_key: str, tmp_path: Path
) -> None:
    server = RedisServer(workdir=tmp_path).start()
    try:
        origin = origin_factory(REDIS_URL=server.url, PRISM_LOG_BUFFER="4")
        assert post(origin, api_key, "rl-up").status_code == 200
        logged(server.url, {"rl-up"})
        server.stop()
        down = [f"rl-down-{n}" for n in range(10)]
        for request_id in down:
            started = time.monotonic()
            assert post(origin, api_key, request_id).status_code == 200
            assert time.monotonic() - started < 1.0
        # At most a batch being retried and 4 queued wait: the oldest of the rest are dropped
        # (a record is made once its response is out: the last may follow it by a moment).
        wait_for(lambda: origin.metric("prism_request_log_dropped_total", sink="redis") >= 2)
        server.start()
        newest = set(down[-4:])  # always among those waiting
        logged(server.url, newest)
        (buffer,) = origin.gateway.request_log.buffers  # type: ignore[union-attr]
        wait_for(lambda: buffer.queued == 0, timeout=30)
        arrived = {r["id"] for r in logs(server.url, "--limit", "100")} & set(down)
        dropped = origin.metric("prism_request_log_dropped_total", sink="redis")
        assert newest <= arrived and len(arrived) + dropped == len(down)
        assert origin.metric("prism_request_log_written_total", sink="redis") == 1 + len(arrived)
    finally:
        server.stop()


def test_off_no_record_is_made(origin_factory: OriginFactory, api_key: str, redis_url: str) -> None:
    origin = origin_factory(PRISM_REQUEST_LOG="off")
    assert origin.gateway.request_log is None
    assert post(origin, api_key, "rl-off").status_code == 200
    assert logs(redis_url) == []
