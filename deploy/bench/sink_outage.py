"""`prism bench logsinks`: the request log's sinks killed for a while under steady load.

The stack: a private redis-server, the local provider, moto's S3 and a Rotel collector
(``sink_servers``), and one ``prism origin serve`` with every sink on: the Redis window, the
durable files in the S3 bucket (AWS_ENDPOINT_URL_S3), OTLP logs to the collector. The load is
open loop (each request leaves at its time, answered or not, and its latency counts from
then): ``rate`` requests a second, Redis hits on a few warmed prompts and every
``1 / miss_share``-th a unique miss, each with an ``x-request-id`` of the run's, so every
record the origin makes can be looked for in every sink (its admin listener's requests,
``/metrics``, are not recorded).

Three phases: ``before``; then S3 and the collector are SIGKILLed and kept down ``outage``
seconds, and started again on the same ports (the bucket made again: moto forgot it); then
``after``. The bucket is read just before its kill, and the collector killed once it has
exported and then been quiet for ``_QUIET`` (it holds what it accepted 50 ms; the origin's
buffer sends follow-ups at once, then its next batch a second later), so what is counted
lost is the origin's, not the stand-ins' memory. Then, within
``settle`` seconds, until every sink has written or dropped every record (the origin's
counters), and each sink is read back: the Redis streams, the S3 objects (with what was
read before the kill), the collector's exports. Per sink: records produced, found, dropped
(``prism_request_log_dropped_total``), and the most that waited (records answered less
those written or dropped, sampled twice a second).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
import redis
from prometheus_client.parser import text_string_to_metric_families

from deploy.local.asgi_thread import ThreadedServer
from deploy.local.ports import free_port
from deploy.local.processes import ChildProcess
from deploy.local.redis import RedisServer
from origin.requestlog.redis_window import entry_records
from prism import headers as h
from prism import parse_key_secrets

from .loadgen import percentile
from .sink_servers import (
    AWS_ENV,
    KillableChild,
    LogsReceiver,
    S3Records,
    collector,
    s3_client,
    s3_server,
)

__all__ = ["SINKS", "OutageConfig", "PhaseResult", "SinkResult", "run_sink_outage"]

CHAT = "/v1/chat/completions"
MODEL = "bench-model"
PROJECT = "bench-logsinks"
BUCKET, PREFIX = "prism-bench-logs", "requests/"
SINKS = ("redis", "files", "otlp")  # the metric's labels
PHASES = ("before", "outage", "after")
_SCRUBBED_ENV = (
    "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "PRISM_PROVIDERS_FILE", "REDIS_URL",
    "PRISM_LOG_DIR", "PRISM_LOG_BUCKET", "OTEL_EXPORTER_OTLP_ENDPOINT", "AWS_PROFILE",
    "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
)  # fmt: skip
_SAMPLE_EVERY = 0.5  # s between the origin's counters read during the run
_QUIET = 0.3  # s without a new file (an export) before S3 (the collector) holds nothing unread


@dataclass(frozen=True, slots=True)
class OutageConfig:
    rate: int = 200  # requests a second
    miss_share: float = 0.1  # of them unique misses (the rest Redis hits)
    before: float = 30.0  # seconds of each phase
    outage: float = 60.0
    after: float = 30.0
    settle: float = 90.0  # at most this long after the load for the records to arrive
    provider_ms: int = 20
    buffer: int = 50_000  # PRISM_LOG_BUFFER: records that may wait per sink
    files_interval: float = 60.0  # PRISM_LOG_FILES_INTERVAL
    hot_prompts: int = 20

    @classmethod
    def quick(cls, outage: float = 3.0) -> OutageConfig:
        return cls(rate=100, before=2.0, outage=outage, after=2.0, settle=25.0,
                   files_interval=1.0)  # fmt: skip


@dataclass(slots=True)
class PhaseResult:
    name: str
    seconds: float = 0.0
    sent: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # status or exception -> count
    layers: dict[str, int] = field(default_factory=dict)
    latency_ms: list[float] = field(default_factory=list)
    hit_ms: list[float] = field(default_factory=list)  # the Redis hits alone

    def p(self, pct: float, values: list[float] | None = None) -> float | None:
        ordered = sorted(self.latency_ms if values is None else values)
        return round(percentile(ordered, pct), 2) if ordered else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        del data["latency_ms"], data["hit_ms"]
        return data | {
            "p50_ms": self.p(50),
            "p99_ms": self.p(99),
            "hit_p50_ms": self.p(50, self.hit_ms),
            "hit_p99_ms": self.p(99, self.hit_ms),
        }


@dataclass(slots=True)
class SinkResult:
    sink: str
    produced: int = 0  # records the origin made for the run's requests (their ids)
    found: int = 0  # of them, read back from the sink
    dropped: int = 0  # the origin's count
    written: int = 0  # the origin's count
    peak_queued: int = 0  # the most waiting at once (answered - written - dropped)
    killed: bool = False
    missing: list[str] = field(default_factory=list)  # a few of the ids not found, to look up

    @property
    def unaccounted(self) -> int:
        return self.produced - self.found - self.dropped

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"unaccounted": self.unaccounted}


class _Stack:
    """Redis, the provider, S3, the receiver and its collector, and the origin."""

    def __init__(self, state: Path, config: OutageConfig) -> None:
        self._state, self._config = state, config
        self._logs = state / "logs"
        self._logs.mkdir(parents=True, exist_ok=True)
        self._children: list[ChildProcess] = []
        self._redis: RedisServer | None = None
        self._receiver_server: ThreadedServer | None = None
        self.receiver = LogsReceiver()
        self.secret = secrets.token_urlsafe(32)
        self.s3: KillableChild | None = None
        self.collector: KillableChild | None = None
        self.s3_url = self.collector_url = self.url = self.admin_url = self.redis_url = ""

    def start(self) -> None:
        (self._state / "redis").mkdir(exist_ok=True)
        self._redis = RedisServer(workdir=self._state / "redis").start()
        self.redis_url = self._redis.url
        port = free_port()
        provider = self._child(
            "provider",
            ["-m", "deploy.local.provider", "--port", str(port),
             "--latency-ms", str(self._config.provider_ms)],
            os.environ,
        )  # fmt: skip
        s3_port, http_port, grpc_port = free_port(), free_port(), free_port()
        self.s3 = s3_server(s3_port, self._logs)
        self.s3_url = f"http://127.0.0.1:{s3_port}"
        self._receiver_server = ThreadedServer(self.receiver, lifespan="off").start()
        self.collector = collector(http_port, grpc_port, self._receiver_server.url, self._logs)
        self.collector_url = f"http://127.0.0.1:{http_port}"
        self.s3.start()
        self.collector.start()
        s3_client(self.s3_url).create_bucket(Bucket=BUCKET)
        provider.wait_http(f"http://127.0.0.1:{port}/v1/models")
        public, admin = free_port(), free_port()
        env = (
            {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
            | AWS_ENV
            | {
                "PRISM_KEY_SECRET": self.secret,
                "PRISM_FORWARD_SECRET": secrets.token_urlsafe(32),
                "REDIS_URL": self.redis_url,
                "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
                "OPENAI_API_KEY": "demo",
                "AWS_ENDPOINT_URL_S3": self.s3_url,
                "PRISM_LOG_BUCKET": BUCKET,
                "PRISM_LOG_PREFIX": PREFIX,
                "PRISM_OTEL_ENDPOINT": self.collector_url,
                "PRISM_LOG_BUFFER": str(self._config.buffer),
                "PRISM_LOG_FILES_INTERVAL": str(self._config.files_interval),
                "PRISM_LOG_WINDOW": "10000000",  # the whole run stays in the window, to be read
            }
        )
        origin = self._child(
            "origin",
            ["-m", "deploy.cli", "origin", "serve", "--port", str(public),
             "--admin-port", str(admin), "--workers", "1"],
            env,
        )  # fmt: skip
        self.url, self.admin_url = f"http://127.0.0.1:{public}", f"http://127.0.0.1:{admin}"
        origin.wait_http(self.admin_url + "/healthz", timeout=60)

    def _child(self, name: str, args: list[str], env: Mapping[str, str]) -> ChildProcess:
        child = ChildProcess(name, [sys.executable, *args], self._logs / f"{name}.log", env)
        self._children.append(child)
        return child

    def key(self) -> str:
        return parse_key_secrets(self.secret).mint(PROJECT)

    def stop(self) -> None:
        for child in reversed(self._children):
            child.stop()
        for server in (self.collector, self.s3):
            if server is not None:
                server.stop()
        if self._receiver_server is not None:
            self._receiver_server.stop()
        if self._redis is not None:
            self._redis.stop()


class _Run:
    """The load, the ids it produced, and the origin's counters as they went."""

    def __init__(self, stack: _Stack, config: OutageConfig) -> None:
        self.stack, self.config = stack, config
        self.label = secrets.token_hex(4)
        self.produced: set[str] = set()  # ids the origin answered, so recorded
        self.unanswered = 0  # requests that got no answer at all (their record uncertain)
        self.phases = {name: PhaseResult(name) for name in PHASES}
        self.peaks = dict.fromkeys(SINKS, 0)
        self.marks: dict[str, float] = {}  # loop times: "killed", "back"

    def scrape(self) -> dict[str, dict[str, float]]:
        """The request log's counters, {"written"|"dropped": {sink: value}}."""
        reply = httpx.get(self.stack.admin_url + "/metrics", timeout=10)
        found: dict[str, dict[str, float]] = {"written": {}, "dropped": {}}
        for family in text_string_to_metric_families(reply.text):
            kind = family.name.removeprefix("prism_request_log_")
            if kind not in found:
                continue
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    found[kind][sample.labels["sink"]] = sample.value
        return found

    def phase_of(self, due: float) -> PhaseResult:
        if due < self.marks.get("killed", float("inf")):
            return self.phases["before"]
        if due < self.marks.get("back", float("inf")):
            return self.phases["outage"]
        return self.phases["after"]

    async def load(self, http: aiohttp.ClientSession, stop: Callable[[], bool]) -> None:
        """Requests at the rate until ``stop()`` holds; then until each is answered."""
        config, loop = self.config, asyncio.get_running_loop()
        headers = {"authorization": f"Bearer {self.stack.key()}",
                   "content-type": "application/json"}  # fmt: skip
        every = max(1, round(1 / config.miss_share)) if config.miss_share > 0 else 0
        tasks: set[asyncio.Task[None]] = set()
        began = loop.time()

        async def one(number: int, due: float) -> None:
            miss = every and number % every == 0
            text = f"{self.label} unique {number}" if miss else f"hot {number % config.hot_prompts}"
            request_id = f"{self.label}-{number}"
            body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}]})
            try:
                sent = headers | {h.REQUEST_ID: request_id}
                async with http.post(self.stack.url + CHAT, data=body, headers=sent) as reply:
                    await reply.read()
                    status, layer = reply.status, reply.headers.get(h.CACHE_LAYER, "?")
            except (aiohttp.ClientError, TimeoutError) as error:
                status, layer = 0, type(error).__name__
            phase = self.phase_of(due)
            phase.sent += 1
            if status:
                self.produced.add(request_id)
            else:
                self.unanswered += 1
            if status == 200:
                phase.ok += 1
                ms = (loop.time() - due) * 1000
                phase.latency_ms.append(ms)
                if layer == "redis":
                    phase.hit_ms.append(ms)
                phase.layers[layer] = phase.layers.get(layer, 0) + 1
            else:
                reason = str(status) if status else layer
                phase.errors[reason] = phase.errors.get(reason, 0) + 1

        number = 0
        while not stop():
            due = began + number / config.rate
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)  # the schedule itself: requests leave at their time
            task = loop.create_task(one(number, due))
            number += 1
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks)

    async def sample(self, until: asyncio.Event) -> None:
        """The most records waiting per sink, from the origin's counters."""
        while not until.is_set():
            counts = await asyncio.to_thread(self.scrape)
            answered = len(self.produced)
            for sink in SINKS:
                done = counts["written"].get(sink, 0) + counts["dropped"].get(sink, 0)
                self.peaks[sink] = max(self.peaks[sink], answered - int(done))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_SAMPLE_EVERY):
                    await until.wait()


