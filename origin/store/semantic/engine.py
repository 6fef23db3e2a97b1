"""Which engine runs the sentence model: onnxruntime (int8) where it is installed, else numpy.

``PRISM_SEMANTIC_ENGINE``: ``auto`` (onnxruntime, falling back to numpy when it cannot
be imported or its model cannot be built), ``onnx`` or ``numpy``. Both read the same
model directory and give unit vectors of the same width from the same tokens; their
scores differ by int8 rounding (a few thousandths on average), so each writes its own
index (``space``): a partition's records are only ever compared with vectors of the same
engine.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ...settings import SEMANTIC_ENGINES as ENGINES
from ...settings import SemanticEngine as Engine

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "ENGINES",
    "EncodingModel",
    "Engine",
    "auto_threads",
    "limit_blas_threads",
    "load_model",
    "predicted_space",
    "space",
    "space_of",
]

log = logging.getLogger("prism.origin")

# Models loaded in this process, by engine and directory: read-only once loaded, so
# origins in one process (tests, benchmarks) share one copy.
_LOADED: dict[tuple[str, Path], EncodingModel] = {}
_LOADING = threading.Lock()


class EncodingModel(Protocol):
    name: str
    dimensions: int

    def tokens(self, text: str) -> list[int]: ...

    def encode_ids(self, batch: list[list[int]]) -> npt.NDArray[np.float32]: ...


def space(model: EncodingModel) -> str:
    """The index a model's vectors go to: "" for numpy's float32 (the first index),
    "int8" for onnxruntime's."""
    return space_of(type(model).__name__)


def space_of(kind: str) -> str:
    """``space`` by the model's class name (a model loaded in another process)."""
    return "" if kind == "SentenceModel" else "int8"


def predicted_space(engine: Engine) -> str:
    """The index ``engine`` will use, before its model is loaded (corrected once it is,
    should the onnxruntime model fail to build and ``auto`` fall back to numpy)."""
    if engine == "numpy":
        return ""
    return "int8" if importlib.util.find_spec("onnxruntime") is not None else ""


def auto_threads() -> int:
    """The cores this process may run on, less one for the event loop (at least one)."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


def load_model(engine: Engine, directory: Path, cache_dir: Path, threads: int) -> EncodingModel:
    """The model in ``directory`` on ``engine`` (loaded once per process)."""
    with _LOADING:
        if engine in ("auto", "onnx"):
            model = _LOADED.get(("onnx", directory))
            if model is not None:
                return model
            try:
                from .onnx_model import OnnxSentenceModel

                model = _LOADED[("onnx", directory)] = OnnxSentenceModel(
                    directory, cache_dir, threads
                )
                return model
            except (ImportError, RuntimeError, OSError) as error:
                if engine == "onnx":
                    raise
                log.warning("semantic cache: onnxruntime unavailable (%s); using numpy", error)
        model = _LOADED.get(("numpy", directory))
        if model is None:
            from .model import SentenceModel

            # Small matrices: BLAS threads beyond the ones given only contend for the
            # cores the event loop needs.
            limit_blas_threads(threads)
            model = _LOADED[("numpy", directory)] = SentenceModel(directory)
        return model


def limit_blas_threads(threads: int) -> None:
    """numpy's matrix products (BLAS) on at most ``threads`` threads in this process.

    OpenBLAS's idle threads spin for milliseconds after each product before they sleep:
    the index scoring a partition (4,096 rows every 5 ms, on the event loop's thread) cost
    5.5 ms of CPU a product on two threads against 0.75 on one, the second thread keeping
    a core busy beside the model (``prism bench semantic --load`` at 200 misses a second:
    0.7-2.1 % of lookups slow or shed and +8-13 ms on the p50, against 0-1 % and +4-6 ms)."""
    try:
        import numpy  # noqa: F401  # threadpoolctl limits the libraries loaded, only
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]
    except ImportError:  # numpy's own defaults, then
        return
    threadpool_limits(limits=threads, user_api="blas")
