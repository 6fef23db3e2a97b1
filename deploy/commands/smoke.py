"""`prism smoke`: one request, three times, and where each answer came from."""

from __future__ import annotations

import json
import secrets
import time
from typing import Annotated

import httpx
import typer
from rich.console import Console
from rich.table import Table

from prism import headers as h

from ._options import JsonOption

__all__ = ["smoke_command"]


def smoke_command(
    url: Annotated[str, typer.Argument(help="The gateway's base URL (edge or origin).")],
    key: Annotated[
        str, typer.Option("--key", "-k", envvar="PRISM_API_KEY", help="A Prism API key.")
    ],
    model: Annotated[str, typer.Option(help="Model to ask.")] = "gpt-4o-mini",
    pause: Annotated[float, typer.Option(help="Seconds to wait before the third request.")] = 1.0,
    as_json: JsonOption = False,
) -> None:
    """Send one new chat request three times (the third after a pause) and show status,
    time, cache layer and Server-Timing stages. Against `prism dev`: miss, then kv.

    Example: prism smoke http://127.0.0.1:8787 --key sk-prism-v1.dev....
    """
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Prism smoke test {secrets.token_hex(4)}"}],
    }
    results = []
    try:
        with httpx.Client(
            base_url=url.rstrip("/"), headers={"authorization": f"Bearer {key}"}, timeout=60
        ) as client:
            for number in (1, 2, 3):
                if number == 3:
                    time.sleep(pause)
                started = time.perf_counter()
                response = client.post("/v1/chat/completions", json=body)
                elapsed = (time.perf_counter() - started) * 1000
                results.append(
                    {
                        "request": number,
                        "status": response.status_code,
                        "ms": round(elapsed, 1),
                        "layer": response.headers.get(h.CACHE_LAYER, "-"),
                        "server_timing": response.headers.get(h.SERVER_TIMING, ""),
                        "error": response.json().get("error", {}).get("message")
                        if response.status_code != 200
                        else None,
                    }
                )
    except httpx.HTTPError as error:
        typer.echo(f"Error: cannot reach {url}: {type(error).__name__}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(results))
    else:
        table = Table(title=f"prism smoke {url}")
        for column in ("#", "status", "ms", "layer", "server-timing"):
            table.add_column(column)
        for row in results:
            table.add_row(
                str(row["request"]),
                str(row["status"]),
                f"{row['ms']:.1f}",
                str(row["layer"]),
                str(row["error"] or row["server_timing"]),
            )
        Console().print(table)
    if any(row["status"] != 200 for row in results):
        raise typer.Exit(1)
