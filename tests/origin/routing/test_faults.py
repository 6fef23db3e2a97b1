"""Provider faults, client aborts and Redis outages: the right error, nothing stored, no crash."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import openai
import pytest
import redis
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from deploy.local.asgi_thread import ThreadedServer
from deploy.local.provider import ProviderServer, ProviderSettings
from deploy.local.redis import RedisServer
from origin import Settings, create_app
from tests.fixtures.origin import OriginFactory, RunningOrigin, origin_env
from tests.polling import async_wait_for, wait_for

BODY: dict[str, object] = {"model": "demo", "messages": [{"role": "user", "content": "fault test"}]}


@pytest.fixture
def fast_timeouts(tmp_path: Path, provider: ProviderServer) -> dict[str, str]:
    config = tmp_path / "providers.toml"
    config.write_text(
        f"""
[providers.local]
base_url = "{provider.url}/v1"
api_key = "provider-test-key"
first_byte_timeout = 0.5

[models]
"*" = ["local"]
"""
    )
    return {"PRISM_PROVIDERS_FILE": str(config)}


@pytest.fixture
def timed_origin(origin_factory: OriginFactory, fast_timeouts: dict[str, str]) -> RunningOrigin:
    return origin_factory(fast_timeouts)


def post(origin: RunningOrigin, api_key: str, body: dict[str, object] = BODY) -> httpx.Response:
    return httpx.post(
        origin.url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {api_key}"},
        timeout=30,
    )


def stored_keys(redis_url: str) -> list[bytes]:
    client = redis.Redis.from_url(redis_url)
    try:
        return list(client.scan_iter("prism:v1:*"))
    finally:
        client.close()


@pytest.mark.parametrize(
    ("mode", "params", "status", "code"),
    [
        # twice: the router retries a 500/503 once on the same provider
        ("status", {"status": 500, "count": 2}, 502, "bad_gateway"),
        ("status", {"status": 503, "count": 2}, 503, "upstream_unavailable"),
        ("rate_limit", {"retry_after": 7}, 429, "upstream_rate_limited"),
        ("stall_before_first_byte", {"seconds": 3}, 504, "upstream_timeout"),
        ("malformed_json", {}, 502, "upstream_malformed"),
        ("truncated_stream", {}, 502, "upstream_malformed"),
    ],
)
def test_provider_faults_become_openai_errors_and_store_nothing(
    timed_origin: RunningOrigin,
    api_key: str,
    provider: ProviderServer,
    redis_url: str,
    mode: str,
    params: dict[str, Any],
    status: int,
    code: str,
) -> None:
    provider.control.set_fault(mode, **params)
    response = post(timed_origin, api_key)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    assert "provider-test-key" not in response.text
    if status == 429:
        assert response.headers["retry-after"] == "7"
    assert stored_keys(redis_url) == []
    # the fault was one-off: the next identical request is a clean miss, then stored
    healthy = post(timed_origin, api_key)
    assert healthy.status_code == 200 and healthy.headers["x-prism-edge-cache-layer"] == "miss"
    wait_for(lambda: len(stored_keys(redis_url)) == 1)


def test_unreachable_provider_is_502(
    origin_factory: OriginFactory, api_key: str, closed_provider_url: str, redis_url: str
) -> None:
    origin = origin_factory(OPENAI_BASE_URL=closed_provider_url + "/v1")
    response = post(origin, api_key)
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_unreachable"


def sse_data(text: str) -> list[Any]:
    """Each event's data: the parsed JSON, or the raw text ("[DONE]")."""
    events = [block.removeprefix("data: ") for block in text.split("\n\n") if block]
    return [event if event == "[DONE]" else json.loads(event) for event in events]


