"""`prism bench semantic --scale N`: what the semantic layer costs with N records in one
partition (a private redis-server on loopback, the real index, embedder and cache).

Measured, in one run:

- filling the partition (N records through the index's own add script), the stream's
  size in Redis (``MEMORY USAGE``), and a new process's first read of it (the whole
  stream into its mirror: time, RSS growth, the mirror's arrays);
- one miss at a time through ``SemanticCache.lookup`` (a question unlike any indexed
  one): its total time, the embedding's own time (until the vector is ready), and the
  lookup's cost beyond the embedding (from the vector being ready to the answer; the
  catch-up read runs meanwhile, so only the part of it that outlasts the embedding
  counts), each p50/p99;
- the parts alone: the catch-up read with nothing new and with one record added by
  another process before each lookup, and the in-memory search;
- the search's recall: queries made at cosine 0.95 from a random indexed record, and
  whether the search returns that record (or one scoring at least as high).

The vectors are random unit vectors around a few hundred centres (questions on a
handful of subjects): what a real partition would hold, as far as cost goes.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from deploy.bench.loadgen import percentile
from deploy.bench.machine import rss_mb
from deploy.local.redis import RedisServer
from origin.connection.redis_pipe import RedisPipe
from origin.store.semantic.cache import SemanticCache
from origin.store.semantic.embedder import Embedder
from origin.store.semantic.engine import predicted_space
from origin.store.semantic.index import RedisStreamIndex, index_key
from origin.store.semantic.partition import Question

__all__ = ["run_scale"]

PARTITION = "0" * 64
CENTRES = 300


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = percentile(ordered, 99)
    return {"p50_ms": round(statistics.median(ordered), 3), "p99_ms": round(p99, 3)}


def _vectors(count: int, seed: int = 1) -> Any:
    import numpy as np

    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((CENTRES, 384)).astype(np.float32)
    matrix = centres[rng.integers(CENTRES, size=count)] + rng.standard_normal((count, 384)).astype(
        np.float32
    )
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix


async def _fill(index: RedisStreamIndex, matrix: Any, expires: int) -> float:
    started = time.perf_counter()
    batch = 500
    for start in range(0, len(matrix), batch):
        await asyncio.gather(
            *[
                index.add(
                    PARTITION,
                    f"{i:064x}",
                    matrix[i].tobytes(),
                    f"synthetic question {i} on subject {i % CENTRES}",
                    expires,
                )
                for i in range(start, min(start + batch, len(matrix)))
            ]
        )
    return time.perf_counter() - started


async def _measure(url: str, count: int, lookups: int) -> dict[str, Any]:
    import numpy as np

    pipe = RedisPipe(url, 5.0)
    admin = RedisPipe(url, 5.0)
    try:
        matrix = _vectors(count)
        expires = int(time.time()) + 3600
        # The records go to the index of the engine the lookups will embed with.
        space = predicted_space("auto")
        writer = RedisStreamIndex(pipe)
        writer.use_space(space)
        fill_s = await _fill(writer, matrix, expires)
        key = index_key(PARTITION, space)
        redis_bytes = int(await admin.execute("MEMORY", "USAGE", key, "SAMPLES", "0"))

        # A new origin process: its first lookup reads the whole partition.
        index = RedisStreamIndex(pipe)
        index.use_space(space)
        rss_before = rss_mb(os.getpid())
        started = time.perf_counter()
        held = await index.refresh(PARTITION)
        cold_s = time.perf_counter() - started
        rss_after = rss_mb(os.getpid())
        mirror = index.mirror(PARTITION)
        assert mirror is not None

        embedder = Embedder(None)
        background: set[asyncio.Future[None]] = set()  # held, as the gateway holds its own

        def spawn(work: Coroutine[Any, Any, None]) -> None:
            background.add(asyncio.ensure_future(work))

        cache = SemanticCache(index, embedder, pipe, CollectorRegistry(), spawn, timeout=10.0)
        await embedder.embed("warm up the model")
        ready: list[float] = []
        embed = embedder.embed

        def timed_embed(text: str, urgent: bool = True) -> Any:
            future = embed(text, urgent)
            future.add_done_callback(lambda _: ready.append(time.perf_counter()))
            return future

        embedder.embed = timed_embed  # type: ignore[method-assign]
        total, embedding, beyond = [], [], []
        for i in range(lookups):
            ready.clear()
            question = Question(PARTITION, f"How many moons does planet number {i} have?")
            started = time.perf_counter()
            match, _ = await cache.lookup(question, 0.95)
            ended = time.perf_counter()
            assert match is None and ready
            total.append((ended - started) * 1000)
            embedding.append((ready[0] - started) * 1000)
            beyond.append((ended - max(ready[0], started)) * 1000)

        refresh_idle, refresh_new, search = [], [], []
        other = RedisStreamIndex(pipe)  # another process, adding records meanwhile
        other.use_space(space)
        query = matrix[0]
        for i in range(lookups):
            started = time.perf_counter()
            await index.refresh(PARTITION)
            refresh_idle.append((time.perf_counter() - started) * 1000)
            await other.add(PARTITION, f"new{i}", matrix[i].tobytes(), f"new {i}", expires)
            started = time.perf_counter()
            await index.refresh(PARTITION)
            refresh_new.append((time.perf_counter() - started) * 1000)
            query = _vectors(1, seed=1000 + i)[0]
            started = time.perf_counter()
            index.nearest(PARTITION, query, 0.95, 16)
            search.append((time.perf_counter() - started) * 1000)

        rng = np.random.default_rng(5)
        found = 0
        exact = np.asarray(matrix, dtype=np.float16).astype(np.float32)
        for _ in range(200):
            target = int(rng.integers(count))
            noise = rng.standard_normal(384).astype(np.float32)
            noise -= (noise @ matrix[target]) * matrix[target]
            noise /= np.linalg.norm(noise)
            query = (0.95 * matrix[target] + np.sqrt(1 - 0.95**2) * noise).astype(np.float32)
            best = float((exact @ query).max())
            got = index.nearest(PARTITION, query, 0.5, 1)
            found += bool(got) and got[0].score >= best - 1e-3
        embedder.close()
        return {
            "records": count,
            "held": held,
            "fill_s": round(fill_s, 2),
            "redis_mb": round(redis_bytes / 2**20, 1),
            "redis_bytes_per_record": round(redis_bytes / count),
            "cold_read_s": round(cold_s, 2),
            "rss_growth_mb": round(rss_after - rss_before, 1),
            "mirror_arrays_mb": round(mirror.nbytes() / 2**20, 1),
            "lookup_miss": _percentiles(total),
            "embedding": _percentiles(embedding),
            "beyond_embedding": _percentiles(beyond),
            "refresh_nothing_new": _percentiles(refresh_idle),
            "refresh_one_new": _percentiles(refresh_new),
            "search": _percentiles(search),
            "recall_at_0_95": found / 200,
            "lookups": lookups,
        }
    finally:
        await pipe.close()
        await admin.close()


def run_scale(count: int, lookups: int = 300) -> dict[str, Any]:
    from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

    threadpool_limits(limits=1, user_api="blas")  # as the origin runs it
    with tempfile.TemporaryDirectory() as tmp, RedisServer(workdir=Path(tmp)) as server:
        result = asyncio.run(_measure(server.url, count, lookups))
    result["cpus"] = os.cpu_count()
    return result


def render_scale(result: dict[str, Any]) -> list[str]:
    """The run in a few lines, for a terminal."""

    def pair(name: str) -> str:
        return f"{result[name]['p50_ms']:.2f} ms p50 / {result[name]['p99_ms']:.2f} ms p99"

    return [
        f"{result['records']:,} records in one partition: Redis {result['redis_mb']} MB "
        f"({result['redis_bytes_per_record']} B each); a new process reads them in "
        f"{result['cold_read_s']} s, its RSS grows {result['rss_growth_mb']} MB "
        f"(arrays {result['mirror_arrays_mb']} MB)",
        f"a miss ({result['lookups']} lookups): {pair('lookup_miss')} in all, of which the "
        f"embedding {pair('embedding')}; beyond the embedding {pair('beyond_embedding')}",
        f"parts alone: catch-up read {pair('refresh_nothing_new')} (nothing new), "
        f"{pair('refresh_one_new')} (one new record); search {pair('search')}",
        f"search recall (queries at cosine 0.95 from an indexed record): "
        f"{result['recall_at_0_95']:.1%}",
    ]
