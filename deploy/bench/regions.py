"""`prism bench regions`: what a second region is worth when the nearest origin is in
trouble, on the `prism dev --regions 2` stack (the local Workers runtime, two origins as
processes, a Redis primary and its replica, the demo provider).

Each outage scenario sends new chat requests (misses) at a fixed rate through the edge,
from a client nearest to us-west-1, for ``duration`` seconds: at ``fault_at`` that origin
is stopped (SIGSTOP: its socket accepts, nothing answers) or killed (SIGKILL), at
``resume_at`` resumed (SIGCONT) or started again. The checks: nearly every request
answered 200; none slower than the probe delay + probe timeout + its normal latency (the
healthy phase's p99) + 1 s; once the outage is detected, the median within 10 % of the
healthy one; traffic back on us-west-1 within a recheck once it answers again (the edge
asks an avoided origin's liveness in the background every ``recheck_seconds``).

The slow scenario has the provider take ``slow_seconds`` for every answer: the origin is
alive (its probe answers), so nothing fails over and the provider is called once per
request.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from deploy.local.ports import free_port
from deploy.local.provider_faults import ProviderControl
from deploy.local.stack import REGIONS, LocalStack, StackConfig

from .loadgen import percentile

__all__ = ["RegionsConfig", "Sample", "run_regions"]

CHAT = "/v1/chat/completions"
NEAR, FAR = REGIONS  # us-west-1, ap-south-1
# A client in North America: us-west-1 is its nearest origin.
_CLIENT_CF = json.dumps({"continent": "NA", "country": "US", "colo": "SJC"})
Fault = Literal["stop", "kill"]


@dataclass(frozen=True, slots=True)
class RegionsConfig:
    rate: float = 10.0  # requests a second
    duration: float = 90.0
    fault_at: float = 20.0
    resume_at: float = 60.0
    probe_after: float = 2.0  # the edge's defaults
    probe_timeout: float = 1.0
    avoid_seconds: float = 30.0
    recheck_seconds: float = 5.0
    slow_seconds: float = 20.0  # the slow provider's answer
    slow_requests: int = 10
    provider_latency_ms: int = 30

    @classmethod
    def quick(cls) -> RegionsConfig:
        """Smoke-sized (the test suite's): the same shape in a fraction of the time."""
        return cls(
            rate=4.0, duration=26.0, fault_at=6.0, resume_at=14.0, avoid_seconds=6.0,
            recheck_seconds=2.0, slow_seconds=5.0, slow_requests=3,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # seconds from the scenario's start
    ms: float
    status: int
    region: str  # who answered ("" when nobody did)
    failed_over: bool  # Server-Timing names an origin that failed first


@dataclass
class Scenario:
    name: str
    samples: list[Sample] = field(default_factory=list)
    fault_at: float | None = None  # None: no outage
    back_at: float | None = None  # when the faulty origin answered again
    checks: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, float | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "fault_at": self.fault_at,
            "back_at": self.back_at,
            "figures": self.figures,
            "checks": self.checks,
            "samples": [asdict(sample) for sample in self.samples],
        }


def _body() -> dict[str, Any]:
    return {"model": "demo", "messages": [{"role": "user", "content": secrets.token_hex(8)}]}


async def _send(http: httpx.AsyncClient, url: str, started: float, samples: list[Sample]) -> None:
    sent = time.monotonic()
    try:
        response = await http.post(url + CHAT, json=_body(), headers={"mf-cf-blob": _CLIENT_CF})
        status, region = response.status_code, response.headers.get("x-prism-origin-region", "")
        failed_over = "origin-error" in response.headers.get("server-timing", "")
    except httpx.HTTPError:
        status, region, failed_over = 0, "", False
    samples.append(
        Sample(sent - started, (time.monotonic() - sent) * 1000, status, region, failed_over)
    )


async def _drive(
    url: str, api_key: str, rate: float, duration: float, events: Mapping[float, Callable[[], None]]
) -> list[Sample]:
    """Open loop: a request every 1/rate seconds whatever the answers take; ``events`` run
    (in a thread: they may wait) at their second."""
    samples: list[Sample] = []
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    async with httpx.AsyncClient(
        headers={"authorization": f"Bearer {api_key}"}, timeout=120, limits=limits
    ) as http:
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        pending: set[asyncio.Task[None]] = set()
        happened: list[asyncio.Future[None]] = []

        def start(event: Callable[[], None]) -> None:
            happened.append(loop.run_in_executor(None, event))

        for at, event in events.items():
            loop.call_later(at, start, event)
        for index in range(int(duration * rate)):
            await asyncio.sleep(max(0.0, started + index / rate - time.monotonic()))
            task = asyncio.ensure_future(_send(http, url, started, samples))
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            await asyncio.wait(pending)
        for done in happened:
            await done  # an event's failure is the bench's
    samples.sort(key=lambda sample: sample.at)
    return samples


def _p50(samples: list[Sample]) -> float | None:
    values = [s.ms for s in samples if s.status == 200]
    return round(statistics.median(values), 1) if values else None


def _check(scenario: Scenario, ok: bool, check: str, detail: str) -> None:
    scenario.checks.append({"check": check, "ok": ok, "detail": detail})


def _judge(scenario: Scenario, config: RegionsConfig, resume_at: float) -> None:
    samples = scenario.samples
    healthy = [s for s in samples if s.at < config.fault_at]
    ok = sum(s.status == 200 for s in samples)
    share = ok / len(samples) if samples else 0.0
    _check(scenario, share >= 0.99, "≥ 99 % answered 200", f"{ok} of {len(samples)}")
    healthy_ms = sorted(s.ms for s in healthy if s.status == 200)
    normal = percentile(healthy_ms, 99) if healthy_ms else 0.0
    bound = (config.probe_after + config.probe_timeout + 1.0) * 1000 + normal
    slowest = max((s.ms for s in samples), default=0.0)
    _check(
        scenario, slowest <= bound, "none slower than probe + its normal latency + 1 s",
        f"slowest {slowest:.0f} ms, bound {bound:.0f} ms (healthy p99 {normal:.0f} ms)",
    )  # fmt: skip
    # Detected: the first request sent after the fault that went straight to the far
    # origin; from then until the origin answers again.
    detected = next(
        (s.at for s in samples if s.at > config.fault_at and s.region == FAR and not s.failed_over),
        None,
    )
    back = scenario.back_at if scenario.back_at is not None else resume_at
    after = [s for s in samples if detected is not None and detected <= s.at < back]
    p50_healthy, p50_after = _p50(healthy), _p50(after)
    within = p50_healthy is not None and p50_after is not None and p50_after <= p50_healthy * 1.1
    _check(
        scenario, within, "p50 once detected within 10 % of healthy",
        f"{p50_after} ms vs {p50_healthy} ms ({len(after)} requests)",
    )  # fmt: skip
    returned = next((s.at for s in samples if s.at >= back and s.region == NEAR), None)
    again = None if returned is None else round(returned - back, 1)
    # A recheck every recheck_seconds, bounded by the probe timeout; the PoP's other
    # isolates read the cleared mark within a second.
    within_s = config.recheck_seconds + config.probe_timeout + 1.0
    _check(
        scenario, again is not None and again <= within_s,
        "back on the nearest origin within a recheck",
        f"{again} s after it answered again (bound {within_s:g} s: recheck every "
        f"{config.recheck_seconds:g} s)",
    )  # fmt: skip
    scenario.figures = {
        "requests": len(samples),
        "ok": ok,
        "healthy_p50_ms": p50_healthy,
        "healthy_p99_ms": round(normal, 1),
        "after_detection_p50_ms": p50_after,
        "slowest_ms": round(slowest, 1),
        "bound_ms": round(bound, 1),
        "detected_after_s": None if detected is None else round(detected - config.fault_at, 1),
        "failed_over": sum(s.failed_over for s in samples),
        "back_on_nearest_after_s": again,
    }


def _outage(stack: LocalStack, config: RegionsConfig, fault: Fault) -> Scenario:
    assert stack.info is not None
    scenario = Scenario(f"nearest origin {'stopped' if fault == 'stop' else 'killed'}")
    scenario.fault_at = config.fault_at
    name = "origin"  # us-west-1's process in the stack
    near_url = stack.info.regions[NEAR]
    clock = {"start": 0.0}

    def hit() -> None:
        pid = stack.pid(name)
        assert pid is not None
        os.kill(pid, signal.SIGSTOP if fault == "stop" else signal.SIGKILL)

    def recover() -> None:
        if fault == "stop":
            pid = stack.pid(name)
            assert pid is not None
            os.kill(pid, signal.SIGCONT)
        else:
            stack.origins.check()  # the exited origin started again
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until it answers: that is "back"
            try:
                if httpx.get(near_url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)  # polling a process we do not control, with a deadline
        scenario.back_at = time.monotonic() - clock["start"]

    clock["start"] = time.monotonic()
    scenario.samples = asyncio.run(
        _drive(
            stack.info.edge_url,
            stack.info.api_key,
            config.rate,
            config.duration,
            {config.fault_at: hit, config.resume_at: recover},
        )
    )
    _judge(scenario, config, config.resume_at)
    scenario.figures["loadavg_1m"] = round(os.getloadavg()[0], 2)
    stack.origins.check()  # what the watch saw meanwhile is not news to the next scenario
    return scenario


def _slow(stack: LocalStack, config: RegionsConfig, provider: ProviderControl) -> Scenario:
    """Every answer takes ``slow_seconds``: no failover, one provider call per request."""
    assert stack.info is not None
    scenario = Scenario(f"provider takes {config.slow_seconds:g} s")
    provider.reset()
    provider.set_fault("stall_before_first_byte", count=-1, seconds=config.slow_seconds)
    try:
        scenario.samples = asyncio.run(
            _drive(stack.info.edge_url, stack.info.api_key, 1.0, config.slow_requests, {})
        )
    finally:
        provider.clear()
    calls = len(provider.log())
    samples = scenario.samples
    ok = sum(s.status == 200 and s.region == NEAR for s in samples)
    failed_over = sum(s.failed_over for s in samples)
    _check(scenario, ok == len(samples), "every request answered by the nearest origin",
           f"{ok} of {len(samples)}")  # fmt: skip
    _check(scenario, failed_over == 0, "no failover", f"{failed_over} failed over")
    _check(scenario, calls == len(samples), "one provider call per request",
           f"{calls} calls for {len(samples)} requests")  # fmt: skip
    scenario.figures = {
        "requests": len(samples),
        "ok": ok,
        "p50_ms": _p50(samples),
        "failed_over": failed_over,
        "provider_calls": calls,
    }
    return scenario


def run_regions(
    config: RegionsConfig, on_step: Callable[[str], None] = lambda step: None
) -> dict[str, Any]:
    """Start the two-region stack, run the scenarios, stop it; the result as JSON data."""
    with tempfile.TemporaryDirectory(prefix="prism-regions-") as state:
        provider_port = free_port()
        stack = LocalStack(
            StackConfig(
                state_dir=Path(state),
                origin_port=free_port(),
                edge_port=free_port(),
                kv_api_port=free_port(),
                provider_port=provider_port,
                env={k: v for k, v in os.environ.items() if k not in _ELSEWHERE},
                regions=2,
                provider_args=("--latency-ms", str(config.provider_latency_ms)),
                edge_env={
                    "PRISM_ORIGIN_PROBE_AFTER_MS": f"{config.probe_after * 1000:g}",
                    "PRISM_ORIGIN_PROBE_TIMEOUT_MS": f"{config.probe_timeout * 1000:g}",
                    "PRISM_ORIGIN_AVOID_SECONDS": f"{config.avoid_seconds:g}",
                    "PRISM_ORIGIN_RECHECK_SECONDS": f"{config.recheck_seconds:g}",
                },
            )
        )
        on_step("starting the two-region stack")
        stack.start()
        provider = ProviderControl(f"http://127.0.0.1:{provider_port}")
        try:
            scenarios = []
            faults: tuple[Fault, ...] = ("stop", "kill")
            for fault in faults:
                on_step(f"{config.rate:g} req/s for {config.duration:g} s, us-west-1 {fault}")
                scenarios.append(_outage(stack, config, fault))
            on_step(f"{config.slow_requests} requests, {config.slow_seconds:g} s at the provider")
            scenarios.append(_slow(stack, config, provider))
        finally:
            provider.close()
            stack.stop()
    return {
        "config": asdict(config),
        "cores": os.cpu_count() or 0,
        "scenarios": [scenario.to_dict() for scenario in scenarios],
        "ok": all(check["ok"] for s in scenarios for check in s.checks),
    }


# What would point the stack at real providers or another Redis.
_ELSEWHERE = frozenset({"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "PRISM_PROVIDERS_FILE", "REDIS_URL"})
