"""`prism origin serve --workers N`: a supervisor and N worker processes on one port, for
real (spawned processes, the test's Redis, the local provider stand-in), and the one
admin view of them all."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import redis

from deploy.local.ports import free_port
from deploy.local.processes import ChildProcess, process_tree
from deploy.local.provider import ProviderServer
from origin.governance.usage import usage_key
from tests.fixtures.origin import origin_env
from tests.fixtures.origin_workers import WorkersOriginFactory, sample_value
from tests.fixtures.stacks import CLI_START
from tests.polling import wait_for
from tests.redis_replies import reply_as

pytestmark = pytest.mark.timeout(300)  # `prism` processes' start-up (CLI_START) on a slow machine

CHAT = "/v1/chat/completions"
REQUESTS = "prism_origin_requests_total"
ADMIN_KEY = "admin-key-0123456789abcdef"


def chat(content: str, **extra: object) -> dict[str, object]:
    return {"model": "demo", "messages": [{"role": "user", "content": content}], **extra}


async def send(
    url: str, key: str, payloads: list[dict[str, object]], at_once: int
) -> list[int | str]:
    """POST each payload on a connection of its own (so the kernel hands each to whichever
    worker accepts first), ``at_once`` in flight: the status, or the error's name."""
    results: list[int | str] = []
    queue = iter(payloads)
    async with httpx.AsyncClient(
        base_url=url,
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
        limits=httpx.Limits(max_keepalive_connections=0),
    ) as http:

        async def sender() -> None:
            for payload in queue:
                try:
                    results.append((await http.post(CHAT, json=payload)).status_code)
                except httpx.HTTPError as error:
                    results.append(type(error).__name__)

        await asyncio.gather(*(sender() for _ in range(at_once)))
    return results


def requests_of(text: str) -> float:
    """Every answered request in one /metrics text."""
    total = 0.0
    for status in ("200",):
        for layer in ("miss", "redis"):
            total += sample_value(
                text, REQUESTS, {"route": "chat", "status": status, "layer": layer}
            )
    return total


def usage_requests(admin: redis.Redis, project: str = "acme") -> int:
    """Requests counted in the project's usage today, every key and model (Redis)."""
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    fields = {
        reply_as(bytes, k).decode(): int(v)
        for k, v in admin.hgetall(usage_key(project, day)).items()
    }
    return sum(count for name, count in fields.items() if name.startswith("requests."))


def test_two_workers_serve_one_port_and_the_admin_port_shows_both(
    workers_origin_factory: WorkersOriginFactory, api_key: str, admin: redis.Redis
) -> None:
    """Requests to one port are answered by both workers (each one's private /metrics has
    some); the admin port's /metrics is exactly their sum per series, /healthz has both
    workers' detail, the usage in Redis counts every request once, and the dashboard is
    served (behind its key) from a worker."""
    origin = workers_origin_factory(2, PRISM_ADMIN_KEY=ADMIN_KEY)
    health = origin.health().json()
    assert health["status"] == "ok" and len(health["workers"]) == 2
    assert {w["answered"] for w in health["workers"]} == {True}
    assert all(w["health"]["providers"]["openai"]["state"] == "healthy" for w in health["workers"])
    workers = origin.worker_admin_urls()
    assert len(set(workers)) == 2 and origin.admin_url not in workers

    payloads = [chat(f"question {i % 20}") for i in range(200)]
    sent = 0

    def both_answered() -> bool:
        nonlocal sent
        results = asyncio.run(send(origin.url, api_key, payloads, 32))
        sent += len(results)
        assert set(results) == {200}
        return all(requests_of(httpx.get(url + "/metrics").text) > 0 for url in workers)

    wait_for(both_answered, timeout=120, interval=0)
    per_worker = [httpx.get(url + "/metrics").text for url in workers]
    merged = origin.metrics()
    for layer in ("miss", "redis"):
        labels = {"route": "chat", "status": "200", "layer": layer}
        counts = [sample_value(text, REQUESTS, labels) for text in per_worker]
        assert sample_value(merged, REQUESTS, labels) == sum(counts)
    assert requests_of(merged) == sent
    durations = "prism_origin_request_duration_seconds_count"
    labels = {"route": "chat", "layer": "redis"}
    assert sample_value(merged, durations, labels) == sum(
        sample_value(text, durations, labels) for text in per_worker
    )
    assert sample_value(merged, "prism_origin_workers") == 2
    lag = "prism_origin_event_loop_lag_seconds"
    assert sample_value(merged, lag) <= max(sample_value(t, lag) for t in per_worker) + 1
    wait_for(lambda: usage_requests(admin) == sent, timeout=10)

    board = httpx.get(origin.admin_url + "/dashboard/latest")
    assert board.status_code == 401
    latest = httpx.get(
        origin.admin_url + "/dashboard/latest", headers={"authorization": f"Bearer {ADMIN_KEY}"}
    )
    assert latest.status_code == 200
    assert latest.json() is None or "requests" in latest.json()  # null until its first sample


