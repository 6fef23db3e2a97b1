"""The semantic layer: after the exact lookup missed, before the provider is called.

``lookup`` starts the question's embedding (in the embedder's thread) and, meanwhile,
catches up with the question's partition in the index (only what was added since this
process last read it); an empty partition is a miss at once, without waiting for the
model. Otherwise the best candidates that pass the lexical guard and whose score, weighed
by the words they share with the question (``guard.judged``), is at or above the project's
threshold are read from Redis in one ``MGET``, and the first
that is still a valid entry is the answer. A candidate whose
entry is gone is removed from the index, never served.

A miss carries its question (``Pending``) to the store: once the answer's entry is in
Redis, the question's vector is indexed with the entry's expiry (in this process's mirror
at once, then in Redis, whose subscribers hear of it: ``index``, ``notify``).

Back-pressure: when the embeddings queued ahead of a new lookup would take longer than
``max_wait`` (``Embedder.wait_estimate``), or they and its own would outlast the timeout,
or the model is still loading, the lookup skips the semantic layer at once (``shed``)
instead of joining the queue; its text is still embedded, after the lookups, so its
answer is indexed all the same. So an embedder short of CPU (a burst past its rate, a
noisy neighbour) serves what it can at a bounded wait, and sheds the rest at no wait,
instead of making every lookup wait out the timeout behind a queue that never drains.

Nothing here fails a request: Redis errors, a slow or missing model are misses.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from prometheus_client import Counter

from prism import Envelope, decode_envelope, entry_key

from ...connection.redis_client import RedisClient, RedisClientError
from ...metrics import Metrics
from ...settings import Settings
from .embedder import Embedder, EmbedderUnavailable
from .engine import auto_threads, predicted_space
from .guard import MAX_LEXICAL_BOOST, judged
from .index import RedisStreamIndex, SemanticIndex, _retrieve
from .notify import IndexNotifier
from .partition import Question, normalized

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from .model import Vector

__all__ = ["Match", "Pending", "SemanticCache", "build_semantic_cache"]

log = logging.getLogger("prism.origin")

MAX_CANDIDATES = 3  # entries read per hit attempt: the best few, in case the best is gone
SHORTLISTED = 16  # the best-scoring records the guard is asked about
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)  # up to the embedder's MAX_BATCH, the largest call


class Match(NamedTuple):
    envelope: Envelope
    fingerprint: str  # the matched entry's
    score: float


class Pending(NamedTuple):
    """A question on its way to the provider: indexed once its answer is stored."""

    partition: str
    text: str
    vector: asyncio.Future[Vector | None]


class SemanticCache:
    def __init__(
        self,
        index: SemanticIndex,
        embedder: Embedder,
        redis: RedisClient,
        registry: CollectorRegistry,
        spawn: Callable[[Coroutine[Any, Any, None]], object],
        timeout: float = 0.25,
        redis_url: str | None = None,
        max_wait: float = 0.03,
    ) -> None:
        self.index = index
        self._spawn = spawn  # the gateway's: work after the response, awaited at shutdown
        self.embedder = embedder
        self._redis = redis
        self._timeout = timeout
        self._max_wait = max_wait
        self.outcomes = Counter(
            "prism_semantic_lookups",
            "Semantic cache lookups by outcome: hit, miss, empty (no entry in the partition),"
            " slow (the embedding or the index read took longer than PRISM_SEMANTIC_TIMEOUT),"
            " shed (skipped at once: the embeddings queued would take longer than"
            " PRISM_SEMANTIC_MAX_WAIT),"
            " stale (the best candidate's entry was gone), too_long (or characters the model"
            " cannot see), unavailable, error.",
            ("outcome",),
            registry=registry,
        )
        self.indexed = Counter(
            "prism_semantic_indexed", "Questions added to the semantic index.", registry=registry
        )
        self._reading: set[asyncio.Future[int]] = set()  # catch-ups outliving their lookup
        self.notifier: IndexNotifier | None = None
        if redis_url is not None and isinstance(index, RedisStreamIndex):
            self.notifier = IndexNotifier(redis_url, index.notified, index.notified_all)
        _embedding_metrics(embedder, registry)

    @property
    def available(self) -> bool:
        return self.embedder.failed is None

    def pending(self, question: Question, urgent: bool = False) -> Pending:
        """Start embedding ``question`` for the index only (a request that may not read)."""
        vector = self._embed(normalized(question.text), urgent)
        return Pending(question.partition, question.text, vector)

    def _embed(self, text: str, urgent: bool) -> asyncio.Future[Vector | None]:
        self._started()
        future = self.embedder.embed(text, urgent)
        # Retrieved even when nobody awaits it (a miss whose answer is never stored).
        future.add_done_callback(_retrieve)
        return future

    async def lookup(
        self, question: Question, threshold: float
    ) -> tuple[Match | None, Pending | None]:
        """The entry answering ``question`` (if any), and the question for the store."""
        if self._overloaded():
            self.outcomes.labels("shed").inc()
            return None, self.pending(question)
        pending = self.pending(question, urgent=True)
        # A partition this process has not read yet may be large (5 s for 100,000
        # records): the read goes on in the background, and this question is a miss.
        refresh = asyncio.ensure_future(self.index.refresh(question.partition))
        refresh.add_done_callback(_retrieve)
        deadline = asyncio.get_running_loop().time() + self._timeout  # for both waits
        try:
            async with asyncio.timeout_at(deadline):
                indexed = await asyncio.shield(refresh)
        except TimeoutError:
            self._reading.add(refresh)
            refresh.add_done_callback(self._reading.discard)
            self.outcomes.labels("slow").inc()
            return None, pending
        except RedisClientError as error:
            log.debug("semantic index read failed: %s", error)
            self.outcomes.labels("error").inc()
            return None, pending
        if not indexed:
            self.outcomes.labels("empty").inc()
            return None, pending
        try:
            async with asyncio.timeout_at(deadline):
                vector = await asyncio.shield(pending.vector)
        except TimeoutError:
            self.outcomes.labels("slow").inc()
            return None, pending
        except EmbedderUnavailable:
            self.outcomes.labels("unavailable").inc()
            return None, None
        if vector is None:
            self.outcomes.labels("too_long").inc()
            return None, None
        candidates = self._agreeing(question, vector, threshold)
        if not candidates:
            self.outcomes.labels("miss").inc()
            return None, pending
        try:
            entries = await self._redis.execute("MGET", *[entry_key(fp) for fp, _ in candidates])
        except RedisClientError as error:
            log.debug("semantic candidate read failed: %s", error)
            self.outcomes.labels("error").inc()
            return None, pending
        now = time.time()
        for (fp, score), raw in zip(candidates, entries, strict=True):
            envelope = decode_envelope(raw, now) if raw is not None else None
            if envelope is not None:
                self.outcomes.labels("hit").inc()
                return Match(envelope, fp, score), pending
            self._spawn(self._forget(question.partition, fp))
        self.outcomes.labels("stale").inc()
        return None, pending

    def _overloaded(self) -> bool:
        embedder = self.embedder
        ahead = embedder.wait_estimate()
        if ahead is None or embedder.cost is None:  # loading (or never asked): shed only
            return embedder.backlog > 0  # behind a load under way
        # A queue too long to join, or one whose wait with this text's own embedding would
        # outlast the timeout; a lookup with nothing ahead of it is never shed by the first.
        return ahead > self._max_wait or ahead + embedder.cost > self._timeout

    def _started(self) -> None:
        # The first opted-in question: subscribe to new records from other processes, and
        # index the engine's own vectors once it is known.
        if self.notifier is not None:
            self.notifier.start()
        space = self.embedder.space
        if space is not None and isinstance(self.index, RedisStreamIndex):
            self.index.use_space(space)

    def _agreeing(
        self, question: Question, vector: Vector, threshold: float
    ) -> list[tuple[str, float]]:
        """The best indexed questions whose judged score (``guard.judged``) is at or above
        ``threshold`` (best first, at most ``MAX_CANDIDATES``), with that score."""
        found: list[tuple[str, float]] = []
        # Shortlisted by cosine down to the most the words' weighing can add to a score.
        bound = threshold - MAX_LEXICAL_BOOST
        for candidate in self.index.nearest(question.partition, vector, bound, SHORTLISTED):
            score = judged(question.text, candidate.text, candidate.score)
            if score is not None and score >= threshold:
                found.append((candidate.fingerprint, score))
        found.sort(key=lambda item: -item[1])
        return found[:MAX_CANDIDATES]

    async def _forget(self, partition: str, fingerprint: str) -> None:
        try:
            await self.index.remove(partition, fingerprint)
        except RedisClientError as error:
            log.debug("removing a stale semantic record failed: %s", error)

    async def add(self, pending: Pending, fingerprint: str, expires: int) -> None:
        """Index ``pending``'s question for the entry just stored under ``fingerprint``."""
        try:
            vector = await pending.vector
        except EmbedderUnavailable:
            return
        if vector is None:
            return
        self._started()  # the engine is known now: its own index
        try:
            await self.index.add(
                pending.partition,
                fingerprint,
                vector.astype("<f4").tobytes(),
                pending.text,
                expires,
            )
        except RedisClientError as error:
            log.debug("semantic index write failed: %s", error)
            return
        self.indexed.inc()

    def close(self) -> None:
        if self.notifier is not None:
            self.notifier.stop()
        if isinstance(self.index, RedisStreamIndex):
            self.index.stop()
        self.embedder.close()


