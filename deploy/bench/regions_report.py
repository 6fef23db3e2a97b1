"""`prism bench regions`' output: a row per scenario, its checks, and a timeline (PNG,
needs matplotlib from the ``bench`` extra): each request's latency at the second it was
sent, coloured by the origin that answered."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from .charts import NO_MATPLOTLIB, pyplot

__all__ = ["render_regions", "write_regions"]

_COLOURS = {"us-west-1": "tab:blue", "ap-south-1": "tab:orange", "": "tab:red"}


def _ms(value: object) -> str:
    return "-" if value is None else f"{value} ms"


def render_regions(result: Mapping[str, Any]) -> RenderableType:
    config = result["config"]
    table = Table(
        title=(
            f"prism bench regions: {config['rate']:g} req/s for {config['duration']:g} s, "
            f"fault at {config['fault_at']:g} s, recovery at {config['resume_at']:g} s; "
            f"probe {config['probe_after']:g} s + {config['probe_timeout']:g} s, "
            f"avoid {config['avoid_seconds']:g} s, recheck {config['recheck_seconds']:g} s"
        )
    )
    for column in ("scenario", "200s", "healthy p50", "p50 once detected", "slowest / bound",
                   "failed over", "detected after", "back on nearest after", "load"):  # fmt: skip
        table.add_column(column)
    checks = Table(title="checks", show_header=False)
    for column in ("", "scenario", "check", "measured"):
        checks.add_column(column)
    for scenario in result["scenarios"]:
        f = scenario["figures"]
        if "healthy_p50_ms" in f:
            table.add_row(
                scenario["name"],
                f"{f['ok']} / {f['requests']}",
                _ms(f["healthy_p50_ms"]),
                _ms(f["after_detection_p50_ms"]),
                f"{f['slowest_ms']:.0f} / {f['bound_ms']:.0f} ms",
                str(f["failed_over"]),
                f"{f['detected_after_s']} s",
                f"{f['back_on_nearest_after_s']} s",
                f"{f['loadavg_1m']}",
            )
        else:
            table.add_row(
                scenario["name"], f"{f['ok']} / {f['requests']}", _ms(f["p50_ms"]), "-", "-",
                str(f["failed_over"]), "-", "-", f"{f['provider_calls']} provider calls",
            )  # fmt: skip
        for check in scenario["checks"]:
            mark = Text("✓", style="green") if check["ok"] else Text("✗", style="red")
            checks.add_row(mark, scenario["name"], check["check"], check["detail"])
    notes = Text(
        f"The `prism dev --regions 2` stack on this machine ({result['cores']} cores; load is "
        "the 1-minute average after each scenario): the local Workers runtime, two origins "
        "as processes, a Redis primary and its replica, the demo provider. The client is "
        "nearest to us-west-1.",
        style="dim",
    )
    return Group(table, checks, notes)


def write_regions(result: Mapping[str, Any], out: Path) -> tuple[Path, str | None]:
    """``regions.json`` and ``regions.png`` in ``out``; the chart's problem, if not drawn."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "regions.json"
    path.write_text(json.dumps(result, indent=2))
    plt = pyplot()
    if plt is None:
        return path, NO_MATPLOTLIB
    scenarios = result["scenarios"]
    figure, axes = plt.subplots(len(scenarios), 1, figsize=(10, 3.2 * len(scenarios)))
    for ax, scenario in zip(figure.axes if len(scenarios) > 1 else [axes], scenarios, strict=True):
        for region, colour in _COLOURS.items():
            picked = [s for s in scenario["samples"] if s["region"] == region]
            if picked:
                ax.scatter(
                    [s["at"] for s in picked],
                    [s["ms"] for s in picked],
                    s=8,
                    c=colour,
                    label=region or "no answer",
                )
        if scenario["fault_at"] is not None:
            ax.axvline(scenario["fault_at"], color="grey", linestyle="--", linewidth=1)
        if scenario.get("back_at") is not None:
            ax.axvline(scenario["back_at"], color="green", linestyle="--", linewidth=1)
        ax.set_yscale("log")
        ax.set_ylabel("ms")
        ax.set_title(scenario["name"], fontsize=10)
        ax.legend(fontsize=8, loc="upper right")
    figure.axes[-1].set_xlabel("seconds (fault: grey line; origin answering again: green)")
    figure.tight_layout()
    figure.savefig(out / "regions.png", dpi=110)
    plt.close(figure)
    return path, None
