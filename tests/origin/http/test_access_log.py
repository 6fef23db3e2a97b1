"""The access log through the real origin: one JSON line per request (miss, hit, stream,
errors) with the fields an operator needs, never the API key or the prompt unless asked."""

from __future__ import annotations

import logging
import secrets
from typing import Any

import httpx

from deploy.local.provider import ProviderServer
from origin import Settings
from origin.http.access_log import ACCESS_LOGGER, AccessLog
from origin.http.request import Request, StageTimer
from origin.http.responses import Reply
from origin.providers.token_counts import tokens_of
from origin.requestlog.record import RecordMaker
from prism import headers as h
from tests.fixtures.origin import AccessLines, OriginFactory, RunningOrigin, origin_env


def _post(origin: RunningOrigin, key: str, body: object, request_id: str) -> httpx.Response:
    return httpx.post(
        origin.url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}", "x-request-id": request_id},
        timeout=30,
    )


def test_a_miss_a_hit_and_a_stream_each_log_one_line_with_what_happened(
    origin_factory: OriginFactory, api_key: str, access_lines: AccessLines
) -> None:
    origin = origin_factory(PRISM_ACCESS_LOG="on")
    prompt = f"a secret question {secrets.token_hex(8)}"
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": prompt}]}

    assert _post(origin, api_key, body, "log-miss").status_code == 200
    origin.wait_stored()
    assert _post(origin, api_key, body, "log-hit").status_code == 200
    streamed = {**body, "messages": [{"role": "user", "content": prompt + " again"}]}
    with httpx.stream(
        "POST",
        origin.url + "/v1/chat/completions",
        json={**streamed, "stream": True},
        headers={"authorization": f"Bearer {api_key}", "x-request-id": "log-stream"},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        assert b"[DONE]" in response.read()

    miss = access_lines.line("log-miss")
    assert miss["status"] == 200 and miss["layer"] == "miss"
    assert miss["method"] == "POST" and miss["path"] == "/v1/chat/completions"
    assert miss["project"] == "acme" and miss["model"] == "gpt-4o-mini"
    assert miss["provider"] == "openai" and miss["upstream_model"] == "gpt-4o-mini"
    assert miss["tokens_in"] > 0 and miss["tokens_out"] > 0
    assert miss["cost_usd"] > 0  # gpt-4o-mini has a list price
    assert 0 < miss["ttfb_ms"] <= miss["total_ms"]
    assert miss["stream"] is False and "error" not in miss

    hit = access_lines.line("log-hit")
    assert hit["layer"] == "redis" and hit["status"] == 200
    assert (hit["tokens_in"], hit["tokens_out"]) == (miss["tokens_in"], miss["tokens_out"])
    assert hit["cost_usd"] == 0  # a hit spends nothing
    assert "provider" not in hit

    stream = access_lines.line("log-stream")
    assert stream["layer"] == "miss" and stream["stream"] is True
    assert stream["tokens_out"] > 0  # settled when the stream ended, before the line
    assert stream["ttfb_ms"] <= stream["total_ms"]

    everything = "\n".join(access_lines.lines)
    assert api_key not in everything and prompt not in everything


def test_errors_are_logged_with_their_code_and_no_key(
    origin_factory: OriginFactory, provider: ProviderServer, api_key: str, access_lines: AccessLines
) -> None:
    origin = origin_factory(PRISM_ACCESS_LOG="on")
    forged = api_key[:-4] + "AAAA"
    assert _post(origin, forged, {"model": "x"}, "log-401").status_code == 401
    assert _post(origin, api_key, {"model": "gpt-4o-mini"}, "log-400").status_code == 400
    provider.control.set_fault("status", count=10, status=503)  # every try of the next request
    failing = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "fails"}]}
    assert _post(origin, api_key, failing, "log-503").status_code >= 500

    unauthorized = access_lines.line("log-401")
    assert unauthorized["status"] == 401 and unauthorized["error"] == "invalid_api_key"
    assert "project" not in unauthorized  # nobody was identified
    invalid = access_lines.line("log-400")
    assert invalid["status"] == 400 and invalid["project"] == "acme"
    assert invalid["error"] == "invalid_request"
    upstream = access_lines.line("log-503")
    assert upstream["status"] == 503 and upstream["error"] == "upstream_unavailable"
    assert upstream["model"] == "gpt-4o-mini" and upstream["project"] == "acme"
    assert "tokens_out" not in upstream  # nothing was answered
    everything = "\n".join(access_lines.lines)
    assert api_key not in everything and forged not in everything


def test_the_prompt_only_when_asked_and_no_line_by_default(
    origin_factory: OriginFactory, api_key: str, access_lines: AccessLines
) -> None:
    asked = origin_factory(PRISM_ACCESS_LOG="on", PRISM_ACCESS_LOG_PROMPT="on")
    prompt = f"log me {secrets.token_hex(6)}"
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": prompt}]}
    assert _post(asked, api_key, body, "log-prompt").status_code == 200
    assert access_lines.line("log-prompt")["prompt"] == {"messages": body["messages"]}

    off = origin_factory()  # the default
    request_log = off.gateway.request_log
    assert request_log is not None and request_log.access_log is None
    assert _post(off, api_key, body, "log-off").status_code == 200
    assert all(r["request_id"] != "log-off" for r in access_lines.records())


def test_a_silenced_logger_costs_no_line(
    origin_factory: OriginFactory, api_key: str, access_lines: AccessLines
) -> None:
    origin = origin_factory(PRISM_ACCESS_LOG="on")
    logging.getLogger(ACCESS_LOGGER).setLevel(logging.WARNING)  # the operator turned it down
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "quiet"}]}
    assert _post(origin, api_key, body, "log-quiet").status_code == 200
    assert access_lines.lines == []


async def _no_body() -> dict[str, Any]:
    return {"type": "http.request", "body": b""}


def test_a_hit_logs_its_tokens_as_a_miss_and_the_bill_count_them(
    redis_url: str, provider: ProviderServer, access_lines: AccessLines
) -> None:
    """An Anthropic answer's stored usage: its prompt counts the provider's cached tokens
    too, as the miss's line and the bill (``origin.providers.token_counts.tokens_of``) do."""
    log = AccessLog(Settings.from_env(origin_env(redis_url, provider.url)))
    request = Request("POST", "/v1/messages", {}, _no_body, "log-anthropic-hit", StageTimer())
    request.usage = {
        "input_tokens": 12,
        "cache_read_input_tokens": 100,
        "cache_creation_input_tokens": 30,
        "output_tokens": 7,
    }
    request.hit_cost = (0, tokens_of(request.usage))  # as ``Billing.hit`` returns it
    reply = Reply(200, {h.CACHE_LAYER: "redis"})
    started = request.timer.started
    record = RecordMaker(None).make(request, reply, started, started, "messages")
    log.write(record, request)
    line = access_lines.line("log-anthropic-hit")
    assert (line["tokens_in"], line["tokens_out"]) == (142, 7)
    assert line["cost_usd"] == 0
