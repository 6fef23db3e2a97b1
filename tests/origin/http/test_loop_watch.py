"""The origin's event loop watching itself, on a real origin whose loop a test blocks: the
lag in /metrics, a fast 503 while it keeps lagging (requests in flight finish), and
systemd's watchdog fed from the loop, so its pings stop when the loop does."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx

from deploy.local.provider import ProviderServer
from origin.http.watchdog import SystemdWatchdog
from tests.fixtures.origin import OriginFactory, RunningOrigin
from tests.polling import wait_for

CHAT = {"model": "demo", "messages": [{"role": "user", "content": "loop watch"}]}


@contextmanager
def lagging(origin: RunningOrigin, block: float) -> Iterator[None]:
    """The origin's loop blocked for ``block`` seconds at a time, again and again, with a
    moment between the blocks to take a request or two: a loop that lags, not one that
    is gone."""
    loop = origin.server.loop
    stop = threading.Event()

    def blocked() -> None:
        time.sleep(block)
        if not stop.is_set():
            loop.call_later(0.05, blocked)

    loop.call_soon_threadsafe(blocked)
    try:
        yield
    finally:
        stop.set()


@contextmanager
def blocked(origin: RunningOrigin) -> Iterator[None]:
    """The origin's loop blocked until the block ends."""
    started, release = threading.Event(), threading.Event()

    def block() -> None:
        started.set()
        release.wait(60)

    origin.server.loop.call_soon_threadsafe(block)
    assert started.wait(30)
    try:
        yield
    finally:
        release.set()


def test_a_loop_that_keeps_lagging_refuses_new_requests_with_a_fast_503(
    origin_factory: OriginFactory, api_key: str
) -> None:
    origin = origin_factory(PRISM_LOOP_LAG_LIMIT="0.5")
    assert httpx.get(origin.url + "/healthz").status_code == 200
    with lagging(origin, block=1.5):
        wait_for(lambda: origin.metric("prism_origin_event_loop_lag_seconds") > 0.5, 60)
        refused = wait_for(
            lambda: (r := httpx.post(
                origin.url + "/v1/chat/completions", json=CHAT, timeout=60,
                headers={"authorization": f"Bearer {api_key}"},
            )).status_code == 503 and r,
            timeout=60,
        )  # fmt: skip
        assert refused.headers["retry-after"] == "1"
        assert int(refused.headers["x-prism-origin-busy"]) > 500  # the lag, in ms
        assert refused.headers["x-prism-edge-cache-layer"] == "bypass"  # the origin's own
        assert refused.json()["error"]["code"] == "origin_overloaded"
        # The liveness answer too: a load balancer takes this origin out meanwhile.
        assert httpx.get(origin.url + "/healthz", timeout=60).status_code == 503
        assert origin.metric("prism_origin_loop_lag_refused_total") >= 2
    # Once a tick runs on time, requests are served again.
    wait_for(lambda: httpx.get(origin.url + "/healthz", timeout=60).status_code == 200, 60)
    served = httpx.post(
        origin.url + "/v1/chat/completions",
        json=CHAT,
        headers={"authorization": f"Bearer {api_key}"},
        timeout=60,
    )
    assert served.status_code == 200, served.text


def test_a_request_in_flight_when_the_loop_starts_lagging_finishes(
    origin_factory: OriginFactory, provider: ProviderServer, api_key: str
) -> None:
    origin = origin_factory(PRISM_LOOP_LAG_LIMIT="0.5")
    provider.control.set_fault("stall_before_first_byte", seconds=100)
    headers = {"authorization": f"Bearer {api_key}"}
    url = origin.url + "/v1/chat/completions"
    with ThreadPoolExecutor(1) as pool:
        body = {**CHAT, "messages": [{"role": "user", "content": "in flight"}]}
        sent = pool.submit(httpx.post, url, json=body, headers=headers, timeout=120)
        wait_for(lambda: provider.control.log(), 60)  # it reached the provider
        with lagging(origin, block=1.5):
            wait_for(lambda: httpx.post(url, json=CHAT, headers=headers, timeout=60).status_code
                     == 503, 60)  # fmt: skip
            provider.control.release()
            answered = sent.result(timeout=120)
    assert answered.status_code == 200, answered.text


def test_the_watchdog_is_pinged_from_the_loop_and_not_while_it_is_blocked(
    origin_factory: OriginFactory, tmp_path: Path
) -> None:
    address = str(tmp_path / "notify")
    systemd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    systemd.bind(address)
    systemd.settimeout(30)
    # WatchdogSec=0.4: a ping every 0.2 s at most.
    watchdog = SystemdWatchdog.from_env({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "400000"})
    assert watchdog is not None
    origin = origin_factory(on_loop_tick=watchdog.ping)
    try:
        assert systemd.recv(100) == b"READY=1\nWATCHDOG=1"
        assert systemd.recv(100) == b"WATCHDOG=1"
        with blocked(origin):
            drain(systemd)  # a ping sent just before the block
            systemd.settimeout(2.0)  # five times the watchdog's limit: systemd would act
            try:
                systemd.recv(100)
            except TimeoutError:
                pass
            else:
                raise AssertionError("pinged while the loop was blocked")
            systemd.settimeout(30)
        assert systemd.recv(100) == b"WATCHDOG=1"  # the loop runs again
    finally:
        watchdog.close()
        systemd.close()


def drain(sock: socket.socket) -> None:
    sock.setblocking(False)
    try:
        while True:
            sock.recv(100)
    except BlockingIOError:
        pass
    finally:
        sock.setblocking(True)


def test_the_watchdog_is_only_for_the_process_systemd_named() -> None:
    env = {"NOTIFY_SOCKET": "@/org/freedesktop/systemd1/notify", "WATCHDOG_USEC": "30000000"}
    assert SystemdWatchdog.from_env(env, pid=42) is not None
    assert SystemdWatchdog.from_env({**env, "WATCHDOG_PID": "41"}, pid=42) is None
    assert SystemdWatchdog.from_env({**env, "WATCHDOG_USEC": "0"}, pid=42) is None
    assert SystemdWatchdog.from_env({"WATCHDOG_USEC": "30000000"}, pid=42) is None
