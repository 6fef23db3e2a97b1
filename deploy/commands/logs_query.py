"""`prism logs query "SQL"`: SQL (DuckDB) over the request log's durable files, a local
directory's or an S3 bucket's (deploy/request_log_files.py)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from deploy.local.stack import REQUEST_LOG_DIR
from deploy.request_log_files import days_between, fetch_days, has_files, requests_view

from ._options import JsonOption
from .keys import fail

if TYPE_CHECKING:
    import duckdb

__all__ = ["query", "register"]

_DEV_DIR = Path(".prism") / REQUEST_LOG_DIR  # where `prism dev` keeps them by default
_CACHE = Path.home() / ".cache" / "prism" / "request-log"
_BUCKET_DAYS = 7  # days fetched from a bucket without --since


def _day(option: str, text: str | None) -> date | None:
    if text is None:
        return None
    try:
        if len(text) == 10:
            return date.fromisoformat(text)
    except ValueError:
        pass
    raise fail(f"{option}: {text[:40]!r} is not a date (YYYY-MM-DD)", 2)


def _connect() -> duckdb.DuckDBPyConnection:
    try:
        import duckdb
    except ImportError:
        raise fail(
            "prism logs query needs DuckDB: pip install 'prism-edge-gateway[logs]'", 1
        ) from None
    return duckdb.connect()


def _s3_root(bucket: str, prefix: str, since: date, until: date, cache: Path) -> Path:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    if since > until:
        raise fail(f"--since {since} is after --until {until}", 2)
    try:
        root, fetched = fetch_days(
            boto3.client("s3"), bucket, prefix, list(days_between(since, until)), cache
        )
    except (BotoCoreError, ClientError) as error:
        raise fail(f"S3 bucket {bucket}: {error}") from None
    typer.echo(f"s3://{bucket}/{prefix}: {since} to {until}, {fetched} new file(s)", err=True)
    return root


def _cell(value: Any) -> Any:
    """A value as JSON has it (DuckDB gives dates, decimals, JSON as text, ...)."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, dict | list | str | int | float | bool) or value is None:
        return value
    return str(value)


def query(
    sql: Annotated[str, typer.Argument(help="A SQL query over the view `requests`.")],
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir",
            envvar="PRISM_LOG_DIR",
            help=f"The files' directory (PRISM_LOG_DIR). [default: {_DEV_DIR}, prism dev's]",
        ),
    ] = None,
    bucket: Annotated[
        str | None,
        typer.Option("--bucket", envvar="PRISM_LOG_BUCKET", help="Read an S3 bucket instead."),
    ] = None,
    prefix: Annotated[
        str,
        typer.Option("--prefix", envvar="PRISM_LOG_PREFIX", help="The files' key prefix in it."),
    ] = "requests/",
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help=f"First UTC day, YYYY-MM-DD. [default: all; a bucket: {_BUCKET_DAYS} days]",
        ),
    ] = None,
    until: Annotated[
        str | None, typer.Option("--until", help="Last UTC day, YYYY-MM-DD. [default: today]")
    ] = None,
    cache: Annotated[
        Path, typer.Option("--cache", help="Where a bucket's files are copied to.")
    ] = _CACHE,
    as_json: JsonOption = False,
) -> None:
    """Run SQL over the request log's files: one row per request in the view `requests`
    (its columns are the record's fields, with `day` and `time`).

    A bucket's days are copied to --cache first (DuckDB's S3 extension is downloaded at
    run time, which needs internet access).

    Example: prism logs query "SELECT layer, count(*) FROM requests GROUP BY 1"
    """
    first, last = _day("--since", since), _day("--until", until)
    if bucket:
        today = datetime.now(UTC).date()
        last = last or today
        first = first or last - timedelta(days=_BUCKET_DAYS - 1)
        prefix = prefix.lstrip("/") + ("/" if prefix and not prefix.endswith("/") else "")
        root = _s3_root(bucket, prefix, first, last, cache)
    else:
        root = directory or _DEV_DIR
        if not root.is_dir():
            raise fail(f"no request log at {root} (--dir, or PRISM_LOG_DIR)", 1)
    if not has_files(root):
        raise fail(f"no request log files under {root}", 1)
    connection = _connect()
    import duckdb

    try:
        connection.execute(requests_view(root, first, last))
        cursor = connection.execute(sql)
        names = [column[0] for column in cursor.description or []]
        rows = cursor.fetchall()
    except (duckdb.ParserException, duckdb.BinderException, duckdb.CatalogException) as error:
        # DuckDB's message, its pointer at the fault included, without its blank lines.
        message = "\n".join(line for line in str(error).splitlines() if line.strip())
        raise fail(f"SQL: {message}", 2) from None
    except duckdb.Error as error:
        raise fail(f"the query failed: {error}", 1) from None
    finally:
        connection.close()
    if as_json:
        found = [{n: _cell(v) for n, v in zip(names, row, strict=True)} for row in rows]
        typer.echo(json.dumps(found))
        return
    table = Table(*names)
    for row in rows:
        table.add_row(*("" if value is None else str(value) for value in row))
    console = Console() if Console().is_terminal else Console(width=200)
    console.print(table)
    console.print(f"{len(rows):,} row(s)")


def register(app: typer.Typer) -> None:
    """Add `query` to ``app`` (the `prism logs` group)."""
    app.command("query")(query)
