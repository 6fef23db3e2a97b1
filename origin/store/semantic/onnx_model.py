"""The fast engine: the sentence model as an int8 ONNX graph run by onnxruntime.

The graph is built here from the pinned package's safetensors (``onnx_graph``), its
MatMul and Attention weights quantized to int8 by onnxruntime's own dynamic quantization
(per output channel, 7-bit range: this CPU class has no VNNI, where full-range int8
products can saturate), and the result cached in ``PRISM_SEMANTIC_CACHE_DIR`` under a
name that digests the weights, the graph's version and onnxruntime's, so a new model or
runtime builds anew and nothing is ever fetched. The build runs in a child process
(``python -m origin.store.semantic.onnx_model SRC OUT``): it peaks at ~500 MB, which
the origin then never holds; the cached file is written under a temporary name and
renamed, so origins building at once never read half a file.

Measured in ``prism bench semantic``: cosine with the float32 numpy engine ≥ 0.98 on
every labelled text (0.994 on average), about a fifth of its CPU per embedding.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .tokens import Vocabulary

__all__ = ["GRAPH_VERSION", "OnnxSentenceModel", "build", "cached_model"]

GRAPH_VERSION = 1  # bump when onnx_graph or the quantization changes what is built
Vector = npt.NDArray[np.float32]


def _digest(directory: Path) -> str:
    import onnxruntime

    digest = hashlib.sha256(f"graph {GRAPH_VERSION} ort {onnxruntime.__version__}".encode())
    for name in ("config.json", "model.safetensors"):
        with (directory / name).open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()[:20]


def cached_model(directory: Path, cache_dir: Path) -> Path:
    """The int8 model for ``directory``, built into ``cache_dir`` on first use."""
    name = directory.parent.name if directory.name == "model" else directory.name
    target = cache_dir / f"{name}-{_digest(directory)}-int8.onnx"
    if target.is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=cache_dir, suffix=".building")
    os.close(handle)
    try:
        subprocess.run(
            [sys.executable, "-m", __name__, str(directory), temporary],
            check=True,
            capture_output=True,
            timeout=600,
        )
        os.chmod(temporary, 0o644)  # mkstemp makes it private; other users may read it
        os.replace(temporary, target)
    except subprocess.CalledProcessError as error:
        tail = error.stderr.decode(errors="replace").strip().splitlines()[-1:]
        raise RuntimeError(f"building the ONNX model failed: {' '.join(tail)}") from None
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return target


def build(directory: Path, out: Path) -> None:
    """The float32 graph from ``directory``'s weights, quantized to int8 into ``out``."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from .model import load_safetensors
    from .onnx_graph import encoder_graph

    config = json.loads((directory / "config.json").read_text())
    graph = encoder_graph(load_safetensors(directory / "model.safetensors"), config)
    onnx.checker.check_model(graph)
    with tempfile.TemporaryDirectory(dir=out.parent) as scratch:
        fp32 = Path(scratch) / "fp32.onnx"
        onnx.save(graph, fp32)
        del graph
        quantize_dynamic(
            fp32,
            out,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul", "Attention"],
            per_channel=True,
            reduce_range=True,
            # Shape inference stops at the contrib ops; every tensor quantized is float32.
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )


class OnnxSentenceModel:
    """``encode(texts)``: one unit-length float32 vector per text, like ``SentenceModel``."""

    def __init__(self, directory: Path, cache_dir: Path, threads: int = 1) -> None:
        import onnxruntime

        self.vocabulary = Vocabulary(directory)
        self.name = self.vocabulary.name
        self.tokens = self.vocabulary.tokens
        config = json.loads((directory / "config.json").read_text())
        self.dimensions: int = int(config["hidden_size"])
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        # Idle pool threads sleep instead of spinning: the event loop needs those cores.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3  # errors only: no notes on the log at load
        self.path = cached_model(directory, cache_dir)
        self._session = onnxruntime.InferenceSession(
            str(self.path), options, providers=["CPUExecutionProvider"]
        )

    def encode_ids(self, batch: list[list[int]]) -> Vector:
        """Vectors for token-id lists, one model run each: the int8 kernels quantize their
        input with one scale per run, so a text run in a batch would take its range from
        the other texts too (cosine 0.987 with itself run alone, measured), and a batch
        saves no CPU here (the products are as large per token either way)."""
        out = np.empty((len(batch), self.dimensions), dtype=np.float32)
        for row, seq in enumerate(batch):
            ids = np.asarray([seq], dtype=np.int64)
            feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
            outputs: list[Any] = self._session.run(None, feed)
            out[row] = outputs[0][0]
        return out

    def encode(self, texts: list[str]) -> Vector:
        return self.encode_ids([self.tokens(text) for text in texts])


if __name__ == "__main__":  # the child process cached_model starts
    build(Path(sys.argv[1]), Path(sys.argv[2]))
