"""`prism logs`: the origin's request log, from its Redis window: find a request by id,
list the newest records matching filters, or follow new ones as they come.

A Typer group: `prism logs` itself reads the window; other ways to read the log join it as
subcommands (``register`` functions adding to ``app``).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Annotated, Any

import redis
import typer
from rich.console import Console
from rich.table import Table

from deploy.key_store import DEFAULT_REDIS_URL
from deploy.log_window import find_record, follow_records, projects, read_records
from deploy.store_errors import redact_url
from origin.requestlog.record_filter import FilterError, RecordFilter, parse_time

from . import logs_query
from ._options import JsonOption
from .keys import RedisUrlOption, fail

__all__ = ["app"]

app = typer.Typer()  # its help is the callback's docstring
logs_query.register(app)  # prism logs query "SQL": over the durable files

_COLUMNS = ("Time (UTC)", "Request", "Project", "Key", "Model", "Layer", "Status", "Error")
_NUMBERS = ("Provider", "Total ms", "Tokens", "Cost $")


@app.callback(invoke_without_command=True)
def logs(
    ctx: typer.Context,
    project: Annotated[
        str | None, typer.Option("--project", "-p", help="Only this project's requests.")
    ] = None,
    key: Annotated[str | None, typer.Option("--key", help="Only this key id's requests.")] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="Only requests asking for (or answered by) it.")
    ] = None,
    layer: Annotated[
        str | None,
        typer.Option(
            "--layer",
            help="Only this layer: kv, redis, semantic, miss, coalesced, bypass, refused.",
        ),
    ] = None,
    status: Annotated[
        str | None, typer.Option("--status", help="A status (429), a class (4xx) or 'error'.")
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="From this long ago (10m, 2h, 1d) or ISO time.")
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="Up to this long ago or ISO time.")
    ] = None,
    request_id: Annotated[
        str | None, typer.Option("--id", help="One request, whole: its stages and attempts.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", help="At most this many records.")] = 50,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Then print new records as they come.")
    ] = False,
    redis_url: RedisUrlOption = DEFAULT_REDIS_URL,
    as_json: JsonOption = False,
) -> None:
    """Show the newest requests the origins recorded (the last PRISM_LOG_WINDOW per project,
    PRISM_LOG_WINDOW_AGE at most), oldest first: who asked, which layer or provider
    answered, the status and error, time and cost.

    Example: prism logs --project acme --status error --since 10m
    Example: prism logs --id 5f1c2a9b00000012
    Example: prism logs --project acme --follow --json
    """
    if ctx.invoked_subcommand is not None:
        return
    now = time.time()
    try:
        where = RecordFilter(
            key=key,
            model=model,
            layer=layer,
            status=status,
            since=None if since is None else parse_time(since, now, "since"),
            until=None if until is None else parse_time(until, now, "until"),
        )
        if limit < 1:
            raise ValueError("--limit must be at least 1")
        client = redis.Redis.from_url(redis_url, socket_connect_timeout=5, socket_timeout=10)
    except FilterError as error:
        raise fail(f"--{error.param}: {error}", 2) from None
    except ValueError as error:
        raise fail(str(error), 2) from None
    try:
        if request_id is not None:
            _one(client, request_id, as_json)
            return
        names = projects(client, project)
        records = read_records(client, names, where, limit)
        if as_json:
            for record in records:
                typer.echo(json.dumps(record))
        elif records or not follow:
            _table(records)
        if follow:
            _follow(client, names, where, as_json)
    except redis.RedisError as error:
        raise fail(f"Redis at {redact_url(redis_url)}: {error}") from None
    except KeyboardInterrupt:
        pass
    finally:
        client.close()


def _one(client: redis.Redis, request_id: str, as_json: bool) -> None:
    record = find_record(client, request_id)
    if record is None:
        raise fail(
            f"no record of request {request_id[:100]!r} in the window (it keeps "
            "PRISM_LOG_WINDOW records per project, PRISM_LOG_WINDOW_AGE at most)"
        )
    if as_json:
        typer.echo(json.dumps(record))
        return
    console = _console()
    facts = Table(title=f"Request {record.get('id')}", show_header=False)
    facts.add_column("Field")
    facts.add_column("Value")
    for name, value in record.items():
        if name not in ("stages", "attempts", "body"):
            facts.add_row(name, _when(value) if name == "ts" else str(value))
    console.print(facts)
    stages = record.get("stages") or {}
    if stages:
        table = Table(title="Stages")
        table.add_column("Stage")
        table.add_column("ms", justify="right")
        for stage, ms in stages.items():
            table.add_row(stage, f"{ms:.3f}")
        console.print(table)
    attempts = record.get("attempts") or []
    if attempts:
        table = Table(title="Provider attempts")
        for name in ("Provider", "Model", "Status", "Error", "ms"):
            table.add_column(name)
        for attempt in attempts:
            table.add_row(
                str(attempt.get("provider", "")),
                str(attempt.get("model", "")),
                str(attempt.get("status", "")),
                str(attempt.get("error", "")),
                f"{attempt.get('ms', 0):.1f}",
            )
        console.print(table)
    if "body" in record:
        console.print_json(json.dumps(record["body"]))


def _follow(client: redis.Redis, names: list[str], where: RecordFilter, as_json: bool) -> None:
    console = _console()
    for record in follow_records(client, names, where):
        if record is None:
            continue
        if as_json:
            typer.echo(json.dumps(record))
        else:
            console.print(" ".join(_cells(record)), highlight=False)


def _table(records: list[dict[str, Any]]) -> None:
    console = _console()
    table = Table(title=f"{len(records)} requests")
    for name in _COLUMNS:
        table.add_column(name)
    for name in _NUMBERS:
        table.add_column(name, justify="right")
    for record in records:
        table.add_row(*_cells(record))
    console.print(table)


def _cells(record: dict[str, Any]) -> list[str]:
    tokens = ""
    if "tokens_in" in record:
        tokens = f"{record['tokens_in']}+{record.get('tokens_out', 0)}"
    cost, total = record.get("cost_usd"), record.get("total_ms")
    return [
        _when(record.get("ts", 0.0)),
        str(record.get("id", "")),
        str(record.get("project", "-")),
        str(record.get("key", "")),
        str(record.get("model", "")),
        str(record.get("layer", "")),
        str(record.get("status", "")),
        str(record.get("error", "")),
        str(record.get("provider", "")),
        "" if total is None else f"{total:.1f}",  # the edge's records have stages only
        tokens,
        "" if cost is None else f"{cost:.6f}",
    ]


def _when(ts: object) -> str:
    if not isinstance(ts, (int, float)):
        return str(ts)
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _console() -> Console:
    return Console(width=200) if not Console().is_terminal else Console()
