"""The benchmark's three outputs: a rich table, a JSON file and a PNG chart.

The JSON is the record (every number, the machine, its load, the versions);
the table and the chart are views of it, so a result can be re-rendered later
(``render_table(json.load(...))``). The chart needs matplotlib (the ``bench``
extra); without it the run still writes the JSON and says the chart was skipped.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .charts import NO_MATPLOTLIB, pyplot

__all__ = ["ROWS", "draw_chart", "render_table", "write_results", "write_run"]

# (section, key, label, floor?) in the order the table and the chart show them.
ROWS: tuple[tuple[str, str, str, bool], ...] = (
    ("edge", "trivial_worker", "edge: trivial Python Worker (floor)", True),
    ("edge", "trivial_worker_kv_read", "edge: trivial Worker + one KV read (floor)", True),
    ("edge", "kv_hit", "edge: Prism KV hit", False),
    ("edge", "bad_key", "edge: bad-key rejection (401)", False),
    ("origin", "floor", "origin: floor app, one Redis GET", True),
    ("origin", "floor_redis_py", "origin: floor app on redis-py's pool (context)", True),
    ("origin", "redis_hit", "origin: Prism Redis hit", False),
    ("origin", "redis_hit_limited", "origin: Prism Redis hit, rate limits + budget set", False),
    ("origin", "provider_direct", "origin: provider called directly", True),
    ("origin", "miss", "origin: Prism miss (→ provider)", False),
)
_STREAMS = (
    ("provider_direct", "provider directly (floor)"),
    ("origin", "origin → provider"),
    ("forward_origin", "bare forwarding Worker → origin → provider (floor)"),
    ("edge_origin", "edge → origin → provider"),
)


def _rows(result: dict[str, Any]) -> list[tuple[str, bool, dict[str, Any]]]:
    """(label, is_floor, load row) for every measured load-generator run."""
    found: list[tuple[str, bool, dict[str, Any]]] = []
    for section, key, label, floor in ROWS:
        data = result.get(section, {}).get(key)
        if not data:
            continue
        if section == "edge":
            found.append((label, floor, data))
        else:
            found += [(label, floor, data[c]) for c in sorted(data, key=int)]
    return found


def _ms(value: float) -> str:
    return f"{value:.2f}"


def render_table(result: dict[str, Any]) -> Group:
    """Everything in the result, as rich renderables (print with a Console)."""
    meta = result["meta"]
    machine, load, ver = meta["machine"], meta["load_average"], meta["versions"]
    head = Text.assemble(
        ("Prism bench", "bold"),
        f"  {meta.get('finished_at', '')}\n",
        f"machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gb']} GB, "
        f"{machine['os']}, kernel {machine['kernel']}\n",
        f"load average (1/5/15 min): before {load['before']}, after {load['after']}\n",
        f"load generator: {meta['loadgen']['tool']}; python {ver.get('python')}, "
        f"uvicorn {ver.get('uvicorn')}, uvloop {ver.get('uvloop')}, httptools "
        f"{ver.get('httptools')}, redis-server {ver.get('redis-server')}, "
        f"miniflare {ver.get('miniflare')}, node {ver.get('node')}\n",
        f"{meta['config']['duration_s']:g} s per run after {meta['config']['warmup_s']:g} s "
        f"warm-up; request body {meta['config']['request_body_bytes']} B; "
        f"{meta['config']['provider']}",
    )
    table = Table(
        title="Latency and throughput (one row per load-generator run)", title_justify="left"
    )
    for column in ("case", "conc", "req/s", "p50 ms", "p90 ms", "p99 ms", "non-2xx", "errors",
                   "server CPU", "loadgen CPU"):  # fmt: skip
        table.add_column(column, justify="left" if column == "case" else "right")
    ceiling = result.get("loadgen_ceiling")
    if ceiling:
        _add(table, "load generator ceiling: constant Node server", ceiling, "dim")
        table.add_section()
    last = ""
    for label, floor, row in _rows(result):
        section = label.split(":", 1)[0]
        if last and section != last:
            table.add_section()
        last = section
        _add(table, label, row, "dim" if floor else "")

    streams = Table(title="Streaming: time to first byte (sequential)", title_justify="left")
    for column in ("path", "requests", "TTFB p50 ms", "TTFB p90 ms", "TTFB p99 ms", "total p50"):
        streams.add_column(column, justify="left" if column == "path" else "right")
    for key, label in _STREAMS:
        row = result.get("streaming", {}).get(key)
        if row:
            streams.add_row(label, str(row["requests"]), _ms(row["ttfb_p50_ms"]),
                            _ms(row["ttfb_p90_ms"]), _ms(row["ttfb_p99_ms"]),
                            _ms(row["total_p50_ms"]))  # fmt: skip

    kv, mem = result.get("kv_writer", {}), result.get("memory", {})
    other = Text(
        f"KV writer: {kv.get('entries_replicated', 0)} of {kv.get('entries_created', 0)} new "
        f"entries replicated in {kv.get('rest_calls', 0)} REST calls "
        f"({kv.get('entries_per_call', 0)} per call), {kv.get('entries_per_second', 0)} "
        f"entries/s, drained {kv.get('drain_seconds', 0)} s after the load, "
        f"{kv.get('dropped', 0)} dropped\n"
        f"origin memory: {mem.get('origin_idle_rss_mb', 0)} MB RSS idle, "
        f"{mem.get('origin_load_rss_mb', 0)} MB peak under load"
    )
    targets = Table(title="Targets", title_justify="left")
    for column in ("target", "goal", "measured", ""):
        targets.add_column(column)
    for row in result.get("targets", []):
        verdict = {True: "[green]met", False: "[red]missed", None: "-"}[row["met"]]
        targets.add_row(row["name"], row["target"], row["measured"], verdict)
    parts: list[Any] = [head, table, streams, other, targets, *_profile_tables(result)]
    if result.get("chart_skipped"):
        parts.append(Text(f"chart skipped: {result['chart_skipped']}", style="yellow"))
    return Group(*parts)


_LADDER_LABELS = {
    "fetch": "fetch: body POSTed to a constant server (from const)",
    "edge": "edge: the real Worker, KV hit (from const)",
    "edge_miss": "edge_miss: the real Worker, miss → constant origin (from const)",
}


def _profile_tables(result: dict[str, Any]) -> list[Any]:
    """With --profile: the edge hit step by step, and where the origin's CPU goes."""
    profile = result.get("profile")
    if not profile:
        return []
    tables: list[Any] = []
    ladder = profile.get("edge_ladder") or []
    if ladder:
        steps = Table(title="Edge KV hit, step by step (c1; each step adds to the one before)",
                      title_justify="left")  # fmt: skip
        for column in ("step", "p50 ms", "p90 ms", "adds (p50) ms"):
            steps.add_column(column, justify="left" if column == "step" else "right")
        for row in ladder:
            label = _LADDER_LABELS.get(row["step"], row["step"])
            steps.add_row(
                label, _ms(row["p50_ms"]), _ms(row["p90_ms"]), f"{row['added_p50_ms']:+.2f}"
            )
        tables.append(steps)
    spy = Table(title="Origin under py-spy: share of samples", title_justify="left")
    for column in ("case", "by package (own time)", "top functions (own time)"):
        spy.add_column(column)
    for case, data in profile.items():
        if not isinstance(data, dict) or "by_area" not in data:
            continue
        areas = ", ".join(f"{r['frame']} {r['share']:.0%}" for r in data["by_area"][:8])
        frames = "\n".join(f"{r['share']:.0%} {r['frame']}" for r in data["top_own"][:6])
        spy.add_row(case.replace("_", " "), areas, frames)
        spy.add_section()
    if spy.row_count:
        tables.append(spy)
    if profile.get("error"):
        tables.append(Text(f"profile: {profile['error']}", style="yellow"))
    return tables


