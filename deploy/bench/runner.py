"""`prism bench`: every layer of the stack against its floor, in one run, on loopback.

One process tree: the local stack, the floors and the load generator's ceiling
(``deploy.bench.bench_stack``). Each measured row is paired with its floor and run
next to it in time, so load from elsewhere on the machine hits both alike.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from deploy.local.processes import process_tree
from deploy.local.redis import find_redis_server
from deploy.local.workers import find_node_toolchain
from deploy.policy_store import PolicyStore
from prism import Budget, RateLimits

from .bench_stack import KV_FLUSH, BenchContext, BenchStack, Step
from .ladder import measure_ladder
from .loadgen import FALLBACK_TOOL, UNIQUE, LoadSpec, run_load, wrk_path, wrk_version
from .machine import CpuClock, load_average, machine_info, rss_mb, versions
from .probes import StreamTarget, measure_ttfb
from .profiler import PySpy, find_py_spy
from .replication import measure_replication, wait_writer_idle
from .servers import BenchError, RssSampler
from .targets import evaluate_targets
from .workload import CHAT_PATH, chat_body

__all__ = ["BenchConfig", "BenchError", "BenchRunner"]

# The rate-limited hit row: limits high enough never to refuse, both a project and a
# per-key one, so the row measures the whole check riding in the lookup script.
_BENCH_LIMITS = RateLimits.from_dict({"project": {"rpm": 1_000_000}, "key": {"rpm": 1_000_000}})
_BENCH_BUDGET = Budget(usd=1_000_000, period="day")


@dataclass(frozen=True, slots=True)
class BenchConfig:
    duration: float = 10.0  # seconds per timed run
    warmup: float = 2.0  # seconds of unrecorded load before each target (0: none)
    stream_requests: int = 200  # streamed requests per target for time to first byte
    concurrency: tuple[int, ...] = (1, 32)
    profile: bool = False  # extra, unmeasured runs: the edge ladder and py-spy on the origin
    profile_dir: Path | None = None  # where py-spy's collapsed stacks are kept (None: dropped)
    quick: bool = False

    @classmethod
    def smoke(cls, duration: float = 1.0) -> BenchConfig:
        """The smallest run that still exercises every section (for the test suite)."""
        return cls(duration=duration, warmup=0.0, stream_requests=8, quick=True)


class BenchRunner:
    """``BenchRunner(config, on_step).run()`` → the result dict (also what the JSON holds)."""

    def __init__(self, config: BenchConfig, on_step: Step | None = None) -> None:
        self.config = config
        self._on_step = on_step or (lambda label: None)
        self._state = Path(tempfile.mkdtemp(prefix="prism-bench-"))
        self._nonce = secrets.token_hex(4)
        self._runs = 0
        self._stack = BenchStack(
            self._state, self._nonce, ladder=config.profile, on_step=self._on_step
        )

    @property
    def _ladder_rounds(self) -> int:
        return 1 if self.config.quick else 3

    @property
    def total_steps(self) -> int:
        """How many times ``on_step`` will be called (for a progress bar)."""
        # floor, redis-py floor, hit, rate-limited hit, provider, miss: at every concurrency
        origin_rows = 6 * len(self.config.concurrency)
        profile = 3 + self._ladder_rounds if self.config.profile else 0
        # start, checks, ceiling, 4 edge rows, origin rows, streaming, KV drain, profile
        return 3 + 4 + origin_rows + 1 + 1 + profile

    # ------------------------------------------------------------------ lifecycle

    def run(self) -> dict[str, Any]:
        started = dt.datetime.now(dt.UTC)
        load_before = load_average()
        try:
            result = self._run()
        finally:
            self._stop()
        result["meta"].update(
            started_at=started.isoformat(timespec="seconds"),
            finished_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            wall_seconds=round((dt.datetime.now(dt.UTC) - started).total_seconds(), 1),
            load_average={"before": load_before, "after": load_average()},
        )
        result["targets"] = evaluate_targets(result)
        return result

    def _stop(self) -> None:
        self._stack.stop()
        shutil.rmtree(self._state, ignore_errors=True)

    def _timed(
        self, spec: LoadSpec, server_pids: list[int], rss: RssSampler | None = None
    ) -> dict[str, Any]:
        self._runs += 1
        spec = replace(spec, nonce=f"{self._nonce}r{self._runs}")
        if self.config.warmup > 0:
            run_load(replace(spec, duration=self.config.warmup, nonce=spec.nonce + "w"))
        clock = CpuClock([p for pid in server_pids for p in process_tree(pid)]).start()
        if rss is not None:
            rss.active = True
        try:
            result = run_load(spec)
        finally:
            if rss is not None:
                rss.active = False
        row = result.to_dict()
        seconds = result.duration_s or 1.0
        row["server_cpu_pct"] = round(100 * clock.stop() / seconds, 1)
        row["loadgen_cpu_pct"] = round(100 * result.loadgen_cpu_s / seconds, 1)
        return row

    def _run(self) -> dict[str, Any]:
        ctx = self._stack.start()
        layers = self._stack.check_paths(ctx)
        # Idle: started, and each path answered once, before any load.
        idle_rss = rss_mb(ctx.pids["origin"])
        high = max(self.config.concurrency)
        self._on_step(f"load generator ceiling (constant Node server, c{high})")
        ceiling = self._timed(
            self._spec(ctx.urls["ceiling"], ctx.hit_body, ctx.auth, high), [ctx.pids["ceiling"]]
        )
        edge = self._edge(ctx)
        edge["layers"] = {"kv_hit": layers["edge_hit"], "bad_key_status": layers["bad_key"]}
        edge["server_timing_kv_hit"] = layers["edge_hit_timing"]
        streaming = self._streaming(ctx)
        # Last, so the KV writer's drain is measured right after the miss run that fed it.
        origin, kv, peak_rss = self._origin(ctx)
        origin["layers"] = {"redis_hit": layers["origin_hit"], "miss": layers["origin_miss"]}
        result: dict[str, Any] = {
            "meta": self._meta(wrk_path()),
            "loadgen_ceiling": ceiling,
            "edge": edge,
            "origin": origin,
            "streaming": streaming,
            "kv_writer": kv,
            "memory": {
                "origin_idle_rss_mb": idle_rss,
                "origin_load_rss_mb": max(peak_rss, idle_rss),
            },
        }
        if self.config.profile:
            result["profile"] = self._profile(ctx, high)
        return result

    def _spec(self, url: str, body: str, headers: Mapping[str, str], c: int) -> LoadSpec:
        return LoadSpec(url=url + CHAT_PATH, concurrency=c, duration=self.config.duration,
                        body=body, headers=headers)  # fmt: skip

    def _edge(self, ctx: BenchContext) -> dict[str, Any]:
        """KV hit and bad key through the Prism Worker, next to the trivial Worker (c1)."""
        edge: dict[str, Any] = {}
        trivial = ctx.urls["trivial"] + CHAT_PATH
        for name, url, headers in (
            ("trivial_worker", trivial, ctx.auth),
            ("trivial_worker_kv_read", f"{trivial}?kv={ctx.hit_key}", ctx.auth),
            ("kv_hit", ctx.info.edge_url + CHAT_PATH, ctx.auth),
            ("bad_key", ctx.info.edge_url + CHAT_PATH, ctx.bad),
        ):
            self._on_step(f"edge: {name.replace('_', ' ')} (c1)")
            load = LoadSpec(url=url, concurrency=1, duration=self.config.duration,
                            body=ctx.hit_body, headers=headers)  # fmt: skip
            edge[name] = self._timed(load, [ctx.pids["workers runtime"]])
        return edge

    def _origin(self, ctx: BenchContext) -> tuple[dict[str, Any], dict[str, Any], float]:
        """Each origin case right after its floor, at every concurrency; then the KV writer."""
        pids, origin_url = ctx.pids, ctx.info.origin_url
        origin: dict[str, Any] = {"concurrency": list(self.config.concurrency)}
        kv: dict[str, Any] = {}
        rss = RssSampler(pids["origin"])
        try:
            for c in self.config.concurrency:
                for name, url, body, servers in (
                    ("floor", ctx.urls["floor"], ctx.hit_body, [pids["floor"]]),
                    (
                        "floor_redis_py",
                        ctx.urls["floor_redis_py"],
                        ctx.hit_body,
                        [pids["floor_redis_py"]],
                    ),
                    ("redis_hit", origin_url, ctx.hit_body, [pids["origin"]]),
                    ("redis_hit_limited", origin_url, ctx.hit_body, [pids["origin"]]),
                    ("provider_direct", ctx.urls["provider"], ctx.miss_body, [pids["provider"]]),
                    ("miss", origin_url, ctx.miss_body, [pids["origin"], pids["provider"]]),
                ):
                    self._on_step(f"origin: {name.replace('_', ' ')} (c{c})")
                    before = wait_writer_idle(ctx.info.origin_admin_url)
                    load = self._spec(url, body, ctx.auth, c)
                    with self._rate_limited(ctx, name == "redis_hit_limited"):
                        row = self._timed(load, servers, rss if url == origin_url else None)
                    origin.setdefault(name, {})[str(c)] = row
                    if name == "miss" and c == max(self.config.concurrency):
                        self._on_step("KV writer: waiting for the new entries to replicate")
                        ran = row["duration_s"] + self.config.warmup
                        kv = measure_replication(ctx.info.origin_admin_url, before, ran, KV_FLUSH)
        finally:
            rss.close()
        return origin, kv, rss.peak

    @contextlib.contextmanager
    def _rate_limited(self, ctx: BenchContext, on: bool) -> Iterator[None]:
        """With ``on``, the project has rate limits and a budget (that never refuse) while
        inside."""
        if not on:
            yield
            return
        store = PolicyStore.from_url(ctx.info.redis_url)
        try:
            store.set(ctx.info.project, rate_limits=_BENCH_LIMITS, budget=_BENCH_BUDGET,
                      updated_by="bench")  # fmt: skip
            check = httpx.post(ctx.info.origin_url + CHAT_PATH, content=ctx.hit_body,
                               headers=ctx.auth, timeout=30)  # fmt: skip
            if check.headers.get("x-ratelimit-limit-requests") != "1000000":
                raise BenchError("the rate-limited hit row's limit did not take effect")
            yield
        finally:
            store.clear(ctx.info.project, actor="bench")
            store.close()

    def _streaming(self, ctx: BenchContext) -> dict[str, Any]:
        self._on_step("streaming: time to first byte (provider, origin, forward, edge + origin)")
        headers = {**ctx.auth, "accept": "text/event-stream"}
        return measure_ttfb(
            [
                StreamTarget("provider_direct", ctx.urls["provider"] + CHAT_PATH, headers),
                StreamTarget("origin", ctx.info.origin_url + CHAT_PATH, headers),
                StreamTarget("forward_origin", ctx.urls["forward"] + CHAT_PATH, headers),
                StreamTarget("edge_origin", ctx.info.edge_url + CHAT_PATH, headers),
            ],
            chat_body(UNIQUE, stream=True),
            self.config.stream_requests,
            self._nonce + "s",
        )

    def _profile(self, ctx: BenchContext, high: int) -> dict[str, Any]:
        """Where the time goes: the edge hit step by step, and py-spy on the origin."""
        seconds = max(2, round(self.config.duration))
        found: dict[str, Any] = {
            "edge_ladder": measure_ladder(
                ctx.urls["ladder"] + CHAT_PATH,
                (ctx.hit_body, ctx.miss_body),
                ctx.auth,
                max(1, round(seconds / 5)),
                self._ladder_rounds,
                self._on_step,
            )
        }
        spy = find_py_spy()
        if spy is None:
            found["error"] = "py-spy is not installed (pip install 'prism-edge-gateway[bench]')"
            return found
        folder = self.config.profile_dir or self._state
        folder.mkdir(parents=True, exist_ok=True)
        for name, body, c in (
            ("redis_hit", ctx.hit_body, high),
            ("miss", ctx.miss_body, 1),
            ("miss", ctx.miss_body, high),
        ):
            self._on_step(f"profiling the origin: {name.replace('_', ' ')} (c{c})")
            load = replace(
                self._spec(ctx.info.origin_url, body, ctx.auth, c),
                duration=seconds,
                nonce=f"{self._nonce}p{name}{c}",
            )
            out = folder / f"origin-{name}-c{c}.txt"
            with PySpy(spy, ctx.pids["origin"], seconds, out) as sampler:
                run_load(load)
            found[f"{name}_c{c}"] = sampler.summary() | {"collapsed_stacks": str(out)}
        return found

    def _meta(self, tool: str | None) -> dict[str, Any]:
        node: str | None = None
        miniflare: str | None = None
        with contextlib.suppress(RuntimeError):
            toolchain = find_node_toolchain()
            node, miniflare = str(toolchain.node), toolchain.miniflare_version
        try:
            redis_server: str | None = find_redis_server()
        except FileNotFoundError:
            redis_server = None
        return {
            "machine": machine_info(),
            "versions": versions(redis_server, node, miniflare),
            "loadgen": {"tool": wrk_version(tool) if tool else FALLBACK_TOOL},
            "config": {
                "duration_s": self.config.duration,
                "warmup_s": self.config.warmup,
                "stream_requests": self.config.stream_requests,
                "concurrency": list(self.config.concurrency),
                "quick": self.config.quick,
                "provider": "local demo provider, no added latency, replies ~1 KB",
                "request_body_bytes": len(chat_body("x")),
            },
            "notes": [
                "Everything runs on this one machine: load generator and servers share its cores.",
                "Each measured row runs right after its floor, so outside load hits both alike.",
                "Edge rows are sequential (c1): they measure latency, not throughput.",
            ],
        }
