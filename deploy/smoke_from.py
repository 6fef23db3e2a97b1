"""`prism smoke URL --from REGION...`: the smoke from Globalping probes in those regions,
a table per region (see deploy/globalping.py for what a probe can ask)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import typer
from rich.console import Console
from rich.table import Table

from deploy.globalping import GlobalpingClient, RegionResult, smoke_from

__all__ = ["run_smoke_from"]


def _ms(value: object) -> str:
    return f"{value} ms" if isinstance(value, int | float) else "-"


def _table(url: str, region: RegionResult) -> Table:
    title = f"prism smoke {url} --from {region.asked}"
    table = Table(title=title + (f"  (probe: {region.probe})" if region.probe else ""))
    for column in ("request", "status", "first byte", "total", "PoP", "origin", "server-timing"):
        table.add_column(column)
    for row in region.rows:
        status = str(row["status"])
        table.add_row(
            row["request"],
            status if row["ok"] else f"[red]{status}[/red] (expected {row['expected']})",
            _ms(row["first_byte_ms"]),
            _ms(row["total_ms"]),
            row["pop"] or "-",
            row["origin_region"] or "-",
            row["server_timing"] or str(row["failure"] or ""),
        )
    return table


def run_smoke_from(
    url: str, key: str, regions: Sequence[str], token: str | None, api_url: str, as_json: bool
) -> bool:
    """Run, print; True when every region's three requests came back as expected."""
    client = GlobalpingClient(api_url, token)
    try:
        results = smoke_from(client, url.rstrip("/"), key, regions)
    finally:
        client.close()
    if as_json:
        typer.echo(json.dumps([result.to_dict() for result in results]))
    else:
        console = Console()
        for result in results:
            if result.error:
                console.print(f"[red]{result.asked}: {result.error}[/red]", highlight=False)
            if result.rows:
                console.print(_table(url, result))
        console.print(
            "[dim]edge: no key, refused by the PoP alone; kv: the key checked at the PoP, "
            "answered from Workers KV; origin: no-cache, one round trip to the nearest "
            "origin. Globalping probes send GET only: the chat miss/redis/kv needs a POST "
            "and runs from this machine (prism smoke without --from).[/dim]"
        )
    return all(result.ok for result in results)
