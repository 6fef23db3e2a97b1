"""`prism bench logsinks`'s output: a row per phase, a row per sink, and the checks.

The checks (issue 30's): no request failed; the outage's p99 within ``P99_FACTOR`` times
the before phase's plus ``P99_SLACK_MS``; and for every sink, the records found in it plus
those the origin counted dropped are the records it produced: none lost silently.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from .sink_outage import OutageConfig

__all__ = ["P99_FACTOR", "P99_SLACK_MS", "judge", "render_outage", "write_outage"]

P99_FACTOR, P99_SLACK_MS = 1.5, 2.0


def judge(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The checks, each ``{"ok", "check", "measured"}``."""
    checks: list[dict[str, Any]] = []

    def check(ok: bool, what: str, measured: str) -> None:
        checks.append({"ok": ok, "check": what, "measured": measured})

    phases = {phase["name"]: phase for phase in result["phases"]}
    failed = sum(sum(p["errors"].values()) for p in phases.values())
    sent = sum(p["sent"] for p in phases.values())
    check(failed == 0 and sent > 0, "every request answered 200", f"{failed} of {sent} not")
    before, outage = phases["before"]["p99_ms"], phases["outage"]["p99_ms"]
    bound = None if before is None else round(before * P99_FACTOR + P99_SLACK_MS, 2)
    check(
        bound is not None and outage is not None and outage <= bound,
        f"p99 during the outage <= {P99_FACTOR:g} x before + {P99_SLACK_MS:g} ms",
        f"{outage} ms (bound {bound} ms)",
    )
    for sink in result["sinks"]:
        check(
            sink["unaccounted"] == 0 and sink["produced"] > 0,
            f"{sink['sink']}: found + dropped == produced",
            f"{sink['found']} + {sink['dropped']} of {sink['produced']}",
        )
    return checks


def write_outage(
    config: OutageConfig, result: Mapping[str, Any], machine: Mapping[str, Any], out: Path
) -> dict[str, Any]:
    """The result with its config, machine and checks, written to ``out/logsinks.json``."""
    whole = {"config": asdict(config), "machine": dict(machine), **result}
    whole["checks"] = judge(whole)
    out.mkdir(parents=True, exist_ok=True)
    (out / "logsinks.json").write_text(json.dumps(whole, indent=2) + "\n")
    return whole


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _check_line(check: Mapping[str, Any]) -> Text:
    mark = ("PASS ", "green") if check["ok"] else ("FAIL ", "red")
    return Text.assemble(mark, f"{check['check']}: {check['measured']}")


def render_outage(result: Mapping[str, Any]) -> RenderableType:
    config = result["config"]
    phases = Table(
        title=f"Request-log sinks killed under load ({config['rate']}/s, "
        f"{config['miss_share']:.0%} misses; S3 and the collector down {result['down_s']} s)"
    )
    for column in ("phase", "s", "requests", "errors", "p50 ms", "p99 ms", "hit p99 ms"):
        phases.add_column(column, justify="right")
    for phase in result["phases"]:
        phases.add_row(
            phase["name"],
            f"{phase['seconds']:.1f}",
            str(phase["sent"]),
            str(sum(phase["errors"].values())),
            _ms(phase["p50_ms"]),
            _ms(phase["p99_ms"]),
            _ms(phase["hit_p99_ms"]),
        )
    sinks = Table(title=f"Records per sink (arrived {result['settle_s']} s after the load)")
    for column in ("sink", "killed", "produced", "found", "dropped", "unaccounted", "peak queued"):
        sinks.add_column(column, justify="right")
    for sink in result["sinks"]:
        sinks.add_row(
            sink["sink"],
            "yes" if sink["killed"] else "no",
            str(sink["produced"]),
            str(sink["found"]),
            str(sink["dropped"]),
            str(sink["unaccounted"]),
            str(sink["peak_queued"]),
        )
    lines = [_check_line(check) for check in result["checks"]]
    return Group(phases, sinks, *lines)