@pytest.mark.parametrize(
    ("mode", "code", "counted_by_the_flight"),
    [
        ("truncated_stream", "upstream_truncated", True),  # clean close before finish_reason
        ("stall_mid_stream", "upstream_timeout", False),  # silence past the idle limit
        ("malformed_json", "upstream_malformed", True),
    ],
)
def test_broken_stream_ends_with_an_error_event_and_stores_nothing(
    timed_origin: RunningOrigin,
    api_key: str,
    provider: ProviderServer,
    redis_url: str,
    mode: str,
    code: str,
    counted_by_the_flight: bool,
) -> None:
    provider.control.set_fault(mode, seconds=3)
    response = post(timed_origin, api_key, {**BODY, "stream": True})
    assert response.status_code == 200  # the stream had started
    *chunks, last = sse_data(response.text)
    assert chunks and all("choices" in chunk for chunk in chunks)  # bytes reached the client
    assert "[DONE]" not in chunks
    assert last["error"]["code"] == code and last["error"]["message"]
    assert last["error"]["type"] in ("upstream_error", "timeout_error")
    timed_origin.wait_stored()
    assert stored_keys(redis_url) == []
    assert len(timed_origin.gateway.flights) == 0
    if counted_by_the_flight:  # the router counts what its events iterator raises
        health = httpx.get(timed_origin.admin_url + "/healthz").json()["providers"]["local"]
        assert health["last_error"] == f"502 {code}"


def test_a_shared_call_that_never_answers_ends_every_waiter(
    redis_url: str, api_key: str, provider: ProviderServer, tmp_path: Path
) -> None:
    """Twelve requests share one call that times out before its first byte (0.5 s). The
    call's connection is held until all twelve have joined, so none comes after the
    timeout, however slowly they arrive (each would start a call of its own)."""
    config = tmp_path / "providers.toml"
    config.write_text(
        f'[providers.local]\nbase_url = "{provider.url}/v1"\napi_key = "provider-test-key"\n'
        'first_byte_timeout = 0.5\nconnect_timeout = 60\n[models]\n"*" = ["local"]\n'
    )
    joined = threading.Event()

    class Held(aiohttp.TCPConnector):
        async def connect(self, *args: Any, **kwargs: Any) -> Any:
            await asyncio.to_thread(joined.wait)
            return await super().connect(*args, **kwargs)

    app = create_app(
        Settings.from_env(origin_env(redis_url, provider.url, PRISM_PROVIDERS_FILE=str(config))),
        connectors={"local": lambda spec: Held()},
    )
    registry = app.gateway.metrics.registry
    provider.control.set_fault("stall_before_first_byte", seconds=5)  # first_byte_timeout 0.5
    body = {**BODY, "messages": [{"role": "user", "content": "never answered"}]}

    async def run(url: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=url, headers={"authorization": f"Bearer {api_key}"}, timeout=30
        ) as http:
            requests = asyncio.gather(
                *[
                    http.post("/v1/chat/completions", json={**body, "stream": i % 3 == 0})
                    for i in range(12)
                ]
            )
            await async_wait_for(
                lambda: registry.get_sample_value("prism_origin_coalesced_requests_total") == 11,
                within=60,
            )
            joined.set()
            return await requests

    try:
        with ThreadedServer(app) as server:
            responses = asyncio.run(run(server.url))
            assert [r.status_code for r in responses] == [504] * 12
            assert {r.json()["error"]["code"] for r in responses} == {"upstream_timeout"}
            assert provider.control.stats()["chat_requests"] == 1  # one shared call
            assert len(app.gateway.flights) == 0
            again = httpx.post(  # the next identical request starts afresh
                server.url + "/v1/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {api_key}"},
                timeout=30,
            )
            assert again.status_code == 200
            assert again.headers["x-prism-edge-cache-layer"] == "miss"
    finally:
        joined.set()


