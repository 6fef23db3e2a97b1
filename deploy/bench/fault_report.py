"""The fault benchmark's table, JSON file and PNG timeline.

Files go next to ``prism bench``'s: ``faults-<time>.json`` / ``.png`` in the output
directory, copied to ``latest-faults.*``. The timeline needs matplotlib (the ``bench``
extra); without it the JSON is still written and the result says the chart was skipped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .charts import NO_MATPLOTLIB, pyplot
from .fault_metrics import RequestRecord
from .report import write_run

__all__ = ["draw_timeline", "render_fault_table", "write_fault_results"]


def render_fault_table(result: dict[str, Any]) -> Group:
    """The run as rich renderables: one row per scenario, then every target met or missed."""
    meta = result["meta"]
    config, machine, load = meta["config"], meta["machine"], meta["load_average"]
    head = Text.assemble(
        ("Prism fault bench", "bold"),
        f"  {meta.get('finished_at', '')}, {meta.get('wall_seconds', 0)} s\n",
        f"machine: {machine['cpu']}, {machine['cores']} cores; load average before "
        f"{load['before']}, after {load['after']}\n",
        f"{config['requests']} requests per scenario (half streamed, all unique) at "
        f"concurrency {config['concurrency']}; providers answer after "
        f"{config['provider_latency_ms']:g} ms; outage: {config['outage_seconds']:g} s after "
        f"{config['outage_lead']:g} s, then {config['recovery_seconds']:g} s measured\n",
        (f"hedge delay assumed by the TTFB target: {result['hedge_delay_s']:g} s", "bold"),
    )
    table = Table(title="Scenarios (primary sick, secondary healthy)", title_justify="left")
    for column in ("scenario", "success", "TTFB p50 ms", "TTFB p99 ms", "answered by",
                   "extra calls", "failures"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("scenario", "failures") else "right")
    for name, scenario in result["scenarios"].items():
        s = scenario["summary"]
        answered = ", ".join(f"{k} {v}" for k, v in sorted(s["answered_by"].items()))
        failures = ", ".join(f"{k}: {v}" for k, v in sorted(s["failures"].items())) or "-"
        table.add_row(
            f"{name}\n[dim]{scenario['description']}[/dim]",
            f"{s['success_rate']:.2%}",
            f"{s['ttfb_ms']['p50']:.1f}",
            f"{s['ttfb_ms']['p99']:.1f}",
            answered,
            f"{s['extra_upstream_calls']:.1%}",
            failures,
        )
    targets = Table(title="Targets", title_justify="left")
    for column in ("scenario", "target", "goal", "measured", ""):
        targets.add_column(column)
    for row in result.get("targets", []):
        verdict = {True: "[green]met", False: "[red]missed", None: "-"}[row["met"]]
        targets.add_row(row["scenario"], row["name"], row["goal"], row["measured"], verdict)
    parts: list[Any] = [head, table, targets]
    if result.get("chart_skipped"):
        parts.append(Text(f"timeline skipped: {result['chart_skipped']}", style="yellow"))
    return Group(*parts)


def _series(records: list[RequestRecord], primary: str, edges: list[float]) -> dict[str, list[int]]:
    """Requests started in each bin, by who answered (or failed)."""
    series: dict[str, list[int]] = {key: [0] * (len(edges) - 1) for key in
                                    ("primary", "secondary", "failed")}  # fmt: skip
    for record in records:
        index = min(len(edges) - 2, max(0, int(record.start / (edges[1] - edges[0]))))
        if not record.ok:
            series["failed"][index] += 1
        elif record.provider == primary:
            series["primary"][index] += 1
        else:
            series["secondary"][index] += 1
    return series


def draw_timeline(result: dict[str, Any], path: Path) -> str | None:
    """Write the PNG (one panel per scenario); return why it was skipped, or None."""
    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    scenarios = result["scenarios"]
    figure, axes = plt.subplots(
        len(scenarios), 1, figsize=(12, 2.6 * len(scenarios)), squeeze=False
    )
    for axis, (name, scenario) in zip(axes[:, 0], scenarios.items(), strict=True):
        records = [RequestRecord.from_row(row) for row in scenario["records"]]
        end = max((r.start + r.total for r in records), default=1.0)
        width = max(0.05, end / 120)  # about 120 bars a panel, whatever its length
        edges = [i * width for i in range(int(end / width) + 2)]
        series = _series(records, "primary", edges)
        lefts = edges[:-1]
        bottom = [0] * len(lefts)
        for key, color in (("primary", "#3f6fd8"), ("secondary", "#8bc34a"),
                           ("failed", "#e53935")):  # fmt: skip
            axis.bar(lefts, series[key], width=width, bottom=bottom, align="edge", color=color,
                     label=f"answered by {key}" if key != "failed" else "failed")  # fmt: skip
            bottom = [b + v for b, v in zip(bottom, series[key], strict=True)]
        calls = [0] * len(lefts)
        for t in scenario["arrivals"].get("primary", []):
            if 0 <= t < edges[-1]:
                calls[min(len(calls) - 1, int(t / width))] += 1
        axis.step(lefts, calls, where="post", color="black", linewidth=1, linestyle="--",
                  zorder=3, label="calls reaching the primary")  # fmt: skip
        outage = scenario["summary"].get("outage")
        if outage:
            axis.axvspan(outage["start_s"], outage["end_s"], color="#e53935", alpha=0.08,
                         label="primary outage")  # fmt: skip
        summary = scenario["summary"]
        axis.set_title(
            f"{name}: {scenario['description']} — success {summary['success_rate']:.2%}, "
            f"TTFB p99 {summary['ttfb_ms']['p99']:.0f} ms",
            fontsize=9,
            loc="left",
        )
        axis.set_ylabel(f"requests / {width:.2g} s", fontsize=8)
        axis.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("seconds since the scenario started (requests by start time)")
    figure.suptitle(
        f"Prism fault bench — {result['meta']['machine']['cpu']}, "
        f"{result['meta']['config']['requests']} requests per scenario",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return None


def write_fault_results(result: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """``faults-<time>.json`` / ``.png`` in ``out_dir``, copied to ``latest-faults.*``."""
    return write_run(result, out_dir, "faults", "latest-faults", draw_timeline)
