"""The sentence model's BERT encoder written as an ONNX graph, from its safetensors weights.

``encoder_graph(tensors, config)`` returns the float32 model that ``onnx_model`` then
quantizes (onnxruntime's dynamic int8 quantization) and runs. It computes what the numpy
engine computes (``model.SentenceModel.encode_ids``; float32 graph and numpy agree to
1e-6, tested):

    input_ids, attention_mask (batch, length) int64
    -> word + position embeddings, LayerNorm
    -> 6 layers: Attention, MatMul + SkipLayerNorm, MatMul + BiasGelu, MatMul + SkipLayerNorm
    -> mean over the unmasked tokens, L2-normalized: embeddings (batch, 384) float32

The layers use onnxruntime's fused CPU kernels (the com.microsoft domain): Attention (the
QKV projection, the masked softmax and the context in one node), SkipLayerNormalization
(residual, bias and LayerNorm) and BiasGelu (BERT's exact GELU). The word table is stored
as float16 (23 MB instead of 47; a Gather then a Cast): quantization takes the MatMuls
and Attention only. Built here rather than taken prebuilt: the weights are only the
pinned package's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["OPSET", "encoder_graph"]

OPSET = 20  # LayerNormalization (17) and Gelu (20) as standard ops
_IR_VERSION = 9  # what opset 20's runtimes read
_MS = "com.microsoft"  # onnxruntime's contrib operators


class _Graph:
    """Nodes and initializers added in order, each output named after its node."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def const(self, name: str, value: npt.NDArray[Any]) -> str:
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def op(self, kind: str, *inputs: str, **attributes: Any) -> str:
        self._count += 1
        output = f"{kind.lower()}_{self._count}"
        self.nodes.append(helper.make_node(kind, list(inputs), [output], name=output, **attributes))
        return output

    def weight(self, name: str, t: dict[str, npt.NDArray[Any]]) -> str:
        # Stored (in, out) for MatMul: a MatMul with a constant weight is what the dynamic
        # quantization turns into an int8 one.
        return self.const(f"{name}.weight", np.ascontiguousarray(t[f"{name}.weight"].T, np.float32))

    def bias(self, name: str, t: dict[str, npt.NDArray[Any]]) -> str:
        return self.const(f"{name}.bias", t[f"{name}.bias"].astype(np.float32))

    def layer_norm(self, x: str, name: str, t: dict[str, npt.NDArray[Any]], eps: float) -> str:
        gamma = self.const(f"{name}.weight", t[f"{name}.weight"].astype(np.float32))
        beta = self.const(f"{name}.bias", t[f"{name}.bias"].astype(np.float32))
        return self.op("LayerNormalization", x, gamma, beta, axis=-1, epsilon=eps)

    def dense_norm(self, x: str, residual: str, t: dict[str, npt.NDArray[Any]], dense: str,
                   norm: str, eps: float) -> str:  # fmt: skip
        """LayerNorm(x @ W + b + residual), the end of each half of a layer."""
        projected = self.op("MatMul", x, self.weight(dense, t))
        gamma = self.const(f"{norm}.weight", t[f"{norm}.weight"].astype(np.float32))
        beta = self.const(f"{norm}.bias", t[f"{norm}.bias"].astype(np.float32))
        return self.op("SkipLayerNormalization", projected, residual, gamma, beta,
                       self.bias(dense, t), domain=_MS, epsilon=eps)  # fmt: skip


def encoder_graph(tensors: dict[str, npt.NDArray[Any]], config: dict[str, Any]) -> onnx.ModelProto:
    """The float32 encoder for these weights (a sentence-transformers BERT model's)."""
    dim = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    eps = float(config.get("layer_norm_eps", 1e-12))
    prefix = "bert." if "bert.embeddings.word_embeddings.weight" in tensors else ""
    t = {name[len(prefix) :]: value for name, value in tensors.items()}
    g = _Graph()

    # Embeddings: the (single) token type folded into the position table, as in model.py.
    words = g.const("words", t["embeddings.word_embeddings.weight"].astype(np.float16))
    positions = g.const(
        "positions",
        (
            t["embeddings.position_embeddings.weight"]
            + t["embeddings.token_type_embeddings.weight"][0]
        ).astype(np.float32),
    )
    zero = g.const("zero", np.array([0], dtype=np.int64))
    length = g.op("Shape", "input_ids", start=1, end=2)
    x = g.op("Cast", g.op("Gather", words, "input_ids"), to=TensorProto.FLOAT)
    x = g.op("Add", x, g.op("Slice", positions, zero, length, zero))
    x = g.layer_norm(x, "embeddings.LayerNorm", t, eps)

    # The encoder layers in onnxruntime's fused CPU kernels (the com.microsoft domain):
    # Attention (QKV projection, masked softmax, context), SkipLayerNormalization (the
    # residual Add, the bias and the LayerNorm) and BiasGelu. At batch 1 a BERT this small
    # is dominated by per-node overhead, so fewer, larger nodes are most of the speed.
    mask = g.op("Cast", "attention_mask", to=TensorProto.INT32)  # 1 for tokens, 0 for padding
    for i in range(int(config["num_hidden_layers"])):
        p = f"encoder.layer.{i}"
        a = f"{p}.attention"
        names = [f"{a}.self.{n}" for n in ("query", "key", "value")]
        qkv = np.concatenate([t[f"{n}.weight"] for n in names]).T
        weights = g.const(f"{p}.qkv.weight", np.ascontiguousarray(qkv, np.float32))
        qkv_bias = np.concatenate([t[f"{n}.bias"] for n in names]).astype(np.float32)
        bias = g.const(f"{p}.qkv.bias", qkv_bias)
        context = g.op("Attention", x, weights, bias, mask, domain=_MS, num_heads=heads)
        x = g.dense_norm(context, x, t, f"{a}.output.dense", f"{a}.output.LayerNorm", eps)
        hidden = g.op("MatMul", x, g.weight(f"{p}.intermediate.dense", t))
        hidden = g.op("BiasGelu", hidden, g.bias(f"{p}.intermediate.dense", t), domain=_MS)
        x = g.dense_norm(hidden, x, t, f"{p}.output.dense", f"{p}.output.LayerNorm", eps)

    # Mean over the real tokens, then unit length (cosine = dot product).
    axis_tokens = g.const("axis_tokens", np.array([1], dtype=np.int64))
    axis_last = g.const("axis_last", np.array([-1], dtype=np.int64))
    weights = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)
    summed = g.op("ReduceSum", g.op("Mul", x, g.op("Unsqueeze", weights, axis_last)), axis_tokens,
                  keepdims=0)  # fmt: skip
    counts = g.op("ReduceSum", weights, axis_tokens, keepdims=1)
    pooled = g.op("Div", summed, counts)
    g.nodes.append(
        helper.make_node("LpNormalization", [pooled], ["embeddings"], name="normalize", axis=-1)
    )

    graph = helper.make_graph(
        g.nodes,
        "sentence_encoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "length"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "length"]),
        ],
        [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", dim])],
        g.initializers,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(_MS, 1)]
    )
    model.ir_version = _IR_VERSION
    return model
