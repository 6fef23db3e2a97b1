"""`prism bench semantic --load`: the semantic layer under the load it exists for.

The stack is the origin's own, nothing else: a private redis-server, the local provider
answering every request after ``provider_ms``, and two ``prism origin serve`` processes
sharing that Redis (``near`` takes the load; ``far`` shows how soon another process
finds a new record). For each rate, two phases of ``duration`` seconds each send that
many unique misses a second, open loop (each request leaves at its time, whether or not
the ones before it were answered, and its latency counts from that time), spread over
``PARTITIONS`` system prompts so the partitions fill as a busy project's do:

- ``off``: to a project whose policy leaves the semantic layer off: the floor;
- ``on``: to a project whose policy turns it on, and, alongside, the repository's
  labelled pairs (``deploy/bench/data/semantic_pairs.jsonl``), each pair in a system
  prompt of its own: ``a`` is asked; once it is answered, ``b`` is asked, on the same
  origin ``SAME_ORIGIN_AFTER`` later (every other pair) or on the other origin
  ``OTHER_ORIGIN_AFTER`` later (the rest).

Read from the near origin's ``/metrics`` around each ``on`` phase: lookups by outcome,
questions embedded and their CPU and wall time, batch sizes; and its CPU and RSS from
``/proc``. The report (``semantic_load_report``) judges the issue's bounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from deploy.local.ports import free_port
from deploy.local.processes import ChildProcess
from deploy.local.redis import RedisServer
from deploy.policy_store import PolicyStore
from prism import CacheRules, parse_key_secrets
from prism import headers as h

from .loadgen import percentile
from .machine import CpuClock, rss_mb
from .semantic import Pair, load_pairs

__all__ = ["LoadConfig", "PhaseResult", "run_semantic_load"]

CHAT = "/v1/chat/completions"
MODEL = "bench-model"
ON, OFF = "bench-semantic-on", "bench-semantic-off"  # the two projects
PARTITIONS = 16  # system prompts the unique misses are spread over
SAME_ORIGIN_AFTER = 0.010  # s after a's answer, b on the origin that stored a
OTHER_ORIGIN_AFTER = 0.150  # s after a's answer, b on the other origin
PAIR_CHAINS = 2  # labelled pairs asked at once, beside the load
_VOCABULARY = (
    "river mountain engine garden market winter silver planet doctor violin harbor "
    "forest castle pepper rocket lantern marble spider island candle tunnel glacier "
    "desert museum pencil rabbit thunder velvet anchor bridge camera dragon feather "
    "jungle kettle ladder magnet needle orchard parrot quartz saddle tiger umbrella "
    "valley walnut yogurt zebra bakery cactus dolphin ember falcon gravel hammock "
    "iceberg jacket koala lemon meadow nickel oyster pillow quiver raven sapphire "
    "tractor unicorn vortex wizard xylophone yacht zipper algebra budget cipher"
)  # the unique misses' words
_WORDS = _VOCABULARY.split()
_SCRUBBED_ENV = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "PRISM_PROVIDERS_FILE", "REDIS_URL")


@dataclass(frozen=True, slots=True)
class LoadConfig:
    rates: tuple[int, ...] = (50, 200, 500)  # unique misses a second
    duration: float = 30.0  # seconds per phase
    provider_ms: int = 100
    warmup: float = 3.0  # seconds of load before the first phase (model built, pools warm)

    @classmethod
    def quick(cls) -> LoadConfig:
        return cls(rates=(20,), duration=3.0, warmup=1.0)


@dataclass(slots=True)
class PhaseResult:
    rate: int
    semantic: bool
    sent: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # status or exception -> count
    latency_ms: list[float] = field(default_factory=list)  # of the unique misses
    semantic_ms: list[float] = field(default_factory=list)  # their semantic stage (Server-Timing)
    layers: dict[str, int] = field(default_factory=dict)  # of the unique misses
    outcomes: dict[str, float] = field(default_factory=dict)  # semantic lookups (near origin)
    embedded: float = 0.0  # questions embedded
    embed_cpu_ms: float | None = None  # per question
    embed_wall_ms: float | None = None
    batches: dict[str, float] = field(default_factory=dict)  # size bucket (le) -> model calls
    mean_batch: float | None = None  # texts per model call
    origin_cpu: float = 0.0  # cores the near origin used, on average
    origin_rss_mb: float = 0.0
    pairs: dict[str, int] = field(default_factory=dict)  # labelled outcomes, see _ask_pair

    def p(self, pct: float, values: list[float] | None = None) -> float | None:
        ordered = sorted(self.latency_ms if values is None else values)
        return round(percentile(ordered, pct), 2) if ordered else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        del data["latency_ms"], data["semantic_ms"]
        return data | {
            "p50_ms": self.p(50),
            "p99_ms": self.p(99),
            "semantic_p50_ms": self.p(50, self.semantic_ms),
            "semantic_p99_ms": self.p(99, self.semantic_ms),
        }


class _Origins:
    """Redis, the provider and the two origins, as child processes of this one."""

    def __init__(self, state: Path, provider_ms: int) -> None:
        self._state = state
        self._provider_ms = provider_ms
        self._children: list[ChildProcess] = []
        self._redis: RedisServer | None = None
        self.secret = secrets.token_urlsafe(32)
        self.urls: dict[str, str] = {}  # near, far, near-admin, far-admin
        self.pids: dict[str, int] = {}

    def start(self) -> None:
        logs = self._state / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        (self._state / "redis").mkdir(exist_ok=True)
        self._redis = RedisServer(workdir=self._state / "redis").start()
        with contextlib.closing(PolicyStore.from_url(self._redis.url)) as store:
            store.set(ON, cache=CacheRules(semantic=True), updated_by="bench")
            store.set(OFF, updated_by="bench")
        port = free_port()
        provider = self._child(
            "provider",
            ["-m", "deploy.local.provider", "--port", str(port),
             "--latency-ms", str(self._provider_ms)],
            os.environ,
        )  # fmt: skip
        provider.wait_http(f"http://127.0.0.1:{port}/v1/models")
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV} | {
            "PRISM_KEY_SECRET": self.secret,
            "PRISM_FORWARD_SECRET": secrets.token_urlsafe(32),
            "REDIS_URL": self._redis.url,
            "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
            "OPENAI_API_KEY": "demo",
        }
        started = []
        for name in ("near", "far"):
            public, admin = free_port(), free_port()
            origin = self._child(
                name,
                ["-m", "deploy.cli", "origin", "serve", "--port", str(public),
                 "--admin-port", str(admin), "--workers", "1"],
                env,
            )  # fmt: skip
            self.urls[name] = f"http://127.0.0.1:{public}"
            self.urls[f"{name}-admin"] = f"http://127.0.0.1:{admin}"
            self.pids[name] = origin.pid
            started.append(origin)
        for origin in started:
            origin.wait_http(self.urls[f"{origin.name}-admin"] + "/healthz", timeout=60)

    def _child(self, name: str, args: list[str], env: Mapping[str, str]) -> ChildProcess:
        child = ChildProcess(
            name, [sys.executable, *args], self._state / "logs" / f"{name}.log", env
        )
        self._children.append(child)
        return child

    def key(self, project: str) -> str:
        return parse_key_secrets(self.secret).mint(project)

    def stop(self) -> None:
        for child in reversed(self._children):
            child.stop()
        if self._redis is not None:
            self._redis.stop()


def _question(rng: random.Random, number: int) -> str:
    words = rng.sample(_WORDS, rng.randint(6, 10))
    return f"{' '.join(words)} {number}?"


def _body(system: str, text: str) -> bytes:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
    return orjson.dumps({"model": MODEL, "messages": messages, "temperature": 0})


class _Client:
    def __init__(self, http: aiohttp.ClientSession, keys: Mapping[str, str]) -> None:
        self._http = http
        self._headers = {
            project: {"authorization": f"Bearer {key}", "content-type": "application/json"}
            for project, key in keys.items()
        }

    async def ask(self, url: str, project: str, body: bytes) -> tuple[int, str, float | None]:
        """The status, the cache layer and the semantic stage's milliseconds (Server-Timing;
        None when the request had none)."""
        async with self._http.post(url + CHAT, data=body, headers=self._headers[project]) as reply:
            await reply.read()
            layer = reply.headers.get(h.CACHE_LAYER, "?")
            return reply.status, layer, _stage(reply.headers.get(h.SERVER_TIMING, ""), "semantic")


def _stage(timing: str, name: str) -> float | None:
    for part in timing.split(","):
        stage, _, duration = part.strip().partition(";dur=")
        if stage == name:
            return float(duration)
    return None


async def _open_loop(
    client: _Client, url: str, project: str, rate: int, seconds: float, label: str,
    result: PhaseResult | None,
) -> None:  # fmt: skip
    """``rate`` unique misses a second for ``seconds``, each timed from when it was due."""
    rng = random.Random(label)
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()
    total = int(rate * seconds)
    began = loop.time()

    async def one(number: int, due: float) -> None:
        system = f"bench {label} partition {number % PARTITIONS}"
        body = _body(system, _question(rng, number))
        try:
            status, layer, stage = await client.ask(url, project, body)
        except (aiohttp.ClientError, TimeoutError) as error:
            status, layer, stage = 0, type(error).__name__, None
        if result is None:
            return
        result.sent += 1
        if status == 200:
            result.ok += 1
            result.latency_ms.append((loop.time() - due) * 1000)
            result.layers[layer] = result.layers.get(layer, 0) + 1
            if stage is not None:
                result.semantic_ms.append(stage)
        else:
            reason = str(status) if status else layer
            result.errors[reason] = result.errors.get(reason, 0) + 1

    for number in range(total):
        due = began + number / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)  # the schedule itself: requests leave at their time
        task = loop.create_task(one(number, due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks)


async def _ask_pair(
    client: _Client, urls: Mapping[str, str], label: str, number: int, pair: Pair,
    counts: dict[str, int],
) -> None:  # fmt: skip
    """``a``, then ``b`` on the same origin 10 ms after or on the other origin 150 ms
    after (every other pair of each kind: the stream alternates kinds); counted by where
    b went and whether it should match."""
    system = f"bench {label} pair {number}"
    try:
        status, _, _ = await client.ask(urls["near"], ON, _body(system, pair.a))
        if status != 200:
            counts["a_failed"] = counts.get("a_failed", 0) + 1
            return
        other = number // 2 % 2 == 1
        await asyncio.sleep(OTHER_ORIGIN_AFTER if other else SAME_ORIGIN_AFTER)  # the delay tested
        origin = urls["far" if other else "near"]
        status, layer, _ = await client.ask(origin, ON, _body(system, pair.b))
    except (aiohttp.ClientError, TimeoutError):
        counts["failed"] = counts.get("failed", 0) + 1
        return
    where = "other" if other else "same"
    kind = "paraphrase" if pair.match else "near_miss"
    counts[f"{kind}_{where}"] = counts.get(f"{kind}_{where}", 0) + 1
    if status == 200 and layer == "semantic":
        counts[f"{kind}_{where}_hit"] = counts.get(f"{kind}_{where}_hit", 0) + 1


async def _pairs(
    client: _Client, urls: Mapping[str, str], label: str, pairs: list[Pair], until: float,
    counts: dict[str, int],
) -> None:  # fmt: skip
    loop = asyncio.get_running_loop()
    numbers = iter(range(len(pairs)))

    async def chain() -> None:
        for number in numbers:
            if loop.time() >= until:
                return
            await _ask_pair(client, urls, label, number, pairs[number], counts)

    await asyncio.gather(*(chain() for _ in range(PAIR_CHAINS)))


def _labelled_stream() -> list[Pair]:
    """The repository's pairs as the load asks them: the paraphrases the model and guard
    take offline at the default threshold (with the origin's own engine: one the cache
    would never take is not a miss under load) alternating with the near misses, each
    kind shuffled, so every phase meets both."""
    from origin.store.semantic.guard import judged
    from origin.store.semantic.partition import normalized
    from prism import DEFAULT_SEMANTIC_THRESHOLD

    from .semantic import load

    model = load("auto")
    pairs = load_pairs()
    texts = sorted({normalized(t) for p in pairs for t in (p.a, p.b)})
    vectors = dict(zip(texts, model.encode_ids([model.tokens(t) for t in texts]), strict=True))

    def taken(pair: Pair) -> bool:
        cosine = float(vectors[normalized(pair.a)] @ vectors[normalized(pair.b)])
        score = judged(pair.b, pair.a, cosine)  # b asked, a indexed
        return score is not None and score >= DEFAULT_SEMANTIC_THRESHOLD

    paraphrases = [p for p in pairs if p.match and taken(p)]
    near_misses = [p for p in pairs if not p.match]
    rng = random.Random(0)
    rng.shuffle(paraphrases)
    rng.shuffle(near_misses)
    return [p for two in zip(paraphrases, near_misses, strict=False) for p in two]  # the shorter


def _scrape(admin_url: str) -> dict[str, float]:
    """The near origin's semantic metrics, flattened to ``name{label=value}`` -> value."""
    text = httpx.get(admin_url + "/metrics", timeout=10).text
    flat: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("prism_semantic"):
            continue
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            flat[f"{sample.name}{{{labels}}}"] = sample.value
    return flat


