"""`prism usage`: a project's requests, tokens, cost and savings per day, key and model."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated

import redis
import typer
from rich.console import Console
from rich.table import Table

from deploy.key_store import DEFAULT_REDIS_URL
from deploy.policy_store import check_project
from deploy.store_errors import redact_url
from deploy.usage_report import UsageReport, UsageRow, parse_since, read_usage

from ._options import JsonOption
from .keys import ProjectOption, RedisUrlOption, fail

__all__ = ["usage_command"]


def _usd(micros: int) -> str:
    return f"${micros / 1_000_000:,.6f}"


def _cells(row: UsageRow) -> list[str]:
    r = row.requests
    cost = _usd(row.cost_micros) + (f" (+{row.unpriced} unpriced)" if row.unpriced else "")
    return [
        row.day,
        row.key_id,
        row.model,
        f"{r.get('kv', 0):,}",
        f"{r.get('redis', 0):,}",
        f"{r.get('semantic', 0):,}",
        f"{r.get('miss', 0) + r.get('bypass', 0):,}",
        f"{r.get('coalesced', 0):,}",
        f"{row.tokens_in:,}",
        f"{row.tokens_out:,}",
        cost,
        _usd(row.saved_micros),
    ]


def _print(report: UsageReport) -> None:
    console = Console(width=160) if not Console().is_terminal else Console()
    table = Table(title=f"Usage of {report.project}, {report.since} to {report.until} (UTC)")
    for name in ("Day", "Key", "Model"):
        table.add_column(name)
    numbers = (
        "KV hits",
        "Redis hits",
        "Semantic",
        "Calls",
        "Coalesced",
        "Tokens in",
        "Tokens out",
        "Cost",
        "Saved",
    )
    for name in numbers:
        table.add_column(name, justify="right")
    for row in report.rows:
        table.add_row(*_cells(row))
    if report.rows:
        table.add_section()
        table.add_row(*_cells(report.totals()))
    console.print(table)
    if not report.rows:
        console.print("No usage recorded in this range.")
    console.print(
        "KV hits: answered at the edge from Workers KV (counted when the edge's records "
        "reach the origin, seconds later). Redis hits: answered from the origin's Redis. "
        "Semantic: paraphrases answered from the semantic cache. "
        "Calls: provider calls (misses and cache bypasses)."
    )
    status = report.budget
    if status is not None:
        left = status.as_dict()["left_usd"]
        console.print(
            f"Budget: ${status.budget.usd:,} per UTC {status.budget.period}; {status.period}: "
            f"spent {_usd(status.spent_micros)}, reserved {_usd(status.reserved_micros)} "
            f"by calls in flight, ${left:,.4f} left."
        )


def usage_command(
    project: ProjectOption,
    since: Annotated[
        str | None,
        typer.Option("--since", help="First UTC day, YYYY-MM-DD. [default: 6 days ago]"),
    ] = None,
    redis_url: RedisUrlOption = DEFAULT_REDIS_URL,
    as_json: JsonOption = False,
) -> None:
    """Show PROJECT's usage per UTC day, key and model: requests by cache layer, tokens,
    provider cost and what the cache saved; and its budget for the current period.

    Example: prism usage --project acme --since 2026-11-01
    """
    now = datetime.now(UTC)
    try:
        check_project(project)
        first = parse_since(since, now.date())
        client = redis.Redis.from_url(redis_url, socket_connect_timeout=5, socket_timeout=5)
    except ValueError as error:
        raise fail(str(error), 2) from None
    try:
        report = read_usage(client, project, first, now)
    except redis.RedisError as error:
        raise fail(f"Redis at {redact_url(redis_url)}: {error}") from None
    finally:
        client.close()
    if as_json:
        typer.echo(json.dumps(report.as_dict()))
    else:
        _print(report)
