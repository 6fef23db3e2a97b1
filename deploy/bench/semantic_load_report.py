"""`prism bench semantic --load`'s output: a row per rate (the ``on`` phase against its
``off`` floor), the labelled pairs' outcomes, and the issue's bounds checked."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from .semantic_load import OTHER_ORIGIN_AFTER, SAME_ORIGIN_AFTER, LoadConfig, PhaseResult, summary

__all__ = ["judge", "render_load", "write_load"]

JUDGED_RATE = 200  # the rate the bounds hold at
MAX_LATE_PCT = 1.0  # slow + shed, of the lookups
MAX_ADDED_P50_MS = 3.0
# Of the paraphrases the model takes offline, found under load (the lowest rate): an index
# that lagged behind its stores would find almost none; a lookup the machine made slow, a few.
MIN_FRESH_HIT_PCT = 95.0


def _pct(hits: int, of: int) -> float | None:
    return round(100 * hits / of, 1) if of else None


def _pairs(result: PhaseResult) -> dict[str, Any]:
    counts = result.pairs
    out: dict[str, Any] = {}
    for kind in ("paraphrase", "near_miss"):
        for where in ("same", "other"):
            asked, hits = counts.get(f"{kind}_{where}", 0), counts.get(f"{kind}_{where}_hit", 0)
            out[f"{kind}_{where}"] = {"asked": asked, "hits": hits, "pct": _pct(hits, asked)}
    return out


def judge(results: list[PhaseResult]) -> list[dict[str, Any]]:
    """The checks, each ``{"ok", "check", "measured"}``."""
    checks: list[dict[str, Any]] = []

    def check(ok: bool, what: str, measured: str) -> None:
        checks.append({"ok": ok, "check": what, "measured": measured})

    wrong = sum(
        p.pairs.get("near_miss_same_hit", 0) + p.pairs.get("near_miss_other_hit", 0)
        + p.layers.get("semantic", 0)
        for p in results
    )  # fmt: skip
    check(wrong == 0, "no wrong hit (near misses, unrelated questions)", f"{wrong}")
    failed = sum(sum(p.errors.values()) for p in results)
    check(failed == 0, "every request answered 200", f"{failed} not")
    for row in summary(results):
        if row["rate"] != JUDGED_RATE:
            continue
        late, added = row["slow_shed_pct"], row["added_p50_ms"]
        check(
            late is not None and late <= MAX_LATE_PCT,
            f"slow + shed <= {MAX_LATE_PCT:g} % of lookups at {JUDGED_RATE}/s",
            f"{late} % of {row['lookups']}",
        )
        check(
            added is not None and added <= MAX_ADDED_P50_MS,
            f"added p50 <= {MAX_ADDED_P50_MS:g} ms at {JUDGED_RATE}/s",
            f"{added} ms",
        )
    lowest = next((p for p in results if p.semantic), None)
    if lowest is not None:
        pairs = _pairs(lowest)
        for where, after in (("same", SAME_ORIGIN_AFTER), ("other", OTHER_ORIGIN_AFTER)):
            found = pairs[f"paraphrase_{where}"]
            check(
                found["pct"] is not None and found["pct"] >= MIN_FRESH_HIT_PCT,
                f"paraphrases found {after * 1000:.0f} ms after, {where} origin "
                f"(>= {MIN_FRESH_HIT_PCT:g} %), at {lowest.rate}/s",
                f"{found['hits']} / {found['asked']}",
            )
    return checks


def _ms(value: object) -> str:
    return "-" if value is None else f"{value} ms"


def render_load(result: Mapping[str, Any]) -> RenderableType:
    config = result["config"]
    table = Table(
        title=(
            f"prism bench semantic --load: unique misses for {config['duration']:g} s per "
            f"phase, provider {config['provider_ms']} ms, semantic off then on"
        )
    )
    for column in ("misses/s", "lookups", "slow+shed", "p50 off / on", "added p50 / p99",
                   "lookup p50 / p99",
                   "embed CPU", "mean batch", "origin cores off / on", "RSS", "paraphrase hits",
                   "wrong"):  # fmt: skip
        table.add_column(column)
    phases = {(p["rate"], p["semantic"]): p for p in result["phases"]}
    for row in result["rows"]:
        pairs = phases[(row["rate"], True)]["pairs_found"]
        same, other = pairs["paraphrase_same"], pairs["paraphrase_other"]
        wrong = pairs["near_miss_same"]["hits"] + pairs["near_miss_other"]["hits"]
        table.add_row(
            str(row["rate"]),
            str(row["lookups"]),
            f"{row['slow_shed_pct']} %",
            f"{row['p50_off_ms']} / {row['p50_on_ms']} ms",
            f"{row['added_p50_ms']} / {row['added_p99_ms']} ms",
            f"{row['semantic_p50_ms']} / {row['semantic_p99_ms']} ms",
            _ms(row["embed_cpu_ms"]),
            str(row["mean_batch"]),
            f"{row['origin_cpu_off']} / {row['origin_cpu_on']}",
            f"{row['origin_rss_mb']} MB",
            f"{same['hits']}/{same['asked']} same, {other['hits']}/{other['asked']} other",
            str(wrong),
        )
    outcomes = Table(title="lookups by outcome (near origin)")
    names = sorted({o for p in result["phases"] for o in p["outcomes"]})
    outcomes.add_column("misses/s")
    for name in names:
        outcomes.add_column(name)
    for phase in result["phases"]:
        if phase["semantic"]:
            outcomes.add_row(
                str(phase["rate"]), *(f"{phase['outcomes'].get(n, 0):.0f}" for n in names)
            )
    checks = Table(title="checks", show_header=False)
    for column in ("", "check", "measured"):
        checks.add_column(column)
    for c in result["checks"]:
        mark = Text("pass", style="green") if c["ok"] else Text("FAIL", style="bold red")
        checks.add_row(mark, c["check"], c["measured"])
    return Group(table, outcomes, checks)


def write_load(
    config: LoadConfig, results: list[PhaseResult], machine: dict[str, Any], out: Path
) -> dict[str, Any]:
    """The whole result as JSON in ``out/semantic-load.json``; returned as written."""
    phases = [p.to_dict() | {"pairs_found": _pairs(p)} for p in results]
    result = {
        "config": {
            "rates": list(config.rates),
            "duration": config.duration,
            "provider_ms": config.provider_ms,
            "same_origin_after_s": SAME_ORIGIN_AFTER,
            "other_origin_after_s": OTHER_ORIGIN_AFTER,
        },
        "machine": machine,
        "rows": summary(results),
        "phases": phases,
        "checks": judge(results),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "semantic-load.json").write_text(json.dumps(result, indent=1))
    return result
