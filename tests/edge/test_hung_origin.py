"""A hung origin costs seconds, not the origin timeout: in the real local Workers runtime,
with real origins whose event loop a test blocks (the socket accepts, nothing answers, as
with a stopped process or a blocked loop).

- With another origin to ask, an answer not started after the probe delay has the origin's
  liveness probed; no answer, and the request goes to the next origin.
- A slow provider behind a live origin is waited for: the probe answers, no failover, one
  provider call.
- A forward the origin reads too late (it expired meanwhile) is signed anew and sent
  again, never passed to the client as a 401.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import pytest

from deploy.edge_bundle import build_edge
from deploy.local.ports import free_port
from deploy.local.provider import ProviderServer, ProviderSettings
from deploy.local.redis import RedisServer
from deploy.local.workers import ExtraWorker, LocalWorkersRuntime
from origin import Settings
from prism.forward import FORWARD_TTL_SECONDS
from tests.fixtures.origin import (
    FORWARD_SECRET,
    KEY_SECRET,
    AccessLines,
    RunningOrigin,
    origin_env,
    serve_origin,
)
from tests.fixtures.workers import KVApi, WorkersRuntimeFactory
from tests.polling import wait_for

CHAT = "/v1/chat/completions"
EUROPE = {"continent": "EU", "country": "DE", "colo": "FRA"}
REGION = "x-prism-origin-region"
# Generous for a loaded machine: a live origin's probe must not time out. The hung one's
# probe takes this long, which is still far from the origin timeout below.
PROBE_AFTER_MS, PROBE_TIMEOUT_MS = 500, 3000
ORIGIN_TIMEOUT_MS = 80_000
# Long, so that only a background recheck (every second) can end an avoidance in a test.
AVOID_SECONDS, RECHECK_SECONDS = 60, 1


@dataclass
class Hung:
    runtime: LocalWorkersRuntime
    us: RunningOrigin  # us-west-1, the far one
    eu: RunningOrigin  # eu-west-1, the nearest to Europe, and the one the tests hang
    provider: ProviderServer

    def url(self, name: str) -> str:
        return self.runtime.extra_urls[name]


@contextmanager
def hung(origin: RunningOrigin) -> Iterator[None]:
    """``origin``'s event loop blocked until the block ends: its listening socket still
    takes connections (the kernel's backlog), nothing is read or answered."""
    blocked, release = threading.Event(), threading.Event()

    def block() -> None:
        blocked.set()
        release.wait(120)

    origin.server.loop.call_soon_threadsafe(block)
    assert blocked.wait(30)
    try:
        yield
    finally:
        release.set()


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory,
    workers_runtime_factory: WorkersRuntimeFactory,
    module_redis: RedisServer,
) -> Iterator[Hung]:
    base = tmp_path_factory.mktemp("hung")
    bundle = build_edge("local", base / "bundle")
    provider = ProviderServer(ProviderSettings()).start()
    ports = {name: free_port() for name in ("us", "eu")}
    at = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    common = {
        "PRISM_KEY_SECRET": KEY_SECRET,
        "PRISM_FORWARD_SECRET": FORWARD_SECRET,
        "PRISM_ORIGIN_TIMEOUT_MS": str(ORIGIN_TIMEOUT_MS),
        "PRISM_ORIGIN_PROBE_AFTER_MS": str(PROBE_AFTER_MS),
        "PRISM_ORIGIN_PROBE_TIMEOUT_MS": str(PROBE_TIMEOUT_MS),
        "PRISM_ORIGIN_AVOID_SECONDS": str(AVOID_SECONDS),
        "PRISM_ORIGIN_RECHECK_SECONDS": str(RECHECK_SECONDS),
    }
    two = {**common, "PRISM_ORIGINS": f"us-west-1={at['us']},eu-west-1={at['eu']}"}
    runtime = workers_runtime_factory(
        None,
        api_token="kv-api-test-token",
        extra_workers=[
            ExtraWorker("two", bundle.root, vars=two, kv_binding="PRISM_KV"),
            # a second edge of the same two: another isolate of the same PoP
            ExtraWorker("two_again", bundle.root, vars=two, kv_binding="PRISM_KV"),
            # the two with no probe: only the origin's own 503 can send a request on
            ExtraWorker(
                "two_unprobed",
                bundle.root,
                vars={**two, "PRISM_ORIGIN_PROBE_AFTER_MS": "0"},
                kv_binding="PRISM_KV",
            ),
            ExtraWorker(
                "one", bundle.root, vars={**common, "ORIGIN_URL": at["eu"]}, kv_binding="PRISM_KV"
            ),
        ],
    )
    kv = KVApi(runtime)
    origins = {
        name: serve_origin(
            Settings.from_env(
                origin_env(
                    module_redis.url,
                    provider.url,
                    **kv.settings(),
                    PRISM_KV_FLUSH_INTERVAL="0.05",
                    PRISM_ACCESS_LOG="on",
                )
            ),
            port,
        )
        for name, port in ports.items()
    }
    try:
        yield Hung(runtime, origins["us"], origins["eu"], provider)
    finally:
        for origin in origins.values():
            origin.server.stop()
        kv.close()
        provider.stop()