def _embedding_metrics(embedder: Embedder, registry: CollectorRegistry) -> None:
    """The embedder's own counts, read at each scrape (it counts in its thread)."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    class Collector:
        def collect(self) -> Any:
            yield CounterMetricFamily(
                "prism_semantic_embedded_questions",
                "Questions embedded (lookups and texts only indexed).",
                embedder.questions,
            )
            yield CounterMetricFamily(
                "prism_semantic_embedding_batches", "Model calls (one per batch).", embedder.batches
            )
            yield CounterMetricFamily(
                "prism_semantic_embedding_cpu_seconds",
                "CPU time of the embedding thread in model calls.",
                embedder.cpu_seconds,
            )
            yield CounterMetricFamily(
                "prism_semantic_embedding_wall_seconds",
                "Wall time of model calls.",
                embedder.seconds,
            )
            yield GaugeMetricFamily(
                "prism_semantic_embedding_queue", "Texts waiting to be embedded.", embedder.queued
            )
            sizes = dict(embedder.sizes)  # a copy: the thread adds to it
            buckets, below = [], 0
            for bound in _BATCH_BUCKETS:
                below += sum(n for size, n in sizes.items() if bound // 2 < size <= bound)
                buckets.append((str(bound), below))
            buckets.append(("+Inf", sum(sizes.values())))
            yield HistogramMetricFamily(
                "prism_semantic_embedding_batch_size",
                "Texts per model call: how much a burst of misses is batched.",
                buckets=buckets,
                sum_value=sum(size * n for size, n in sizes.items()),
            )

    registry.register(Collector())


def build_semantic_cache(
    settings: Settings,
    redis: RedisClient,
    metrics: Metrics,
    spawn: Callable[[Coroutine[Any, Any, None]], object],
) -> SemanticCache | None:
    """The semantic layer for these settings; None when ``PRISM_SEMANTIC_MODEL=off``.
    Nothing is loaded here: the model loads on the first opted-in request."""
    model = settings.semantic_model
    if model == "off":
        return None
    threads = settings.semantic_threads or auto_threads()
    embedder = Embedder(
        None if model == "auto" else Path(model),
        threads,
        settings.semantic_engine,
        Path(settings.semantic_cache_dir) if settings.semantic_cache_dir else None,
        in_process=not settings.semantic_process,
    )
    index = RedisStreamIndex(redis)
    index.use_space(predicted_space(settings.semantic_engine))
    return SemanticCache(
        index,
        embedder,
        redis,
        metrics.registry,
        spawn,
        settings.semantic_timeout,
        settings.redis_url,
        settings.semantic_max_wait,
    )