def _settled(admin_url: str, questions: int, timeout: float = 60.0) -> None:
    """Until the origin has embedded ``questions`` and has none waiting (the model, loaded
    on the first, may take seconds to start)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _scrape(admin_url)
        embedded = found.get("prism_semantic_embedded_questions_total{}", 0.0)
        if embedded >= questions and not found.get("prism_semantic_embedding_queue{}", 0.0):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{admin_url}: the warm-up's questions were not embedded in {timeout} s")


def _read_metrics(
    result: PhaseResult, before: Mapping[str, float], after: Mapping[str, float]
) -> None:
    lookups = "prism_semantic_lookups_total{outcome="
    sizes = "prism_semantic_embedding_batch_size_bucket{le="
    changed = {name: value - before.get(name, 0.0) for name, value in after.items()}
    for name, value in changed.items():
        if name.startswith(lookups) and value:
            result.outcomes[name[len(lookups) : -1]] = value
        elif name.startswith(sizes):
            result.batches[name[len(sizes) : -1]] = value
    result.embedded = changed.get("prism_semantic_embedded_questions_total{}", 0.0)
    if result.embedded:
        per = 1000 / result.embedded
        cpu = changed.get("prism_semantic_embedding_cpu_seconds_total{}", 0.0)
        wall = changed.get("prism_semantic_embedding_wall_seconds_total{}", 0.0)
        result.embed_cpu_ms, result.embed_wall_ms = round(cpu * per, 2), round(wall * per, 2)
    calls = changed.get("prism_semantic_embedding_batch_size_count{}", 0.0)
    if calls:
        texts = changed.get("prism_semantic_embedding_batch_size_sum{}", 0.0)
        result.mean_batch = round(texts / calls, 2)


async def _phase(
    client: _Client, origins: _Origins, rate: int, semantic: bool, config: LoadConfig,
    label: str, pairs: list[Pair],
) -> PhaseResult:  # fmt: skip
    result = PhaseResult(rate, semantic)
    admin = origins.urls["near-admin"]
    before = await asyncio.to_thread(_scrape, admin)
    clock = CpuClock([origins.pids["near"]]).start()
    started = time.monotonic()
    project = ON if semantic else OFF
    load = _open_loop(client, origins.urls["near"], project, rate, config.duration, label, result)
    if semantic:
        until = asyncio.get_running_loop().time() + config.duration
        await asyncio.gather(load, _pairs(client, origins.urls, label, pairs, until, result.pairs))
    else:
        await load
    result.origin_cpu = round(clock.stop() / (time.monotonic() - started), 2)
    result.origin_rss_mb = rss_mb(origins.pids["near"])
    _read_metrics(result, before, await asyncio.to_thread(_scrape, admin))
    return result


async def _run(
    config: LoadConfig, origins: _Origins, pairs: list[Pair], on_step: Callable[[str], None]
) -> list[PhaseResult]:
    keys = {ON: origins.key(ON), OFF: origins.key(OFF)}
    run = secrets.token_hex(4)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    results: list[PhaseResult] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        client = _Client(http, keys)
        on_step("warming up: the model loads on both origins, the pools fill")
        warm = max(1, int(config.warmup * 20))
        for name in ("near", "far"):
            await _open_loop(
                client, origins.urls[name], ON, 20, warm / 20, f"{run}-warm-{name}", None
            )
        for name in ("near", "far"):  # its questions embedded, so no phase counts them
            await asyncio.to_thread(_settled, origins.urls[f"{name}-admin"], warm)
        for rate in config.rates:
            for semantic in (False, True):
                state = "on" if semantic else "off"
                on_step(f"{rate} misses/s, semantic {state}, {config.duration:.0f} s")
                label = f"{run}-{rate}-{state}"
                results.append(await _phase(client, origins, rate, semantic, config, label, pairs))
    return results


def run_semantic_load(
    config: LoadConfig, on_step: Callable[[str], None] = lambda _: None
) -> list[PhaseResult]:
    """Every rate's two phases, on a stack of its own (taken down before returning)."""
    on_step("the labelled pairs the model takes, offline")
    pairs = _labelled_stream()
    with tempfile.TemporaryDirectory(prefix="prism-semload-") as state:
        origins = _Origins(Path(state), config.provider_ms)
        try:
            on_step(f"starting Redis, the provider ({config.provider_ms} ms) and two origins")
            origins.start()
            return asyncio.run(_run(config, origins, pairs, on_step))
        finally:
            origins.stop()