def _quiet_collector(receiver: LogsReceiver, timeout: float = 3.0) -> None:
    """Until the receiver has had an export and then none for ``_QUIET`` (more than the
    collector's 50 ms batch): the collector holds nothing the origin sent, whose buffer
    sends its follow-ups at once (what arrived during an export) and its next batch a second
    after the last. Returns anyway at ``timeout``."""
    first, _ = receiver.counts()
    last, since = first, time.monotonic()
    deadline = since + timeout
    while time.monotonic() < deadline:
        exports, now = receiver.counts()[0], time.monotonic()
        if exports != last:
            last, since = exports, now
        elif last != first and now - since >= _QUIET:
            return
        time.sleep(0.005)  # polling the receiver, with a deadline


def _bucket_read(run: _Run, records: S3Records, timeout: float) -> None:
    """Until the bucket has been read whole and is quiet: every record the origin counts
    written found, nothing new for ``_QUIET`` seconds (the buffer writes a follow-up file
    with what arrived during a put), and (within ``timeout``) just after a new file, so
    the next batch is about an interval away."""
    first = records.read()
    deadline = time.monotonic() + timeout
    last, since = first, time.monotonic()
    while True:
        written = run.scrape()["written"].get("files", 0)
        found = records.read()
        now = time.monotonic()
        if found != last:
            last, since = found, now
        fresh = found > first or now > deadline
        if found >= written and fresh and now - since >= _QUIET:
            return
        time.sleep(0.01)  # polling the bucket, with a deadline


