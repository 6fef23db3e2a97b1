"""`prism bench semantic --pairs FILE`: the semantic cache's decisions on labelled pairs
from outside the repository (JSON lines ``{"a": ..., "b": ..., "same": true|false}``).

Each pair is asked as the cache would meet it: ``a`` was answered and indexed, ``b`` is
asked in the same partition. It is a hit when the guard lets it through and the cosine
similarity of the normalized texts, weighed by the words they share (``guard.judged``),
is at or above the threshold, as the origin decides. Counted per file and
threshold: the hit rate on pairs labelled ``same`` and the wrong-hit rate on pairs
labelled different (with and without the guard). Written: a JSON report and a PNG of
both rates against the threshold.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from origin.store.semantic.embedder import MAX_BATCH
from origin.store.semantic.guard import judged
from origin.store.semantic.partition import MAX_TEXT_CHARS, normalized

from .charts import NO_MATPLOTLIB, pyplot
from .semantic import hit_at

__all__ = [
    "LabelledPair",
    "PairsReport",
    "SweepRow",
    "load_labelled",
    "plot",
    "render_pairs",
    "run_pairs",
]

SWEEP = tuple(round(0.80 + 0.01 * i, 2) for i in range(20))  # 0.80 .. 0.99


@dataclass(frozen=True)
class LabelledPair:
    a: str
    b: str
    same: bool


def load_labelled(path: Path) -> list[LabelledPair]:
    """The file's pairs; a line without two strings and a boolean ``same`` is an error."""
    pairs = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        a, b, same = row.get("a"), row.get("b"), row.get("same", row.get("match"))
        if not (isinstance(a, str) and isinstance(b, str) and isinstance(same, bool)):
            raise ValueError(f"{path.name}:{number}: want {{'a': str, 'b': str, 'same': bool}}")
        pairs.append(LabelledPair(a, b, same))
    return pairs


@dataclass
class SweepRow:
    threshold: float
    hit_rate: float  # pairs labelled same, answered
    wrong_hit_rate: float  # pairs labelled different, answered
    hit_rate_unguarded: float
    wrong_hit_rate_unguarded: float


@dataclass
class PairsReport:
    file: str
    pairs: int
    same: int
    different: int
    skipped: int  # pairs the origin would never compare (too long, unknown characters)
    threshold: float
    rows: list[SweepRow]
    wrong_hits: list[dict[str, Any]]  # at the chosen threshold, guard on (the first 50)

    def at(self, threshold: float) -> SweepRow:
        return next(row for row in self.rows if row.threshold == threshold)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _embed_all(model: Any, texts: list[str]) -> dict[str, Any]:
    """Vectors by normalized text (None when over the model's token limit)."""
    from origin.store.semantic.tokens import Incomparable

    vectors: dict[str, Any] = {}
    fitting: list[tuple[str, list[int]]] = []
    for text in texts:
        try:
            fitting.append((text, model.tokens(text)))
        except Incomparable:
            vectors[text] = None
    fitting.sort(key=lambda item: len(item[1]))  # like lengths together: less padding
    for start in range(0, len(fitting), MAX_BATCH):
        chunk = fitting[start : start + MAX_BATCH]
        encoded = model.encode_ids([ids for _, ids in chunk])
        vectors.update(zip([text for text, _ in chunk], encoded, strict=True))
    return vectors


def run_pairs(model: Any, path: Path, threshold: float) -> PairsReport:
    pairs = load_labelled(path)
    usable = [p for p in pairs if max(len(p.a), len(p.b)) <= MAX_TEXT_CHARS]
    vectors = _embed_all(model, sorted({normalized(t) for p in usable for t in (p.a, p.b)}))
    scored: list[tuple[LabelledPair, float, float | None]] = []
    for p in usable:
        va, vb = vectors[normalized(p.a)], vectors[normalized(p.b)]
        if va is None or vb is None:
            continue
        cosine = float(va @ vb)
        scored.append((p, cosine, judged(p.b, p.a, cosine)))  # b asked, a indexed
    same = [s for s in scored if s[0].same]
    different = [s for s in scored if not s[0].same]

    def rate(
        group: list[tuple[LabelledPair, float, float | None]], t: float, guarded: bool
    ) -> float:
        hits = sum(1 for _, cosine, score in group if hit_at(cosine, score, t, guarded))
        return hits / len(group) if group else 0.0

    rows = [
        SweepRow(
            t,
            rate(same, t, True),
            rate(different, t, True),
            rate(same, t, False),
            rate(different, t, False),
        )
        for t in sorted({*SWEEP, threshold})
    ]
    wrong = [
        {"a": p.a, "b": p.b, "score": round(score, 4)}
        for p, _, score in sorted(different, key=lambda x: -x[1])
        if score is not None and score >= threshold
    ]
    return PairsReport(
        file=path.name,
        pairs=len(pairs),
        same=len(same),
        different=len(different),
        skipped=len(pairs) - len(scored),
        threshold=threshold,
        rows=rows,
        wrong_hits=wrong[:50],
    )


def plot(reports: list[PairsReport], threshold: float, out: Path) -> Path:
    """One PNG: hit rate (same pairs) and wrong-hit rate (different pairs) per file,
    against the threshold, the chosen threshold marked."""
    plt = pyplot()
    if plt is None:
        raise ImportError(NO_MATPLOTLIB)
    fig, (hits, wrong) = plt.subplots(1, 2, figsize=(9, 3.6), dpi=90)
    for report in reports:
        xs = [row.threshold for row in report.rows]
        if report.same:
            rates = [100 * r.hit_rate for r in report.rows]
            hits.plot(xs, rates, marker=".", label=report.file)
        if report.different:
            rates = [100 * r.wrong_hit_rate for r in report.rows]
            wrong.plot(xs, rates, marker="x", label=report.file)
    hits.set_title("hits on pairs labelled same", fontsize=9)
    hits.set_ylim(0, 100)
    wrong.set_title("wrong hits on pairs labelled different", fontsize=9)
    wrong.axhline(1.0, color="red", linewidth=0.6, linestyle=":")
    wrong.set_ylim(bottom=0)
    for ax in (hits, wrong):
        ax.axvline(threshold, color="grey", linewidth=0.8)
        ax.set_xlabel("threshold (cosine similarity), guard on", fontsize=8)
        ax.set_ylabel("% of pairs answered from the cache", fontsize=8)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def render_pairs(reports: list[PairsReport], threshold: float) -> Any:
    """A rich table: per file and threshold, hits on same pairs and wrong hits on others."""
    from rich.table import Table

    table = Table(title="Semantic cache on labelled pairs (b asked after a was cached)")
    for column in ("file", "threshold", "hits on same", "wrong hits", "hits*", "wrong hits*"):
        table.add_column(column, justify="right")
    for report in reports:
        for row in report.rows:
            mark = " <" if row.threshold == threshold else ""
            table.add_row(
                f"{report.file} ({report.same} same, {report.different} not)",
                f"{row.threshold:.2f}{mark}",
                f"{row.hit_rate:.1%}" if report.same else "-",
                f"{row.wrong_hit_rate:.2%}" if report.different else "-",
                f"{row.hit_rate_unguarded:.1%}" if report.same else "-",
                f"{row.wrong_hit_rate_unguarded:.2%}" if report.different else "-",
            )
    return table