@pytest.fixture
def fresh(stack: Hung, api_key: str) -> Hung:
    """The stack with the provider reset and eu-west-1 answering Europe again (a test
    before may have marked it down: a recheck finds it up)."""
    for name in ("two", "two_again", "two_unprobed"):
        wait_for(
            lambda name=name: (
                chat(stack.url(name), api_key)[0].headers.get(REGION)  # type: ignore[misc]
                == "eu-west-1"
            ),
            timeout=120,
            interval=0.2,
        )
    stack.provider.control.reset()
    return stack


def chat(url: str, api_key: str, timeout: float = 120) -> tuple[httpx.Response, float]:
    body = {"model": "demo", "messages": [{"role": "user", "content": secrets.token_hex(8)}]}
    started = time.monotonic()
    response = httpx.post(
        url + CHAT,
        json=body,
        headers={"authorization": f"Bearer {api_key}", "mf-cf-blob": json.dumps(EUROPE)},
        timeout=timeout,
    )
    return response, time.monotonic() - started


def test_a_hung_origin_is_probed_and_the_request_goes_to_the_next_one(
    fresh: Hung, api_key: str
) -> None:
    with hung(fresh.eu):
        response, took = chat(fresh.url("two"), api_key)
        assert response.status_code == 200, response.text
        assert response.headers[REGION] == "us-west-1"
        timing = response.headers["server-timing"]
        assert 'origin-error;desc="eu-west-1"' in timing
        # Far from the origin timeout: the probe told (on a loaded machine, a few seconds).
        assert took < ORIGIN_TIMEOUT_MS / 1000 / 2

        # Marked down: the next request goes straight to the other origin, from this
        # isolate and from another one of the same PoP (the mark is in the PoP's cache).
        for name in ("two", "two_again"):
            response, _ = chat(fresh.url(name), api_key)
            assert response.status_code == 200, response.text
            assert response.headers[REGION] == "us-west-1"
            assert "origin-error" not in response.headers["server-timing"], name


def test_traffic_returns_once_a_background_recheck_finds_the_origin_and_no_request_waits(
    fresh: Hung, api_key: str
) -> None:
    with hung(fresh.eu):
        response, _ = chat(fresh.url("two"), api_key)
        assert response.headers[REGION] == "us-west-1"
    started = time.monotonic()
    answers: list[httpx.Response] = []

    def back() -> bool:
        answers.append(chat(fresh.url("two"), api_key)[0])
        return answers[-1].headers[REGION] == "eu-west-1"

    wait_for(back, timeout=AVOID_SECONDS, interval=0.2)
    # Found by a recheck (every second, after a response), long before the mark passes...
    assert time.monotonic() - started < AVOID_SECONDS / 2
    # ...and no request was the one to find out: none went to eu-west-1 and failed over.
    assert all(response.status_code == 200 for response in answers)
    assert not any("origin-error" in r.headers["server-timing"] for r in answers)


def test_a_slow_provider_behind_a_live_origin_is_waited_for_and_called_once(
    fresh: Hung, api_key: str, access_lines: AccessLines
) -> None:
    fresh.provider.control.set_fault("stall_before_first_byte", seconds=100)
    with ThreadPoolExecutor(1) as pool:
        sent: Future[tuple[httpx.Response, float]] = pool.submit(chat, fresh.url("two"), api_key)
        # The edge probed the origin (answered: it lives) while the provider stalls.
        wait_for(lambda: any(r["path"] == "/healthz" for r in access_lines.records()), 60)
        fresh.provider.control.release()
        response, _ = sent.result(timeout=120)
    assert response.status_code == 200, response.text
    assert response.headers[REGION] == "eu-west-1"
    assert "origin-error" not in response.headers["server-timing"]
    assert len(fresh.provider.control.log()) == 1  # no second call elsewhere


def test_a_forward_read_after_it_expired_is_signed_again_not_refused(
    fresh: Hung, api_key: str
) -> None:
    expired = fresh.eu.metric("prism_origin_forward_rejected_total", reason="expired")
    with ThreadPoolExecutor(1) as pool, hung(fresh.eu):
        sent_at = time.monotonic()
        sent = pool.submit(chat, fresh.url("one"), api_key)
        # Longer than the forward lives (no event to wait for: the signature ages).
        wait_for(lambda: time.monotonic() - sent_at > FORWARD_TTL_SECONDS + 2, 30, 0.1)
    response, _ = sent.result(timeout=120)
    assert response.status_code == 200, response.text
    assert fresh.eu.metric("prism_origin_forward_rejected_total", reason="expired") > expired


def test_an_origin_whose_loop_lags_says_so_and_the_edge_asks_the_next(
    fresh: Hung, api_key: str
) -> None:
    """Its 503 (Retry-After, x-prism-origin-busy) is the origin's own, and yet not final:
    another origin may serve it at once (an edge with no probe, so only that 503 tells)."""
    loop = fresh.eu.server.loop
    stop = threading.Event()

    def block() -> None:  # the loop runs, 1.5 s late each time: past its 1 s limit
        time.sleep(1.5)
        if not stop.is_set():
            loop.call_later(0.05, block)

    loop.call_soon_threadsafe(block)
    try:
        wait_for(lambda: fresh.eu.metric("prism_origin_loop_lag_refused_total") > 0
                 or httpx.get(fresh.eu.url + "/healthz", timeout=60).status_code == 503, 60)  # fmt: skip
        response, _ = chat(fresh.url("two_unprobed"), api_key)
        assert response.status_code == 200, response.text
        assert response.headers[REGION] == "us-west-1"
        assert 'origin-error;desc="eu-west-1"' in response.headers["server-timing"]
    finally:
        stop.set()