def summary(results: list[PhaseResult]) -> list[dict[str, Any]]:
    """One row per rate: the ``on`` phase against its ``off`` floor."""
    rows = []
    for off, on in zip(results[::2], results[1::2], strict=True):
        lookups = sum(on.outcomes.values())
        late = on.outcomes.get("slow", 0) + on.outcomes.get("shed", 0)
        p50_off, p50_on, p99_off, p99_on = off.p(50), on.p(50), off.p(99), on.p(99)
        rows.append(
            {
                "rate": on.rate,
                "lookups": int(lookups),
                "slow_shed_pct": round(100 * late / lookups, 2) if lookups else None,
                "added_p50_ms": _minus(p50_on, p50_off),
                "added_p99_ms": _minus(p99_on, p99_off),
                "semantic_p50_ms": on.p(50, on.semantic_ms),
                "semantic_p99_ms": on.p(99, on.semantic_ms),
                "p50_off_ms": p50_off,
                "p50_on_ms": p50_on,
                "errors": sum(off.errors.values()) + sum(on.errors.values()),
                "embed_cpu_ms": on.embed_cpu_ms,
                "mean_batch": on.mean_batch,
                "origin_cpu_off": off.origin_cpu,
                "origin_cpu_on": on.origin_cpu,
                "origin_rss_mb": on.origin_rss_mb,
            }
        )
    return rows


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 2)
