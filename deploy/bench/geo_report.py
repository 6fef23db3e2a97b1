"""`prism bench geo`'s output: the three-request table per customer and edge, the checks,
and a bar chart (PNG, needs matplotlib from the ``bench`` extra)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from .charts import NO_MATPLOTLIB, pyplot

__all__ = ["render_geo", "write_geo"]

_LAYERS = ("miss", "redis", "kv")


def render_geo(result: Mapping[str, Any]) -> RenderableType:
    profile = result["profile"]
    network = result["network"]
    title = (
        f"prism bench geo: {result['requests']} requests per row, medians, "
        f"provider {profile['provider_latency_ms']:g} ms"
    )
    table = Table(title=title)
    for column in ("customer", "regions", "answered by", "miss", "Redis hit", "KV hit",
                   "edge waited for origin", "client-PoP / PoP-origin RTT"):  # fmt: skip
        table.add_column(column)
    for row in result["rows"]:
        customer = next(c for c in profile["customers"] if c["name"] == row["customer"])
        links = ", ".join(f"{r} {ms:g}" for r, ms in customer["pop_origin_ms"].items())
        table.add_row(
            row["customer"],
            str(row["regions"]),
            ", ".join(row["answered_by"]),
            *(f"{row[f'{layer}_ms']:.1f} ms" for layer in _LAYERS),
            f"{row['origin_wait_ms']:.1f} ms",
            f"{customer['client_pop_ms']:g} / {links}",
        )
    checks = Table(title="checks", show_header=False)
    checks.add_column("")
    checks.add_column("check")
    checks.add_column("measured")
    for check in result["checks"]:
        mark = Text("✓", style="green") if check["ok"] else Text("✗", style="red")
        checks.add_row(mark, check["check"], check["detail"])
    where = (
        "every part in its own network namespace, a delay proxy on each link"
        if network == "namespaces"
        else "loopback (no network namespaces here), a delay proxy on each link"
    )
    notes = Text(
        f"Network: {where}. Floors measured in the same run: the KV hit through a link of no "
        "delay (the proxy's and the edge's own cost on this machine), and the Redis hit asked "
        "of the origin straight through the PoP's link (one round trip plus the origin's work).",
        style="dim",
    )
    return Group(table, checks, notes)


def write_geo(result: Mapping[str, Any], out: Path) -> tuple[Path, str | None]:
    """``geo.json`` and ``geo.png`` in ``out``; the chart's problem, if it was not drawn."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "geo.json"
    path.write_text(json.dumps(result, indent=2))
    plt = pyplot()
    if plt is None:
        return path, NO_MATPLOTLIB
    rows = result["rows"]
    labels = [f"{r['customer']}\n{r['regions']} region{'s' * (r['regions'] > 1)}" for r in rows]
    figure, axes = plt.subplots(figsize=(9, 4.5))
    width = 0.27
    for index, layer in enumerate(_LAYERS):
        values = [r[f"{layer}_ms"] for r in rows]
        positions = [i + (index - 1) * width for i in range(len(rows))]
        bars = axes.bar(positions, values, width, label=layer)
        axes.bar_label(bars, fmt="%.0f", fontsize=8)
    axes.set_xticks(range(len(rows)), labels)
    axes.set_ylabel("ms (median)")
    axes.set_title(f"Prism, three requests per customer ({result['network']})")
    axes.legend()
    figure.tight_layout()
    figure.savefig(out / "geo.png", dpi=120)
    plt.close(figure)
    return path, None
