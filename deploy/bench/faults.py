"""`prism bench faults`: the origin's failover under a sick provider, scenario by scenario.

Real parts over real sockets: a private Redis, two local provider stand-ins
(``primary`` and ``secondary``, each its own process) and the origin (``prism origin
serve``), routed by a providers file: ``"bench-model" = ["primary", "secondary"]``.
Each scenario gets a fresh origin, so what its router learnt in one scenario does not
leak into the next; the healthy baseline always runs first. In each, the primary
misbehaves as the scenario says (faults queued through ``/_control/faults``), the
secondary stays healthy, and every client request is recorded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import os
import secrets
import shutil
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.local.ports import free_port
from deploy.local.processes import ChildStartError
from deploy.local.provider import ProviderControl
from deploy.local.redis import RedisServer, find_redis_server
from prism import parse_key_secrets

from .fault_load import BENCH_MODEL, LoadPlan, open_client, run_requests
from .fault_metrics import RECORD_FIELDS, RequestRecord, evaluate, summarize
from .fault_scenarios import DEFAULT_SCENARIOS, SCENARIOS, FaultScenario
from .machine import load_average, machine_info, versions
from .servers import BenchError, HelperServer

__all__ = ["FaultBenchConfig", "FaultBenchRunner", "ProgressHook", "providers_toml"]

PRIMARY, SECONDARY = "primary", "secondary"
MAX_REQUESTS = 20_000
# (scenario, requests done, requests in the scenario)
ProgressHook = Callable[[str, int, int], None]

_SCRUBBED_ENV = (
    "OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "PRISM_PROVIDERS_FILE",
    "REDIS_URL", "PRISM_REDIS_URL", "PRISM_KV_ACCOUNT_ID", "PRISM_KV_NAMESPACE_ID",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class FaultBenchConfig:
    requests: int = 2000  # per scenario
    concurrency: int = 16
    scenarios: tuple[str, ...] = DEFAULT_SCENARIOS
    hedge_delay: float = 0.25  # the router's hedge delay the TTFB target assumes (seconds)
    outage_lead: float = 3.0  # healthy seconds before the outage starts
    outage_seconds: float = 10.0
    recovery_seconds: float = 30.0  # measured after the outage ends
    provider_latency_ms: float = 20.0  # each stand-in's time to first byte when healthy
    request_timeout: float = 30.0  # the client gives up on a request after this
    warmup_requests: int = 32  # unrecorded, before each scenario (connection pools)
    seed: int = 1  # for the stand-ins' probabilistic faults
    origin_env: Mapping[str, str] = field(default_factory=dict)  # e.g. router settings
    # Extra keys for both [providers.*] tables: name -> TOML value ("0.25", '"fast"').
    provider_settings: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = [name for name in self.scenarios if name not in SCENARIOS]
        if unknown:
            raise BenchError(
                f"unknown scenario {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}"
            )
        if self.requests < 1 or self.concurrency < 1:
            raise BenchError("--requests and --concurrency must be at least 1")
        if self.requests > MAX_REQUESTS:
            # Each stand-in logs a bounded number of requests, failovers included.
            raise BenchError(f"--requests is at most {MAX_REQUESTS:,} per scenario")
        for name, value in self.provider_settings.items():
            try:
                tomllib.loads(f"{name} = {value}")
            except tomllib.TOMLDecodeError:
                raise BenchError(f"provider setting {name} = {value} is not TOML") from None
        # The baseline first, always: the time-to-first-byte targets are relative to it.
        ordered = ("healthy", *(s for s in dict.fromkeys(self.scenarios) if s != "healthy"))
        object.__setattr__(self, "scenarios", ordered)

    @classmethod
    def smoke(cls, scenarios: tuple[str, ...] = ("healthy", "outage")) -> FaultBenchConfig:
        """A few seconds per scenario: proves the harness, measures nothing (the test suite)."""
        return cls(requests=40, concurrency=4, scenarios=scenarios, outage_lead=0.5,
                   outage_seconds=1.5, recovery_seconds=1.5, warmup_requests=4)  # fmt: skip

    @property
    def outage_rate(self) -> float:
        """Requests per second in the outage scenario: spread over its whole timeline."""
        span = self.outage_lead + self.outage_seconds + self.recovery_seconds
        return self.requests / span


@dataclass
class _ScenarioRun:
    records: list[RequestRecord]
    stats: dict[str, dict[str, Any]]
    arrivals: dict[str, list[float]]
    outage: tuple[float, float] | None
    wall_seconds: float


def providers_toml(
    urls: Mapping[str, str], settings: Mapping[str, str], resume: bool = False
) -> str:
    """The origin's providers file: ``bench-model`` → primary, then secondary (which can
    continue a partial answer when ``resume``)."""
    extra = "".join(f"{name} = {value}\n" for name, value in settings.items())
    tables = "".join(
        f'[providers.{name}]\nkind = "openai"\nbase_url = "{url}/v1"\n'
        f'api_key = "bench-{name}"\n{extra}'
        + ('continuation = "continue_final_message"\n' if resume and name == SECONDARY else "")
        + "\n"
        for name, url in urls.items()
    )
    return tables + f'[models]\n"{BENCH_MODEL}" = ["{PRIMARY}", "{SECONDARY}"]\n'


class FaultBenchRunner:
    """``FaultBenchRunner(config, on_progress).run()`` → the result dict (the JSON file)."""

    def __init__(self, config: FaultBenchConfig, on_progress: ProgressHook | None = None) -> None:
        self.config = config
        self._on_progress = on_progress or (lambda name, done, total: None)
        self._state = Path(tempfile.mkdtemp(prefix="prism-bench-faults-"))
        self._logs = self._state / "logs"
        self._logs.mkdir()
        self._redis: RedisServer | None = None
        self._providers: dict[str, HelperServer] = {}
        self._controls: dict[str, ProviderControl] = {}
        self._urls: dict[str, str] = {}
        self._nonce = secrets.token_hex(4)
        self._key_secret = secrets.token_urlsafe(32)
        self._env: dict[str, str] = {}

    def run(self) -> dict[str, Any]:
        started = dt.datetime.now(dt.UTC)
        load_before = load_average()
        try:
            self._start()
            scenarios = {name: self._scenario(SCENARIOS[name]) for name in self.config.scenarios}
        finally:
            self._stop()
        finished = dt.datetime.now(dt.UTC)
        config = dataclasses.asdict(self.config)
        config["origin_env"] = sorted(self.config.origin_env)  # names only: values may be secret
        result: dict[str, Any] = {
            "meta": {
                "kind": "faults",
                "started_at": started.isoformat(timespec="seconds"),
                "finished_at": finished.isoformat(timespec="seconds"),
                "wall_seconds": round((finished - started).total_seconds(), 1),
                "load_average": {"before": load_before, "after": load_average()},
                "machine": machine_info(),
                "versions": versions(find_redis_server(), None, None),
                "config": config,
                "record_fields": list(RECORD_FIELDS),
            },
            "hedge_delay_s": self.config.hedge_delay,
            "scenarios": scenarios,
        }
        result["targets"] = [row.as_dict() for row in evaluate(result)]
        return result

    # ------------------------------------------------------------------ processes

    def _start(self) -> None:
        try:
            self._redis = RedisServer(workdir=self._state).start()
        except (FileNotFoundError, RuntimeError, TimeoutError) as error:
            raise BenchError(f"cannot start Redis: {error}") from None
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        latency = str(self.config.provider_latency_ms)
        for name in (PRIMARY, SECONDARY):
            port = free_port()
            args = [sys.executable, "-m", "deploy.local.provider", "--port", str(port),
                    "--latency-ms", latency]  # fmt: skip
            server = HelperServer(name, args, self._logs / f"{name}.log", env)
            self._providers[name] = server
            url = f"http://127.0.0.1:{port}"
            try:
                server.wait_http(url + "/v1/models")
            except ChildStartError as error:
                raise BenchError(str(error)) from None
            self._controls[name] = ProviderControl(url)
            self._urls[name] = url
        self._env = env | {
            "PRISM_KEY_SECRET": self._key_secret,
            "PRISM_FORWARD_SECRET": secrets.token_urlsafe(32),
            "REDIS_URL": self._redis.url,
            **self.config.origin_env,
        }

    def _start_origin(self, name: str, resume: bool = False) -> tuple[HelperServer, str]:
        providers_file = self._state / f"providers-{name}.toml"
        providers_file.write_text(providers_toml(self._urls, self.config.provider_settings, resume))
        port = free_port()
        origin = HelperServer(
            "origin",
            [
                *(sys.executable, "-m", "deploy.cli", "origin", "serve"),
                *("--port", str(port), "--admin-port", str(free_port()), "--workers", "1"),
            ],
            self._logs / f"origin-{name}.log",
            self._env | {"PRISM_PROVIDERS_FILE": str(providers_file)},
        )
        url = f"http://127.0.0.1:{port}"
        try:
            origin.wait_http(url + "/healthz")
        except ChildStartError as error:
            origin.stop()
            raise BenchError(str(error)) from None
        return origin, url

    def _stop(self) -> None:
        for control in self._controls.values():
            control.close()
        self._controls.clear()
        for server in self._providers.values():
            server.stop()
        self._providers.clear()
        if self._redis is not None:
            self._redis.stop()
            self._redis = None
        shutil.rmtree(self._state, ignore_errors=True)

    # ------------------------------------------------------------------ scenarios

    def _scenario(self, scenario: FaultScenario) -> dict[str, Any]:
        cfg = self.config
        origin, url = self._start_origin(scenario.name, scenario.resume)
        try:
            run = asyncio.run(self._drive(scenario, url))
        finally:
            origin.stop()
            self._controls[PRIMARY].clear()
        summary = summarize(
            run.records,
            run.stats,
            primary=PRIMARY,
            outage=run.outage,
            primary_arrivals=run.arrivals[PRIMARY],
        )
        return {
            "description": scenario.description,
            "fault": scenario.fault,
            "resume": scenario.resume,
            "api": scenario.api,
            "requests": cfg.requests,
            "concurrency": cfg.concurrency,
            "rate_per_s": round(cfg.outage_rate, 2) if scenario.outage else None,
            "wall_seconds": round(run.wall_seconds, 2),
            "summary": summary,
            "upstream": run.stats,
            "records": [r.to_row() for r in run.records],
            "arrivals": {name: [round(t, 4) for t in ts] for name, ts in run.arrivals.items()},
        }

    async def _drive(self, scenario: FaultScenario, url: str) -> _ScenarioRun:
        cfg = self.config
        key = parse_key_secrets(self._key_secret).mint("bench")
        plan = LoadPlan(
            url=url,
            headers={"authorization": f"Bearer {key}"},
            requests=cfg.requests,
            concurrency=cfg.concurrency,
            label=f"{self._nonce}-{scenario.name}",
            rate=cfg.outage_rate if scenario.outage else None,
            timeout=cfg.request_timeout,
            api=scenario.api,
        )
        primary = self._controls[PRIMARY]
        async with open_client(plan) as client:
            if cfg.warmup_requests:
                warm = dataclasses.replace(
                    plan, requests=cfg.warmup_requests, label=plan.label + "-warm", rate=None
                )
                await run_requests(warm, client=client)
            for control in self._controls.values():
                await asyncio.to_thread(control.reset)
            if scenario.fault is not None:
                await asyncio.to_thread(
                    lambda: primary.set_fault(count=-1, seed=cfg.seed, **scenario.fault or {})
                )
            began, wall_began = time.monotonic(), time.time()
            window: list[float] = []
            controller = (
                asyncio.create_task(self._outage(began, window)) if scenario.outage else None
            )
            try:
                records = await run_requests(
                    plan,
                    began=began,
                    client=client,
                    on_done=lambda done: self._on_progress(scenario.name, done, cfg.requests),
                )
            finally:
                if controller is not None:
                    await controller
            wall = time.monotonic() - began
        stats: dict[str, dict[str, Any]] = {}
        arrivals: dict[str, list[float]] = {}
        for name, control in self._controls.items():
            snapshot = await asyncio.to_thread(control.stats)
            snapshot.pop("pending_faults", None)
            snapshot.pop("pending_model_faults", None)
            stats[name] = snapshot
            log = await asyncio.to_thread(control.log)
            if len(log) < snapshot["chat_requests"]:
                # The stand-in keeps a bounded log: a timeline with holes would mislead.
                raise BenchError(
                    f"{name} logged {len(log)} of {snapshot['chat_requests']} requests; "
                    "use fewer --requests per scenario"
                )
            arrivals[name] = [entry["t"] - wall_began for entry in log]
        outage = (window[0], window[1]) if len(window) == 2 else None
        return _ScenarioRun(records, stats, arrivals, outage, wall)

    async def _outage(self, began: float, window: list[float]) -> None:
        """503 on every primary request from ``outage_lead`` for ``outage_seconds``."""
        cfg, primary = self.config, self._controls[PRIMARY]
        await asyncio.sleep(max(0.0, began + cfg.outage_lead - time.monotonic()))
        window.append(time.monotonic() - began)
        await asyncio.to_thread(lambda: primary.set_fault("status", count=-1, status=503))
        ends = began + cfg.outage_lead + cfg.outage_seconds
        await asyncio.sleep(max(0.0, ends - time.monotonic()))
        window.append(time.monotonic() - began)
        await asyncio.to_thread(primary.clear)
