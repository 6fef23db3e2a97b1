"""Provider faults, client aborts and Redis outages: the right error, nothing stored, no crash."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import redis

from deploy.local.provider import ProviderServer
from deploy.local.redis import RedisServer
from tests.fixtures.origin import OriginFactory, RunningOrigin
from tests.polling import wait_for

BODY = {"model": "demo", "messages": [{"role": "user", "content": "fault test"}]}


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


def post(
    origin: RunningOrigin, api_key: str, body: dict[str, object] = BODY, **kw: object
) -> httpx.Response:
    return httpx.post(
        origin.url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {api_key}"},
        timeout=30,
        **kw,  # type: ignore[arg-type]
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
    params: dict[str, object],
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


@pytest.mark.parametrize("mode", ["truncated_stream", "stall_mid_stream", "malformed_json"])
def test_broken_stream_ends_with_an_error_event_and_stores_nothing(
    timed_origin: RunningOrigin, api_key: str, provider: ProviderServer, redis_url: str, mode: str
) -> None:
    provider.control.set_fault(mode, seconds=3)
    response = post(timed_origin, api_key, {**BODY, "stream": True})
    assert response.status_code == 200  # the stream had started
    assert "data: [DONE]" not in response.text
    assert '"error"' in response.text.splitlines()[-2]
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
    origin = origin_factory(PRISM_PROVIDERS_FILE=str(config))
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
