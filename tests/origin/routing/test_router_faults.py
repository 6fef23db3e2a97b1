"""The router over real HTTP: the origin, a real Redis and real provider stand-ins."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from deploy.local.asgi_thread import ThreadedServer
from deploy.local.provider import ProviderServer, ProviderSettings
from tests.fixtures.origin import OriginFactory, RunningOrigin
from tests.polling import wait_for

_bodies = itertools.count()


def body(stream: bool = False) -> dict[str, object]:
    """A new question each time, so no answer comes from the cache."""
    content = f"router fault {next(_bodies)}"
    return {"model": "demo", "messages": [{"role": "user", "content": content}], "stream": stream}


def post(origin: RunningOrigin, api_key: str, data: dict[str, object]) -> httpx.Response:
    return httpx.post(
        origin.url + "/v1/chat/completions",
        json=data,
        headers={"authorization": f"Bearer {api_key}"},
        timeout=30,
    )


def health(origin: RunningOrigin) -> dict[str, dict[str, object]]:
    providers: dict[str, dict[str, object]] = httpx.get(origin.admin_url + "/healthz").json()[
        "providers"
    ]
    return providers


@pytest.fixture
def second(provider_factory: Callable[[ProviderSettings], ProviderServer]) -> ProviderServer:
    return provider_factory(ProviderSettings())


@pytest.fixture
def start_origin(origin_factory: OriginFactory, tmp_path: Path) -> Callable[[str], RunningOrigin]:
    def start(toml: str) -> RunningOrigin:
        path = tmp_path / "providers.toml"
        path.write_text(toml)
        return origin_factory(PRISM_PROVIDERS_FILE=str(path))

    return start


def two_providers(first: str, second: str, extra: str = "", route: str = "") -> str:
    return f"""
