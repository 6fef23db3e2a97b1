"""`prism status`: is each part of the gateway up, and does a keyed request get through."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from deploy.local.stack import dev_api_key
from deploy.status_checks import Check, check_edge, check_origin, check_path, check_redis

from ._options import JsonOption

__all__ = ["status_command"]


@dataclass(frozen=True, slots=True)
class _Targets:
    origin_url: str | None
    origin_admin_url: str | None
    edge_url: str | None
    redis_url: str | None
    redis_source: str
    key: str | None
    local: bool  # the `prism dev` stack of the state folder
    regions: Mapping[str, str] = field(default_factory=dict)  # region -> origin, if several


def _targets(
    origin_url: str | None,
    origin_admin_url: str | None,
    edge_url: str | None,
    redis_url: str | None,
    key: str | None,
    state_dir: Path,
) -> _Targets:
    """What to check. The local stack's own Redis and dev key win over $REDIS_URL and
    $PRISM_API_KEY, which usually name a deployment's: a local check never reads them."""
    dev_file = state_dir / "dev.json"
    if not (origin_url or edge_url or redis_url) and dev_file.is_file():
        local: dict[str, Any] = json.loads(dev_file.read_text())
        return _Targets(
            local.get("origin_url"),
            origin_admin_url or local.get("origin_admin_url"),
            local.get("edge_url"),
            local.get("redis_url"),
            f"the prism dev stack in {state_dir}",
            key or dev_api_key(state_dir),
            local=True,
            regions=local.get("regions") or {},
        )
    source = "--redis-url"
    if redis_url is None and os.environ.get("REDIS_URL"):
        redis_url, source = os.environ["REDIS_URL"], "$REDIS_URL"
    return _Targets(
        origin_url,
        origin_admin_url,
        edge_url,
        redis_url,
        source,
        key or os.environ.get("PRISM_API_KEY") or None,
        local=False,
    )


def _print_table(checks: list[Check], title: str, hint: str | None) -> None:
    table = Table(title=title)
    for column in ("part", "state", "ms", "url", "detail"):
        table.add_column(column)
    colours = {"ok": "green", "degraded": "yellow", "down": "red"}
    for check in checks:
        colour = colours[check.state]
        table.add_row(
            check.part,
            f"[{colour}]{check.state}[/{colour}]",
            f"{check.ms:.1f}",
            check.url,
            check.detail,
        )
    console = Console()
    console.print(table)
    if hint:
        console.print(hint, highlight=False)


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
    redis_url: Annotated[
        str | None,
        typer.Option(
            help="Redis URL. Default: the local stack's own Redis; else $REDIS_URL when "
            "checking a deployment."
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            "--key",
            "-k",
            help="A Prism API key, to check the whole path (edge → origin). Default: the "
            "local stack's dev key; else $PRISM_API_KEY when checking a deployment.",
        ),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure", help="Do not verify TLS certificates (e.g. a self-signed origin)."
        ),
    ] = False,
    state_dir: Annotated[
        Path, typer.Option(help="`prism dev` state folder, read when no URL is given.")
    ] = Path(".prism"),
    as_json: JsonOption = False,
) -> None:
    """Check each configured part: the origin's /healthz (and, where its private admin
    listener is reachable, whether it reaches Redis), the edge (a keyless request must be
    refused by the edge itself), the whole path (a request with a key through the edge must
    reach the origin; a refusal is named: wrong forwarding secret, bad or revoked key,
    unreachable origin) and Redis (the row says which one). With no URLs, checks the local
    `prism dev` stack. Exit status 1 when a part is down.

    Example: prism status --edge-url https://api.example.com --key sk-prism-v1....
    """
    targets = _targets(origin_url, origin_admin_url, edge_url, redis_url, key, state_dir)
    checks: list[Check] = []
    with httpx.Client(timeout=5, verify=not insecure) as client:
        if len(targets.regions) > 1:  # `prism dev --regions 2`: is each region up?
            for region, url in targets.regions.items():
                admin = targets.origin_admin_url if url == targets.origin_url else None
                check = check_origin(client, url, admin, insecure=insecure)
                checks.append(dataclasses.replace(check, part=f"origin {region}"))
        elif targets.origin_url:
            checks.append(
                check_origin(
                    client, targets.origin_url, targets.origin_admin_url, insecure=insecure
                )
            )
        if targets.edge_url:
            checks.append(check_edge(client, targets.edge_url))
            if targets.key and checks[-1].state != "down":  # else it would only repeat that
                checks.append(check_path(client, targets.edge_url, targets.key))
    if targets.redis_url:
        checks.append(check_redis(targets.redis_url, targets.redis_source))
    if not checks:
        typer.echo(
            "Error: nothing to check: give --origin-url/--edge-url/--redis-url or run `prism dev`.",
            err=True,
        )
        raise typer.Exit(2)
    if as_json:
        typer.echo(json.dumps([check.to_dict() for check in checks]))
    else:
        hint = None
        if targets.edge_url and not targets.key:
            hint = "Give --key (or $PRISM_API_KEY) to check the whole path through the edge."
        title = "prism status (local stack)" if targets.local else "prism status"
        _print_table(checks, title, hint)
    if any(check.state == "down" for check in checks):
        raise typer.Exit(1)
