"""Reading the request log's durable files (written by ``origin.requestlog.files``): the
DuckDB view ``requests`` over a directory of them, and a local copy of an S3 bucket's days.

The view reads every ``day=*/project=*/*.jsonl.gz`` with one fixed schema, the record's
fields as the request log defines them, so a column is there (NULL) even in files where
no record had it (``score``, ``body``, ...), and no file has to be opened to learn the
schema first (``union_by_name`` over auto-detection is about five times slower). The
nested fields (``attempts``, ``stages``, ``body``, ``providers``) are DuckDB JSON:
``stages->>'redis'``, ``attempts->0->>'provider'``, ``json_array_length(attempts)``.
``day`` (DATE) and ``project`` come from the folders, and DuckDB skips the folders a
``WHERE day ...`` excludes; ``time`` is ``ts`` as a timestamp.

S3: DuckDB's own S3 support (httpfs) is an extension it downloads on first use, which a
machine without internet access cannot, so the days asked for are copied with boto3 into
a local cache first (an object already there, same size, is not fetched again: a file's
name is its content's digest) and queried there.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["COLUMNS", "days_between", "fetch_days", "has_files", "requests_view"]

# The request record's fields (origin/requestlog: the contract both halves build to).
COLUMNS = {
    "ts": "DOUBLE",
    "id": "VARCHAR",
    "source": "VARCHAR",
    "project": "VARCHAR",
    "key": "VARCHAR",
    "api": "VARCHAR",
    "method": "VARCHAR",
    "path": "VARCHAR",
    "stream": "BOOLEAN",
    "model": "VARCHAR",
    "answered_model": "VARCHAR",
    "provider": "VARCHAR",
    "providers": "JSON",
    "attempts": "JSON",
    "layer": "VARCHAR",
    "score": "DOUBLE",
    "status": "INTEGER",
    "error": "VARCHAR",
    "tokens_in": "BIGINT",
    "tokens_out": "BIGINT",
    "cost_usd": "DOUBLE",
    "saved_usd": "DOUBLE",
    "stages": "JSON",
    "ttfb_ms": "DOUBLE",
    "total_ms": "DOUBLE",
    "region": "VARCHAR",
    "pop": "VARCHAR",
    "fingerprint": "VARCHAR",
    "body": "JSON",
}
NO_PROJECT = "-"  # the folder of records without a project (origin.requestlog.files)
_FETCHERS = 8  # objects downloaded at once: they are many and small


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def requests_view(root: Path, since: date | None = None, until: date | None = None) -> str:
    """The SQL that creates the view ``requests`` over the files under ``root``, only the
    days from ``since`` to ``until`` (inclusive) when given."""
    columns = ", ".join(f"{_literal(name)}: {_literal(kind)}" for name, kind in COLUMNS.items())
    days = []
    if since is not None:
        days.append(f"day >= DATE {_literal(since.isoformat())}")
    if until is not None:
        days.append(f"day <= DATE {_literal(until.isoformat())}")
    where = f" WHERE {' AND '.join(days)}" if days else ""
    pattern = _literal(str(root / "day=*" / "project=*" / "*.jsonl.gz"))
    return (
        "CREATE OR REPLACE VIEW requests AS SELECT * REPLACE "
        f"(nullif(project, {_literal(NO_PROJECT)}) AS project), to_timestamp(ts) AS time "
        f"FROM read_json({pattern}, format = 'newline_delimited', hive_partitioning = true, "
        f"columns = {{{columns}}}){where}"
    )


def has_files(root: Path) -> bool:
    return any(root.glob("day=*/project=*/*.jsonl.gz"))


def days_between(since: date, until: date) -> Iterator[date]:
    day = since
    while day <= until:
        yield day
        day += timedelta(days=1)


def fetch_days(
    s3: S3Client, bucket: str, prefix: str, days: list[date], cache: Path
) -> tuple[Path, int]:
    """Copy the bucket's files of ``days`` under ``cache``; (the local root to query, the
    objects fetched now)."""
    root = cache / bucket / prefix
    wanted: list[tuple[str, Path]] = []
    for day in days:
        pages = s3.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=f"{prefix}day={day.isoformat()}/"
        )
        for page in pages:
            for item in page.get("Contents", []):
                key = item["Key"]
                local = root / key[len(prefix) :]
                if not key.endswith(".jsonl.gz"):
                    continue
                if local.exists() and local.stat().st_size == item["Size"]:
                    continue
                wanted.append((key, local))

    def fetch(job: tuple[str, Path]) -> None:
        key, local = job
        local.parent.mkdir(parents=True, exist_ok=True)
        temporary = local.with_name(f".{local.name}.{os.getpid()}.tmp")
        try:
            s3.download_file(bucket, key, str(temporary))
            temporary.replace(local)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()

    with ThreadPoolExecutor(_FETCHERS) as pool:
        list(pool.map(fetch, wanted))
    return root, len(wanted)