[providers.first]
base_url = "{first}/v1"
api_key = "provider-test-key"
label = "first provider"
{extra}
[providers.second]
base_url = "{second}/v1"
api_key = "provider-test-key"
label = "second provider"
[models]
{route or '"demo" = ["first", "second"]'}
"""


class SilentProvider:
    """An OpenAI-compatible provider that sends its headers, then nothing, and notices
    when the gateway hangs up. (The stand-in has no such fault.)"""

    def __init__(self, error: dict[str, object] | None = None) -> None:
        self.hung_up = threading.Event()
        self.calls = 0
        self._error = error

        async def chat(request: Request) -> Response:
            self.calls += 1
            await request.body()
            if self._error is not None:
                return Response(orjson.dumps({"error": self._error}), 400)

            async def silence() -> AsyncIterator[bytes]:
                try:
                    yield b""  # the status line and headers go out; no event follows
                    await asyncio.sleep(60)
                finally:
                    self.hung_up.set()

            return StreamingResponse(silence(), media_type="text/event-stream")

        app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
        self.server = ThreadedServer(app, lifespan="off", graceful_shutdown=1)


@pytest.fixture
def silent() -> Iterator[SilentProvider]:
    provider = SilentProvider()
    provider.server.start()
    yield provider
    provider.server.stop()


# ---------------------------------------------------------------- retry and failover


def test_a_500_is_retried_once_then_the_next_provider_answers(
    start_origin: Callable[[str], RunningOrigin],
    api_key: str,
    provider: ProviderServer,
    second: ProviderServer,
) -> None:
    origin = start_origin(two_providers(provider.url, second.url))
    provider.control.set_fault("status", status=500, count=2)
    response = post(origin, api_key, body())
    assert response.status_code == 200
    assert response.headers["x-prism-provider"] == "second provider"
    assert provider.control.stats()["chat_requests"] == 2  # the call and its one retry
    assert (
        origin.metric("prism_provider_attempts_total", provider="first", outcome="server_error")
        == 2
    )
    assert origin.metric("prism_provider_attempts_total", provider="second", outcome="ok") == 1


def test_a_429_fails_over_at_once_instead_of_waiting(
    start_origin: Callable[[str], RunningOrigin],
    api_key: str,
    provider: ProviderServer,
    second: ProviderServer,
) -> None:
    origin = start_origin(two_providers(provider.url, second.url))
    provider.control.set_fault("rate_limit", retry_after=2)
    response = post(origin, api_key, body(stream=True))
    assert response.status_code == 200
    assert response.headers["x-prism-provider"] == "second provider"
    assert response.text.endswith("data: [DONE]\n\n")
    assert provider.control.stats()["chat_requests"] == 1
    assert (
        origin.metric("prism_provider_attempts_total", provider="first", outcome="rate_limited")
        == 1
    )


# ---------------------------------------------------------------- the health gate


def test_a_failing_provider_is_demoted_skipped_and_restored_by_probes(
    start_origin: Callable[[str], RunningOrigin],
    api_key: str,
    provider: ProviderServer,
    second: ProviderServer,
) -> None:
    origin = start_origin(two_providers(provider.url, second.url, extra="retries = 0"))
    provider.control.set_fault("status", status=500, count=-1)
    for _ in range(3):
        assert post(origin, api_key, body()).headers["x-prism-provider"] == "second provider"
    first = health(origin)["first"]
    assert first["state"] == "demoted"
    assert "3 failures in a row (last: 502 bad_gateway)" in str(first["reason"])
    targets = first["targets"]
    assert isinstance(targets, dict) and targets["demo"]["state"] == "demoted"
    assert origin.metric("prism_provider_state", provider="first") == 2
    # while demoted it sees one probe a second at most, not the traffic
    before, started = provider.control.stats()["chat_requests"], time.monotonic()
    for _ in range(10):
        assert post(origin, api_key, body()).headers["x-prism-provider"] == "second provider"
    probes = provider.control.stats()["chat_requests"] - before
    assert probes <= 1 + int(time.monotonic() - started)
    # it recovers: probes (one a second, live requests) find it well and restore it
    provider.control.clear()
    wait_for(
        lambda: (
            post(origin, api_key, body()).headers["x-prism-provider"] == "first provider"
            and health(origin)["first"]["state"] == "healthy"
        )
    )
    assert origin.metric("prism_provider_state", provider="first") == 0
    assert post(origin, api_key, body()).headers["x-prism-provider"] == "first provider"


# ---------------------------------------------------------------- the first byte


def test_headers_then_silence_fail_over_before_the_client_sees_a_byte(
    start_origin: Callable[[str], RunningOrigin],
    api_key: str,
    silent: SilentProvider,
    second: ProviderServer,
) -> None:
    extra = "first_token_timeout = 0.3\nhedge = false"
    origin = start_origin(two_providers(silent.server.url, second.url, extra=extra))
    response = post(origin, api_key, body(stream=True))
    assert response.status_code == 200
    assert response.headers["x-prism-provider"] == "second provider"
    assert response.text.endswith("data: [DONE]\n\n")
    assert silent.hung_up.wait(5)  # its connection was closed, not left open
    assert health(origin)["first"]["last_error"] == "504 upstream_timeout"


def test_a_slow_first_byte_is_hedged_and_only_the_winner_answers(
    start_origin: Callable[[str], RunningOrigin],
    api_key: str,
    silent: SilentProvider,
    second: ProviderServer,
) -> None:
    extra = "hedge_delay = 0.05"
    origin = start_origin(two_providers(silent.server.url, second.url, extra=extra))
    response = post(origin, api_key, body(stream=True))
    assert response.status_code == 200
    assert response.headers["x-prism-provider"] == "second provider"
    assert silent.hung_up.wait(5)  # the loser's connection closed at once
    assert origin.metric("prism_provider_hedges_total", provider="second") == 1
    assert (
        origin.metric("prism_provider_attempts_total", provider="first", outcome="cancelled") == 1
    )
    assert second.control.stats()["chat_requests"] == 1


def test_a_stalled_complete_call_is_hedged(
    start_origin: Callable[[str], RunningOrigin],
    api_key: str,
    provider: ProviderServer,
    second: ProviderServer,
) -> None:
    origin = start_origin(two_providers(provider.url, second.url, extra="hedge_delay = 0.05"))
    provider.control.set_fault("stall_before_first_byte", seconds=5)
    response = post(origin, api_key, body())
    assert response.status_code == 200
    assert response.headers["x-prism-provider"] == "second provider"
    assert response.json()["choices"][0]["finish_reason"] == "stop"
    assert origin.metric("prism_provider_hedges_total", provider="second") == 1


# ---------------------------------------------------------------- errors keep their meaning


def test_a_providers_400_reaches_the_client_with_its_code_type_and_param(
    start_origin: Callable[[str], RunningOrigin], api_key: str, second: ProviderServer
) -> None:
    refusing = SilentProvider(
        error={
            "message": "Your request was rejected by the safety system.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "content_policy_violation",
        }
    )
    with refusing.server:
        origin = start_origin(two_providers(refusing.server.url, second.url))
        response = post(origin, api_key, body())
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "content_policy_violation"
    assert error["param"] == "messages" and error["type"] == "invalid_request_error"
    assert "rejected by the safety system" in error["message"]
    assert "provider-test-key" not in response.text
    assert refusing.calls == 1 and second.control.stats()["chat_requests"] == 0


CONTEXT_MESSAGE = "This model's maximum context length is 128000 tokens."


def test_context_length_exceeded_passes_through_without_a_context_fallback(
    start_origin: Callable[[str], RunningOrigin],
    api_key: str,
    provider: ProviderServer,
    second: ProviderServer,
) -> None:
    origin = start_origin(two_providers(provider.url, second.url))
    provider.control.set_fault("status", status=400, message=CONTEXT_MESSAGE)
    response = post(origin, api_key, body())
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert provider.control.stats()["chat_requests"] == 1
    assert second.control.stats()["chat_requests"] == 0


def test_context_length_exceeded_goes_to_the_routes_context_fallback(
    start_origin: Callable[[str], RunningOrigin],
    api_key: str,
    provider: ProviderServer,
    second: ProviderServer,
) -> None:
    route = '"demo" = { targets = ["first:gpt-4o-mini"], context_fallback = "second:gpt-4o" }'
    origin = start_origin(two_providers(provider.url, second.url, route=route))
    provider.control.set_fault("status", status=400, message=CONTEXT_MESSAGE)
    response = post(origin, api_key, body())
    assert response.status_code == 200
    assert response.headers["x-prism-provider"] == "second provider"
    (sent,) = second.control.requests()
    assert sent["body"]["model"] == "gpt-4o"