def _add(table: Table, label: str, row: dict[str, Any], style: str) -> None:
    table.add_row(
        label, str(row["concurrency"]), f"{row['rps']:.0f}", _ms(row["p50_ms"]),
        _ms(row["p90_ms"]), _ms(row["p99_ms"]), str(row["non_2xx"]), str(row["errors"]),
        f"{row.get('server_cpu_pct', 0):.0f}%", f"{row.get('loadgen_cpu_pct', 0):.0f}%",
        style=style,
    )  # fmt: skip


def draw_chart(result: dict[str, Any], path: Path) -> str | None:
    """Write the PNG; return why it was skipped, or None when it was drawn."""
    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    latency = [
        (label, floor, row) for label, floor, row in _rows(result) if row["concurrency"] == 1
    ]
    for key, label in _STREAMS:
        row = result.get("streaming", {}).get(key)
        if row:
            latency.append(
                (f"stream TTFB: {label}", key == "provider_direct",
                 {"p50_ms": row["ttfb_p50_ms"], "p90_ms": row["ttfb_p90_ms"]}),
            )  # fmt: skip
    high = [(label, floor, row) for label, floor, row in _rows(result) if row["concurrency"] > 1]
    figure, (left, right) = plt.subplots(
        1, 2, figsize=(14, 6.5), gridspec_kw={"width_ratios": [3, 2]}
    )
    names = [label for label, _, _ in latency][::-1]
    p50 = [row["p50_ms"] for _, _, row in latency][::-1]
    p90 = [row["p90_ms"] for _, _, row in latency][::-1]
    colors = ["#9e9e9e" if floor else "#3f6fd8" for _, floor, _ in latency][::-1]
    left.barh(names, p90, color=colors, alpha=0.35, label="p90")
    left.barh(names, p50, color=colors, label="p50")
    for y, value in enumerate(p50):
        left.text(value, y, f" {value:.2f}", va="center", fontsize=8)
    left.set_xlabel("latency, ms (concurrency 1; grey = floor)")
    left.set_title("Latency per layer")
    left.legend(loc="upper right")  # the top bar (the trivial Worker) is the shortest
    if high:
        names = [f"{label} (c{row['concurrency']})" for label, _, row in high][::-1]
        rps = [row["rps"] for _, _, row in high][::-1]
        colors = ["#9e9e9e" if floor else "#3f6fd8" for _, floor, _ in high][::-1]
        right.barh(names, rps, color=colors)
        for y, value in enumerate(rps):
            right.text(value, y, f" {value:.0f}", va="center", fontsize=8)
        right.set_xlabel("requests/s (grey = floor)")
        right.set_title("Origin throughput")
    meta = result["meta"]
    figure.suptitle(
        f"Prism bench — {meta['machine']['cpu']}, {meta['machine']['cores']} cores, "
        f"load {meta['load_average']['before'][0]}→{meta['load_average']['after'][0]}, "
        f"{meta['loadgen']['tool']}",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return None


def write_results(result: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """``bench-<time>.json`` / ``.png`` in ``out_dir``, copied to ``latest.*``."""
    return write_run(result, out_dir, "bench", "latest", draw_chart, indent=2)


def write_run(
    result: dict[str, Any],
    out_dir: Path,
    prefix: str,
    latest: str,
    draw: Callable[[dict[str, Any], Path], str | None],
    indent: int | None = None,
) -> dict[str, Path]:
    """``{prefix}-<time>.json`` and the chart ``draw`` makes (``.png``; the reason in the
    JSON when it could not), each also copied to ``{latest}.*``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = result["meta"]["finished_at"].replace(":", "").replace("-", "")[:15]
    paths = {"json": out_dir / f"{prefix}-{stamp}.json", "png": out_dir / f"{prefix}-{stamp}.png"}
    skipped = draw(result, paths["png"])
    if skipped:
        result["chart_skipped"] = skipped
        del paths["png"]
    paths["json"].write_text(json.dumps(result, indent=indent) + "\n")
    for kind, path in list(paths.items()):
        shutil.copyfile(path, out_dir / f"{latest}.{kind}")
    return paths