def test_a_killed_worker_is_logged_and_restarted_and_only_its_requests_fail(
    workers_origin_factory: WorkersOriginFactory, api_key: str
) -> None:
    """SIGKILL one worker under load (16 in flight): at most the requests it held fail; the
    supervisor logs its exit and starts another, and everything after is answered."""
    origin = workers_origin_factory(2)
    assert asyncio.run(send(origin.url, api_key, [chat("warm")], 1)) == [200]
    victim, survivor = origin.worker_pids()

    async def load_and_kill() -> list[int | str]:
        load = asyncio.create_task(send(origin.url, api_key, [chat("same")] * 600, 16))
        await asyncio.sleep(0.5)  # paced: the kill lands mid-load, not a synchronisation
        os.kill(victim, signal.SIGKILL)
        return await load

    results = asyncio.run(load_and_kill())
    failed = [r for r in results if r != 200]
    assert len(results) == 600 and len(failed) <= 16, failed
    wait_for(lambda: origin.serving() and victim not in origin.worker_pids(), timeout=CLI_START)
    pids = origin.worker_pids()
    assert survivor in pids and len(pids) == 2
    log = origin.process.log_path.read_text()
    assert f"(pid {victim}) died of SIGKILL (exit code -9); restarted as pid" in log
    assert origin.metric("prism_origin_worker_restarts_total") == 1
    after = asyncio.run(send(origin.url, api_key, [chat("after")] * 100, 16))
    assert set(after) == {200}


def test_sighup_replaces_every_worker_one_at_a_time_and_no_request_fails(
    workers_origin_factory: WorkersOriginFactory, api_key: str
) -> None:
    """SIGHUP under load: each worker is replaced by a new one that serves before the old
    one stops (gracefully), so the load sees no failure and both pids are new after."""
    origin = workers_origin_factory(2)
    before = set(origin.worker_pids())

    def replaced() -> bool:
        return origin.serving() and not before & set(origin.worker_pids())

    async def load_and_reload() -> list[int | str]:
        load = asyncio.create_task(send(origin.url, api_key, [chat("reload")] * 400, 8))
        await asyncio.sleep(0.2)  # paced: the reload lands mid-load, not a synchronisation
        origin.process.popen.send_signal(signal.SIGHUP)
        results = await load
        while not await asyncio.to_thread(replaced):  # the load goes on until both are new
            results += await send(origin.url, api_key, [chat("reload")] * 50, 8)
        return results

    results = asyncio.run(asyncio.wait_for(load_and_reload(), CLI_START))
    assert set(results) == {200}
    assert len(origin.worker_pids()) == 2 and origin.process.alive()


def test_sighup_with_a_stream_in_flight_replaces_both_while_the_stream_goes_on(
    workers_origin_factory: WorkersOriginFactory, api_key: str, provider: ProviderServer
) -> None:
    """A stream stalled mid-answer through SIGHUP: both workers are replaced while it is
    still stalled (the supervisor does not wait for the old one's requests), and its old
    worker then finishes it to ``[DONE]``."""
    origin = workers_origin_factory(2)
    before = set(origin.worker_pids())
    provider.control.set_fault("stall_mid_stream", after_chunks=2, seconds=120)
    with (
        httpx.Client(
            base_url=origin.url, headers={"authorization": f"Bearer {api_key}"}, timeout=120
        ) as http,
        http.stream("POST", CHAT, json=chat("a long story", stream=True)) as response,
    ):
        chunks = response.iter_raw()
        received = [next(chunks)]
        wait_for(lambda: provider.control.stats()["open_streams"] == 1)
        origin.process.popen.send_signal(signal.SIGHUP)
        wait_for(lambda: origin.serving() and not before & set(origin.worker_pids()), CLI_START)
        assert provider.control.stats()["open_streams"] == 1  # still stalled
        provider.control.release()
        received.extend(chunks)
    assert b"".join(received).endswith(b"data: [DONE]\n\n")
    assert origin.process.alive()


