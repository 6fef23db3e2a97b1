"""`prism status`: is each part of the gateway up, local or deployed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import redis
import typer
from rich.console import Console
from rich.table import Table

from ._options import JsonOption

__all__ = ["status_command"]


def _probe_http(url: str, expect: tuple[int, ...]) -> tuple[str, float, str]:
    started = time.perf_counter()
    try:
        response = httpx.get(url, timeout=5)
    except httpx.HTTPError as error:
        return "down", 0.0, type(error).__name__
    ms = (time.perf_counter() - started) * 1000
    if response.status_code not in expect:
        return "down", ms, f"HTTP {response.status_code}"
    detail = f"HTTP {response.status_code}"
    if "json" in response.headers.get("content-type", ""):
        body: Any = response.json()
        if isinstance(body, dict) and body.get("status") == "degraded":
            return "degraded", ms, "redis unreachable from the origin"
    return "ok", ms, detail


def _probe_redis(url: str) -> tuple[str, float, str]:
    started = time.perf_counter()
    client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    try:
        client.ping()
    except (redis.RedisError, OSError) as error:
        return "down", 0.0, type(error).__name__
    finally:
        client.close()
    return "ok", (time.perf_counter() - started) * 1000, "PONG"


def status_command(
    origin_url: Annotated[
        str | None, typer.Option(envvar="PRISM_ORIGIN_URL", help="Origin base URL.")
    ] = None,
    origin_admin_url: Annotated[
        str | None,
        typer.Option(
            envvar="PRISM_ORIGIN_ADMIN_URL",
            help="The origin's admin listener (private), for its detailed /healthz.",
        ),
    ] = None,
    edge_url: Annotated[
        str | None, typer.Option(envvar="PRISM_EDGE_URL", help="Edge base URL.")
    ] = None,
    redis_url: Annotated[str | None, typer.Option(envvar="REDIS_URL", help="Redis URL.")] = None,
    state_dir: Annotated[
        Path, typer.Option(help="`prism dev` state folder, read when no URL is given.")
    ] = Path(".prism"),
    as_json: JsonOption = False,
) -> None:
    """Check each configured part: the origin's /healthz (and, where its private admin
    listener is reachable, whether it reaches Redis), the edge (a keyless request must be
    refused by the edge itself), Redis. With no URLs, checks the local `prism dev` stack.

    Example: prism status --origin-url https://origin.example.com --edge-url https://api.example.com
    """
    local: dict[str, Any] = {}
    dev_file = state_dir / "dev.json"
    if not (origin_url or edge_url or redis_url) and dev_file.exists():
        local = json.loads(dev_file.read_text())
    origin_url = origin_url or local.get("origin_url")
    origin_admin_url = origin_admin_url or local.get("origin_admin_url")
    edge_url = edge_url or local.get("edge_url")
    redis_url = redis_url or local.get("redis_url")
    checks: list[dict[str, Any]] = []
    if origin_url:
        # The public /healthz only says the origin is alive; the admin one says more.
        state, ms, detail = _probe_http(origin_url.rstrip("/") + "/healthz", (200,))
        if state == "ok" and origin_admin_url:
            state, _, detail = _probe_http(origin_admin_url.rstrip("/") + "/healthz", (200,))
        checks.append(
            {"part": "origin", "url": origin_url, "state": state, "ms": ms, "detail": detail}
        )
    if edge_url:
        # 401 from the edge proves it is up and checking keys, at no cost to the origin.
        state, ms, detail = _probe_http(edge_url.rstrip("/") + "/v1/models", (401,))
        checks.append({"part": "edge", "url": edge_url, "state": state, "ms": ms, "detail": detail})
    if redis_url:
        state, ms, detail = _probe_redis(redis_url)
        shown = redis_url.split("@")[-1]  # never print a password
        checks.append({"part": "redis", "url": shown, "state": state, "ms": ms, "detail": detail})
    if not checks:
        typer.echo(
            "Error: nothing to check: give --origin-url/--edge-url/--redis-url or run `prism dev`.",
            err=True,
        )
        raise typer.Exit(2)
    if as_json:
        typer.echo(json.dumps(checks))
    else:
        table = Table(title="prism status")
        for column in ("part", "state", "ms", "url", "detail"):
            table.add_column(column)
        colours = {"ok": "green", "degraded": "yellow", "down": "red"}
        for check in checks:
            colour = colours[check["state"]]
            table.add_row(
                check["part"],
                f"[{colour}]{check['state']}[/{colour}]",
                f"{check['ms']:.1f}",
                check["url"],
                check["detail"],
            )
        Console().print(table)
    if any(check["state"] == "down" for check in checks):
        raise typer.Exit(1)
