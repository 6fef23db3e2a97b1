"""`prism smoke`: one new request, three times, and whether each answer came from where
it should: the provider, then the origin's Redis, then (through the edge) Workers KV."""

from __future__ import annotations

import json
import secrets
import time
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from prism import headers as h

from ._options import JsonOption

__all__ = ["expected_layers", "smoke_command"]

# Through the edge: a miss goes to the provider (the origin stores the answer in Redis,
# and its KV writer, where configured, in KV); the repeat is a hit, from Redis (the edge
# then copies the entry into KV) or already from KV; the third is served from KV.
_THROUGH_EDGE = (("miss",), ("redis", "kv"), ("kv",))
_AT_ORIGIN = (("miss",), ("redis",), ("redis",))


def expected_layers(first_server_timing: str) -> tuple[tuple[str, ...], ...]:
    """The layers each request may report, by where the first answer came from: the
    edge names the origin's Server-Timing stages ``origin-*`` when it forwards a miss."""
    stages = [part.strip() for part in first_server_timing.split(",")]
    return _THROUGH_EDGE if any(s.startswith("origin-") for s in stages) else _AT_ORIGIN


def _row(number: int, response: httpx.Response, ms: float) -> dict[str, Any]:
    error = None
    if response.status_code != 200:
        try:
            error = response.json().get("error", {}).get("message")
        except ValueError:
            error = response.text[:200]
    return {
        "request": number,
        "status": response.status_code,
        "ms": round(ms, 1),
        "layer": response.headers.get(h.CACHE_LAYER, "-"),
        "expected": [],
        "ok": False,
        "server_timing": response.headers.get(h.SERVER_TIMING, ""),
        "error": error,
    }


def smoke_command(
    url: Annotated[str, typer.Argument(help="The gateway's base URL (edge or origin).")],
    key: Annotated[
        str, typer.Option("--key", "-k", envvar="PRISM_API_KEY", help="A Prism API key.")
    ],
    model: Annotated[str, typer.Option(help="Model to ask.")] = "gpt-4o-mini",
    pause: Annotated[
        float,
        typer.Option(
            help="Seconds to wait before each repeat, for the previous answer's cache writes "
            "to land (Redis at the origin, then KV at the edge)."
        ),
    ] = 1.0,
    regions: Annotated[
        list[str] | None,
        typer.Option(
            "--from",
            help="Run from Globalping probes in this place instead (a city, country or "
            "continent; repeat for several). Probes only GET: see docs/regions.md.",
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(envvar="PRISM_GLOBALPING_TOKEN", help="Globalping API token (optional)."),
    ] = None,
    globalping_api: Annotated[
        str, typer.Option(envvar="PRISM_GLOBALPING_API", hidden=True)
    ] = "https://api.globalping.io",
    semantic: Annotated[
        bool,
        typer.Option(
            "--semantic",
            help="Then ask a new question and a paraphrase of it: the paraphrase must come "
            "from the semantic cache (for a project whose policy turns it on).",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Send one new chat request three times, waiting --pause seconds before each repeat, and
    show status, time, cache layer and Server-Timing stages. Through the edge the layers must
    be miss (the provider), then redis (the origin's cache; the edge copies the entry to KV)
    or kv (the origin's KV writer got there first), then kv (the edge's cache); straight at
    the origin, miss, redis, redis. Exit status 1 when a request fails or a layer is not one
    expected (a cache that does not keep answers).

    With --from, probes in those places ask the edge three GETs instead (no key; the key,
    answered at the PoP; the key with no-cache, answered by the nearest origin).

    Example: prism smoke http://127.0.0.1:8787 --key sk-prism-v1.dev....
    """
    if regions:
        from deploy.smoke_from import run_smoke_from

        if not run_smoke_from(url, key, regions, token, globalping_api, as_json):
            raise typer.Exit(1)
        return
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Prism smoke test {secrets.token_hex(4)}"}],
        "temperature": 0,  # cacheable even for a project that does not cache sampled answers
    }
    rows: list[dict[str, Any]] = []
    extra: list[dict[str, Any]] = []  # --semantic's, with their own expectations
    try:
        with httpx.Client(
            base_url=url.rstrip("/"), headers={"authorization": f"Bearer {key}"}, timeout=60
        ) as client:
            for number in (1, 2, 3):
                if number > 1:
                    time.sleep(pause)  # what the user asked for, not synchronisation
                started = time.perf_counter()
                response = client.post("/v1/chat/completions", json=body)
                rows.append(_row(number, response, (time.perf_counter() - started) * 1000))
                if response.status_code != 200:
                    break  # the same request again would only fail the same way
            if semantic and rows[-1]["status"] == 200:
                from .smoke_semantic import semantic_rows

                extra = semantic_rows(client, model, pause, _row, len(rows) + 1)
    except httpx.HTTPError as error:
        typer.echo(f"Error: cannot reach {url}: {type(error).__name__}", err=True)
        raise typer.Exit(1) from None
    for row, layers in zip(rows, expected_layers(rows[0]["server_timing"]), strict=False):
        row["expected"] = list(layers)
        row["ok"] = row["status"] == 200 and row["layer"] in layers
    rows += extra
    if as_json:
        typer.echo(json.dumps(rows))
    else:
        table = Table(title=f"prism smoke {url}")
        for column in ("#", "status", "ms", "layer", "expected", "server-timing"):
            table.add_column(column)
        for row in rows:
            table.add_row(
                str(row["request"]),
                str(row["status"]),
                f"{row['ms']:.1f}",
                row["layer"] if row["ok"] else f"[red]{row['layer']}[/red]",
                " or ".join(row["expected"]),
                str(row["error"] or row["server_timing"]),
            )
        Console().print(table)
    if not all(row["ok"] for row in rows):
        raise typer.Exit(1)