async def _outage(run: _Run, s3_records: S3Records, on_step: Callable[[str], None]) -> float:
    """Both sinks down ``outage`` seconds (SIGKILL), then up again; the seconds they were."""
    stack, loop = run.stack, asyncio.get_running_loop()
    assert stack.s3 is not None and stack.collector is not None
    s3, collector = stack.s3, stack.collector

    def kill() -> None:
        # What moto holds is read before it forgets it; the collector killed between exports.
        _bucket_read(run, s3_records, min(2 * run.config.files_interval + 1, 5.0))
        s3.kill()
        _quiet_collector(stack.receiver)
        collector.kill()

    await asyncio.to_thread(kill)
    run.marks["killed"] = killed = loop.time()
    on_step(f"S3 and the collector killed; down {run.config.outage:g} s")
    await asyncio.sleep(max(0.0, killed + run.config.outage - loop.time()))  # the outage

    def revive() -> None:
        s3.start()
        s3_records.create_bucket()  # as a real bucket would have stayed
        collector.start()

    await asyncio.to_thread(revive)
    run.marks["back"] = back = loop.time()
    on_step("S3 and the collector back on their ports")
    return back - killed


def _redis_ids(url: str) -> set[str]:
    client = redis.Redis.from_url(url)
    try:
        ids: set[str] = set()
        projects: set[bytes] = client.smembers("prism:log-projects")  # type: ignore[assignment]
        for project in projects:
            entries: list[tuple[bytes, dict[bytes, bytes]]] = client.xrange(  # type: ignore[assignment]
                b"prism:log:" + project
            )
            ids.update(str(r.get("id")) for _, fields in entries for r in entry_records(fields))
        return ids
    finally:
        client.close()