def test_sigterm_lets_a_stream_in_flight_end_with_done_and_exits_0(
    workers_origin_factory: WorkersOriginFactory, api_key: str, provider: ProviderServer
) -> None:
    """A stream stalled mid-answer when the supervisor gets SIGTERM: its worker waits for
    it, the stream goes on to ``[DONE]`` once the provider goes on, and the instance then
    exits 0."""
    origin = workers_origin_factory(2)
    provider.control.set_fault("stall_mid_stream", after_chunks=2, seconds=60)
    with httpx.Client(
        base_url=origin.url, headers={"authorization": f"Bearer {api_key}"}, timeout=60
    ) as http:
        payload = chat("a long story", stream=True)
        with http.stream("POST", CHAT, json=payload) as response:
            assert response.status_code == 200
            chunks = response.iter_raw()
            received = [next(chunks)]
            assert received[0].startswith(b"data: ")
            wait_for(lambda: provider.control.stats()["open_streams"] == 1)
            origin.process.popen.send_signal(signal.SIGTERM)
            log = origin.process.log_path
            wait_for(lambda: "Waiting for connections to close" in log.read_text(), CLI_START)
            assert origin.process.alive()  # held by the stream in flight
            provider.control.release()
            received.extend(chunks)
    body = b"".join(received)
    assert body.endswith(b"data: [DONE]\n\n")
    assert origin.process.popen.wait(timeout=60) == 0


def test_healthz_is_503_while_a_worker_does_not_answer(
    workers_origin_factory: WorkersOriginFactory,
) -> None:
    """A stopped worker (SIGSTOP: alive, silent) makes the instance's /healthz a 503 that
    names it; the supervisor replaces it once it misses its pings, and /healthz is 200."""
    origin = workers_origin_factory(2)
    stopped = origin.worker_pids()[0]
    os.kill(stopped, signal.SIGSTOP)
    try:
        answer = wait_for(lambda: (r := origin.health()).status_code == 503 and r, timeout=30)
        workers = {w["pid"]: w for w in answer.json()["workers"]}
        assert answer.json()["status"] == "degraded"
        assert workers[stopped]["answered"] is False
        assert [w["answered"] for pid, w in workers.items() if pid != stopped] == [True]
        wait_for(origin.serving, timeout=CLI_START)
        assert stopped not in origin.worker_pids()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stopped, signal.SIGCONT)


def test_under_systemd_the_supervisor_says_ready_once_every_worker_serves_and_pings(
    workers_origin_factory: WorkersOriginFactory, tmp_path: Path
) -> None:
    """With NOTIFY_SOCKET and WATCHDOG_USEC (systemd's Type=notify, WatchdogSec=), the
    supervisor sends READY=1 with its first ping once both workers serve, then WATCHDOG=1;
    the workers send nothing (systemd takes only the main process's, NotifyAccess=main)."""
    address = str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind(address)
        systemd.settimeout(CLI_START)
        origin = workers_origin_factory(2, NOTIFY_SOCKET=address, WATCHDOG_USEC="2000000")
        assert systemd.recv(100) == b"READY=1\nWATCHDOG=1"
        assert len(origin.worker_pids()) == 2  # both served before READY (it answers now)
        assert [systemd.recv(100) for _ in range(3)] == [b"WATCHDOG=1"] * 3  # no other READY


def test_one_worker_is_the_single_process_as_before(
    redis_url: str, provider: ProviderServer, api_key: str, tmp_path: Path
) -> None:
    """--workers 1: no supervisor and no child process; the admin listener is the app's
    own (its /healthz has no workers list) and it serves the API."""
    port, admin_port = free_port(), free_port()
    env = {**origin_env(redis_url, provider.url), "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-m", "deploy.cli", "origin", "serve", "--workers", "1"]
    command += ["--port", str(port), "--admin-port", str(admin_port)]
    process = ChildProcess("origin", command, tmp_path / "origin.log", env)
    try:
        process.wait_http(f"http://127.0.0.1:{admin_port}/healthz", timeout=CLI_START)
        health = httpx.get(f"http://127.0.0.1:{admin_port}/healthz").json()
        assert "workers" not in health and health["status"] == "ok"
        assert asyncio.run(send(f"http://127.0.0.1:{port}", api_key, [chat("one")], 1)) == [200]
        assert process_tree(process.pid) == [process.pid]
    finally:
        process.stop()
    assert process.popen.returncode is not None


def test_workers_default_to_the_cores_this_process_may_use(
    workers_origin_factory: WorkersOriginFactory,
) -> None:
    """Without --workers: one worker per core ``os.sched_getaffinity`` allows."""
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("one core here: the default is the single process")
    origin = workers_origin_factory(None)
    assert len(origin.worker_pids()) == cores
    assert f": {cores} workers" in origin.process.log_path.read_text()