def test_an_unexpected_failure_in_the_shared_call_is_a_500_for_every_waiter(
    redis_url: str,
    provider: ProviderServer,
    api_key: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()

    class Broken(aiohttp.BaseConnector):
        async def connect(self, *args: Any, **kwargs: Any) -> Any:
            await asyncio.to_thread(release.wait)  # held until every request has joined
            raise RuntimeError("a bug in the provider plumbing")

    app = create_app(
        Settings.from_env(origin_env(redis_url, provider.url)),
        connectors={"openai": lambda spec: Broken()},
    )
    registry = app.gateway.metrics.registry

    def coalesced() -> float:
        return registry.get_sample_value("prism_origin_coalesced_requests_total") or 0.0

    body = {**BODY, "messages": [{"role": "user", "content": "our bug"}]}

    async def run(url: str, joined: float) -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            requests = asyncio.gather(
                *[
                    http.post(
                        "/v1/chat/completions",
                        json={**body, "stream": i % 2 == 0},
                        headers={"authorization": f"Bearer {api_key}", "x-request-id": f"r-{i}"},
                    )
                    for i in range(10)
                ]
            )
            await async_wait_for(lambda: coalesced() >= joined + 9)
            release.set()
            return await requests

    with caplog.at_level(logging.WARNING, logger="prism.origin"), ThreadedServer(app) as server:
        for burst in range(2):  # and the second burst is answered too: nothing was left behind
            release.clear()
            responses = asyncio.run(run(server.url, joined=burst * 9))
            assert [r.status_code for r in responses] == [500] * 10
            assert {r.json()["error"]["code"] for r in responses} == {"internal_error"}
            assert "a bug" not in responses[0].text
            assert len(app.gateway.flights) == 0
    # One shared call per burst: the bug logged with its traceback where it happened,
    # and the failed call with the id of the request that started it.
    bugs = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert len(bugs) == 2 and all(r.exc_info for r in bugs)
    failures = [r for r in caplog.records if "500 internal_error" in r.getMessage()]
    assert len(failures) == 2
    assert all(re.search(r"request r-\d+ ", r.getMessage()) for r in failures)


class _NoDoneProvider:
    """An OpenAI-compatible stand-in that ends every stream by closing the body, without
    ``data: [DONE]``; ``finish`` False closes it before the finish_reason."""

    def __init__(self) -> None:
        self.finish = True
        self.calls = 0

    def app(self) -> Starlette:
        async def chat(request: Request) -> StreamingResponse:
            self.calls += 1
            body = await request.json()
            options = body.get("stream_options") or {}
            usage = options.get("include_usage") is True
            return StreamingResponse(self._events(usage), media_type="text/event-stream")

        return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])

    async def _events(self, usage: bool) -> AsyncIterator[bytes]:
        base = {"id": "chatcmpl-nd", "object": "chat.completion.chunk", "created": 1, "model": "m"}
        extra = {"usage": None} if usage else {}

        def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return b"data: " + json.dumps({**base, "choices": [choice], **extra}).encode() + b"\n\n"

        yield event({"role": "assistant", "content": ""})
        yield event({"content": "No "})
        yield event({"content": "DONE here."})
        if self.finish:
            yield event({}, "stop")
            if usage:
                counts = {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
                yield b"data: " + json.dumps({**base, "choices": [], "usage": counts}).encode()
                yield b"\n\n"


@pytest.fixture
def no_done_provider() -> Iterator[tuple[_NoDoneProvider, str]]:
    provider = _NoDoneProvider()
    with ThreadedServer(provider.app(), lifespan="off") as server:
        yield provider, server.url


@pytest.mark.parametrize("include_usage", [False, True])
def test_a_stream_closed_cleanly_after_every_choice_finished_is_complete(
    origin_factory: OriginFactory,
    api_key: str,
    redis_url: str,
    no_done_provider: tuple[_NoDoneProvider, str],
    include_usage: bool,
) -> None:
    upstream, url = no_done_provider
    origin = origin_factory(OPENAI_BASE_URL=url + "/v1")
    body: dict[str, Any] = {**BODY, "stream": True}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    client = openai.OpenAI(base_url=origin.url + "/v1", api_key=api_key, max_retries=0)
    with client.chat.completions.with_streaming_response.create(**body) as response:
        raw = response.http_response.read().decode()
    assert raw.endswith("data: [DONE]\n\n")  # relayed as a complete answer
    events = sse_data(raw)
    assert not any("error" in e for e in events if isinstance(e, dict))
    if include_usage:
        assert events[-2]["usage"]["total_tokens"] == 6
    origin.wait_stored()
    assert len(stored_keys(redis_url)) == 1  # and stored
    hit = post(origin, api_key, {**BODY, "stream": False})
    assert hit.headers["x-prism-edge-cache-layer"] == "redis"
    assert hit.json()["choices"][0]["message"]["content"] == "No DONE here."
    assert upstream.calls == 1


def test_a_stream_closed_cleanly_before_it_finished_is_an_error_and_not_stored(
    origin_factory: OriginFactory,
    api_key: str,
    redis_url: str,
    no_done_provider: tuple[_NoDoneProvider, str],
) -> None:
    upstream, url = no_done_provider
    upstream.finish = False
    origin = origin_factory(OPENAI_BASE_URL=url + "/v1")
    response = post(origin, api_key, {**BODY, "stream": True})
    *chunks, last = sse_data(response.text)
    assert chunks and "[DONE]" not in chunks
    assert last["error"]["code"] == "upstream_truncated"
    origin.wait_stored()
    assert stored_keys(redis_url) == []


def test_a_json_client_that_goes_away_while_waiting_stops_the_call(
    origin_factory: OriginFactory,
    api_key: str,
    redis_url: str,
    provider_factory: Callable[[ProviderSettings], ProviderServer],
) -> None:
    slow = provider_factory(ProviderSettings(latency_ms=30_000))
    origin = origin_factory(OPENAI_BASE_URL=slow.url + "/v1")
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(
            origin.url + "/v1/chat/completions",
            json=BODY,
            headers={"authorization": f"Bearer {api_key}"},
            timeout=0.5,
        )
    # uvicorn does not cancel the app when the client leaves; the origin notices anyway
    wait_for(lambda: len(origin.gateway.flights) == 0, timeout=10)
    wait_for(
        lambda: (
            origin.metric("prism_origin_requests_total", route="chat", status="499", layer="miss")
            == 1
        )
    )
    assert stored_keys(redis_url) == []


def test_a_stream_nobody_reads_any_more_is_cancelled_even_with_json_joiners(
    origin_factory: OriginFactory,
    api_key: str,
    redis_url: str,
    provider_factory: Callable[[ProviderSettings], ProviderServer],
) -> None:
    slow = provider_factory(ProviderSettings(tokens_per_second=5, reply_words=150))  # ~30 s
    origin = origin_factory(OPENAI_BASE_URL=slow.url + "/v1")
    body = {**BODY, "messages": [{"role": "user", "content": "everyone leaves"}]}
    headers = {"authorization": f"Bearer {api_key}"}

    async def run() -> None:
        async with (
            httpx.AsyncClient(base_url=origin.url, headers=headers, timeout=30) as http,
            http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as leader,
        ):
            chunks = leader.aiter_raw()  # held: dropping it would close the response
            assert (await anext(chunks)).startswith(b"data: ")
            joiner = asyncio.ensure_future(http.post("/v1/chat/completions", json=body))
            await async_wait_for(
                lambda: origin.metric("prism_origin_coalesced_requests_total") >= 1
            )
            joiner.cancel()  # the JSON client goes away...
            with contextlib.suppress(asyncio.CancelledError):
                await joiner
            # ...and the leader has not: the call goes on for it
            assert slow.control.stats()["open_streams"] == 1
            assert isinstance(chunks, AsyncGenerator)  # what httpx types an AsyncIterator
            await chunks.aclose()

    asyncio.run(run())
    # nobody waits for the answer any more: the provider's stream is closed, not finished
    wait_for(lambda: slow.control.stats()["streams_aborted"] == 1, timeout=10)
    assert slow.control.stats()["streams_completed"] == 0
    assert len(origin.gateway.flights) == 0
    origin.wait_stored()
    assert stored_keys(redis_url) == []


def test_client_abort_mid_stream_stores_nothing_and_cancels_upstream(
    timed_origin: RunningOrigin, api_key: str, provider: ProviderServer, redis_url: str
) -> None:
    provider.control.set_fault("stall_mid_stream", seconds=0.4)
    with (
        httpx.Client(timeout=30) as http,
        http.stream(
            "POST",
            timed_origin.url + "/v1/chat/completions",
            json={**BODY, "stream": True},
            headers={"authorization": f"Bearer {api_key}"},
        ) as response,
    ):
        assert response.status_code == 200
        first = next(response.iter_raw())
        assert first.startswith(b"data: ")
    # the client is gone mid-stream: the provider's stream is closed, nothing is stored
    wait_for(lambda: provider.control.stats()["open_streams"] == 0)
    timed_origin.wait_stored()  # any write the aborted stream had scheduled is done by now
    assert stored_keys(redis_url) == []
    again = post(timed_origin, api_key, {**BODY, "stream": True})
    assert again.headers["x-prism-edge-cache-layer"] == "miss"


def test_failover_to_the_next_provider_before_the_first_byte(
    origin_factory: OriginFactory,
    api_key: str,
    provider: ProviderServer,
    closed_provider_url: str,
    tmp_path: Path,
    redis_url: str,
) -> None:
    config = tmp_path / "providers.toml"
    config.write_text(
        f"""
[providers.dead]
base_url = "{closed_provider_url}/v1"
[providers.live]
base_url = "{provider.url}/v1"
api_key = "provider-test-key"
label = "live provider"
[models]
"demo" = ["dead", "live"]
"""
    )
    origin = origin_factory(PRISM_PROVIDERS_FILE=str(config), PRISM_FALLBACK_TTL="120")
    for stream in (False, True):
        body = {
            **BODY,
            "stream": stream,
            "messages": [{"role": "user", "content": f"failover {stream}"}],
        }
        response = post(origin, api_key, body)
        assert response.status_code == 200
        assert response.headers["x-prism-provider"] == "live provider"
    providers = httpx.get(origin.admin_url + "/healthz").json()["providers"]
    assert providers["dead"]["error_rate"] == 1.0
    assert providers["dead"]["last_error"] == "502 upstream_unreachable"
    assert providers["live"]["error_rate"] == 0.0 and providers["live"]["recent_calls"] == 2
    # a fallback's answers (streamed or not) are kept only briefly
    origin.wait_stored()
    client = redis.Redis.from_url(redis_url)
    try:
        ttls = [client.ttl(key) for key in client.scan_iter("prism:v1:*")]
    finally:
        client.close()
    assert len(ttls) == 2 and all(0 < ttl <= 120 for ttl in ttls)


def test_redis_outage_degrades_to_bypass_and_recovers_without_restart(
    origin_factory: OriginFactory, api_key: str, tmp_path: Path
) -> None:
    server = RedisServer(workdir=tmp_path).start()
    try:
        origin = origin_factory(REDIS_URL=server.url)
        assert post(origin, api_key).headers["x-prism-edge-cache-layer"] == "miss"
        wait_for(lambda: post(origin, api_key).headers["x-prism-edge-cache-layer"] == "redis")
        server.stop()
        down = post(origin, api_key)
        assert down.status_code == 200 and down.headers["x-prism-edge-cache-layer"] == "bypass"
        health = httpx.get(origin.admin_url + "/healthz").json()
        assert health["status"] == "degraded" and health["redis"]["ok"] is False
        assert origin.metric("prism_redis_errors_total", op="lookup") >= 1
        server.start()
        wait_for(lambda: httpx.get(origin.admin_url + "/healthz").json()["status"] == "ok")
        wait_for(
            lambda: post(origin, api_key).headers["x-prism-edge-cache-layer"] in ("miss", "redis")
        )
        wait_for(lambda: post(origin, api_key).headers["x-prism-edge-cache-layer"] == "redis")
    finally:
        server.stop()


def test_a_joined_client_keeps_the_call_alive_when_the_first_one_leaves(
    timed_origin: RunningOrigin, api_key: str, provider: ProviderServer, redis_url: str
) -> None:
    import asyncio

    provider.control.set_fault("stall_mid_stream", seconds=0.4)
    body = {
        "model": "demo",
        "messages": [{"role": "user", "content": "leader leaves"}],
        "stream": True,
    }
    headers = {"authorization": f"Bearer {api_key}"}

    async def run() -> httpx.Response:
        async with httpx.AsyncClient(
            base_url=timed_origin.url, headers=headers, timeout=30
        ) as http:
            async with http.stream("POST", "/v1/chat/completions", json=body) as leader:
                assert leader.status_code == 200
                chunks = leader.aiter_raw()
                assert (await anext(chunks)).startswith(b"data: ")
                follower = asyncio.create_task(
                    http.post("/v1/chat/completions", json={**body, "stream": False})
                )
                await asyncio.to_thread(
                    wait_for,
                    lambda: timed_origin.metric("prism_origin_coalesced_requests_total") >= 1,
                )
            # the leader is gone mid-stream; the follower still gets the whole answer
            return await follower

    follower = asyncio.run(run())
    assert follower.status_code == 200
    assert follower.json()["choices"][0]["finish_reason"] == "stop"
    assert provider.control.stats()["chat_requests"] == 1
    timed_origin.wait_stored()
    assert len(stored_keys(redis_url)) == 1