def _number(request_id: str) -> tuple[str, int]:
    """A run's id in the order it was sent (``<run>-[warm-]<n>``)."""
    head, _, number = request_id.rpartition("-")
    return head, int(number) if number.isdigit() else -1


def _settle(run: _Run, timeout: float) -> tuple[dict[str, dict[str, float]], float]:
    """Until every sink has written or dropped every record produced (within ``timeout``);
    the last counters and the seconds it took."""
    began = time.monotonic()
    while True:
        counts = run.scrape()
        produced = len(run.produced)
        done = all(
            counts["written"].get(sink, 0) + counts["dropped"].get(sink, 0) >= produced
            for sink in SINKS
        )
        if done or time.monotonic() - began > timeout:
            return counts, round(time.monotonic() - began, 2)
        time.sleep(0.25)  # polling the origin's counters, with a deadline


async def _run(
    stack: _Stack, config: OutageConfig, on_step: Callable[[str], None]
) -> dict[str, Any]:
    run = _Run(stack, config)
    s3_records = S3Records(s3_client(stack.s3_url), BUCKET, PREFIX)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=30)
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        on_step("warming up: the hot prompts cached, the pools filled")
        warm = _Run(stack, replace(config, rate=50, miss_share=0.0))
        warm.label = f"{run.label}-warm"
        warm_until = loop.time() + max(1.0, config.hot_prompts / 50) + 1.0
        await warm.load(http, lambda: loop.time() >= warm_until)
        run.produced |= warm.produced
        total = config.before + config.outage + config.after
        on_step(f"{config.rate} requests/s for about {total:g} s: {config.before:g} s before, "
                f"{config.outage:g} s outage, {config.after:g} s after")  # fmt: skip
        stop_sampling = asyncio.Event()
        sampler = asyncio.create_task(run.sample(stop_sampling))
        began = loop.time()
        ended = float("inf")
        load = asyncio.create_task(run.load(http, lambda: loop.time() >= ended))
        await asyncio.sleep(config.before)
        down = await _outage(run, s3_records, on_step)
        ended = run.marks["back"] + config.after
        await load
        stop_sampling.set()
        await sampler
    bounds = {
        "before": (began, run.marks["killed"]),
        "outage": (run.marks["killed"], run.marks["back"]),
        "after": (run.marks["back"], ended),
    }
    for name, phase in run.phases.items():
        phase.seconds = round(bounds[name][1] - bounds[name][0], 2)
    on_step(f"waiting (at most {config.settle:g} s) for every sink to have every record")
    counts, settled = await asyncio.to_thread(_settle, run, config.settle)
    await asyncio.to_thread(s3_records.read)  # adds what came after the kill
    found = {
        "redis": await asyncio.to_thread(_redis_ids, stack.redis_url),
        "files": s3_records.ids,
        "otlp": stack.receiver.ids(),
    }
    sinks = [
        SinkResult(
            sink,
            produced=len(run.produced),
            found=len(found[sink] & run.produced),
            dropped=int(counts["dropped"].get(sink, 0)),
            written=int(counts["written"].get(sink, 0)),
            peak_queued=max(0, run.peaks[sink]),
            killed=sink != "redis",
            missing=sorted(run.produced - found[sink], key=_number)[:10],
        )
        for sink in SINKS
    ]
    return {
        "phases": [phase.to_dict() for phase in run.phases.values()],
        "sinks": [sink.to_dict() for sink in sinks],
        "down_s": round(down, 2),
        "settle_s": settled,
        "unanswered": run.unanswered,
        "s3_objects": s3_records.objects,
        "collector_exports": stack.receiver.counts()[0],
    }


def run_sink_outage(
    config: OutageConfig, on_step: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """The whole scenario on a stack of its own (taken down before returning)."""
    with tempfile.TemporaryDirectory(prefix="prism-logsinks-") as state:
        stack = _Stack(Path(state), config)
        try:
            on_step("starting Redis, the provider, S3 (moto), the collector (rotel), the origin")
            stack.start()
            return asyncio.run(_run(stack, config, on_step))
        finally:
            stack.stop()
