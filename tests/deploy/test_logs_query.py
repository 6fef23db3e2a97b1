"""`prism logs query` over files the durable sink really wrote: a directory's and an S3
bucket's (moto) days, a table for people and JSON for scripts, every field of the record
a column, and one clear line (exit 2) for bad SQL."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner, Result

from deploy.commands.logs_query import register
from origin.requestlog.files import FileSink, LocalFiles, S3Files
from tests.fixtures.aws import MockAws
from tests.origin.requestlog.samples import DAY, THURSDAY, lines, record

runner = CliRunner()
logs = typer.Typer()
register(logs)


@logs.callback()
def _group() -> None:
    """The request log (as `prism logs`, which the query joins)."""


def query(*args: str, env: dict[str, str] | None = None) -> Result:
    return runner.invoke(logs, ["query", *args], env={"COLUMNS": "200", **(env or {})})


def written(tmp_path: Path) -> Path:
    """25 requests of acme on two days, 5 of beta, one without a project."""
    batch: list[dict[str, Any]] = [record(i) for i in range(20)]
    batch += [record(i, ts=THURSDAY + DAY) for i in range(20, 25)]
    batch += [record(i, project="beta", score=0.93) for i in range(25, 30)]
    batch.append(record(30, project=None, status=401, error="invalid_api_key"))
    root = tmp_path / "requests"
    asyncio.run(FileSink(LocalFiles(root)).write(lines(batch)))
    return root


def test_a_group_by_over_the_directory_as_json(tmp_path: Path) -> None:
    root = written(tmp_path)
    result = query(
        "SELECT project, layer, count(*) AS n FROM requests GROUP BY ALL ORDER BY ALL",
        "--dir", str(root), "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert {(r["project"], r["layer"]): r["n"] for r in rows if r["project"] == "acme"} == {
        ("acme", "miss"): 5, ("acme", "redis"): 5, ("acme", "semantic"): 5,
        ("acme", "kv"): 5, ("acme", "bypass"): 5,
    }  # fmt: skip
    assert sum(r["n"] for r in rows) == 31
    assert [r for r in rows if r["project"] is None] == [
        {"project": None, "layer": "miss", "n": 1}  # the folder "-" reads as NULL
    ]


def test_every_field_is_a_column_nested_ones_as_json(tmp_path: Path) -> None:
    root = written(tmp_path)
    sql = (
        "SELECT id, day, time, stream, tokens_in, score, stages->>'redis' AS redis_ms, "
        "attempts->0->>'provider' AS first, body FROM requests WHERE id = 'req-000026'"
    )
    result = query(sql, "--dir", str(root), "--json")
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.output)
    assert row["day"] == "2025-12-04" and row["time"].startswith("2025-12-04T13:00:00.276")
    assert row["stream"] is True and row["tokens_in"] == 38 and row["score"] == 0.93
    assert row["redis_ms"] == "0.4" and row["first"] == "openai" and row["body"] is None


def test_since_and_until_choose_the_days(tmp_path: Path) -> None:
    root = written(tmp_path)
    count = "SELECT count(*) AS n FROM requests"
    friday = query(count, "--dir", str(root), "--since", "2025-12-05", "--json")
    assert json.loads(friday.output) == [{"n": 5}]
    thursday = query(count, "--dir", str(root), "--until", "2025-12-04", "--json")
    assert json.loads(thursday.output) == [{"n": 26}]


def test_the_table_for_people(tmp_path: Path) -> None:
    root = written(tmp_path)
    result = query(
        "SELECT error, status FROM requests WHERE error IS NOT NULL",
        env={"PRISM_LOG_DIR": str(root)},
    )
    assert result.exit_code == 0, result.output
    assert "invalid_api_key" in result.output and "401" in result.output
    assert "1 row(s)" in result.output


def test_bad_sql_is_one_line_and_exit_2(tmp_path: Path) -> None:
    root = written(tmp_path)
    for sql in ("SELEC layer FROM requests", "SELECT no_such_column FROM requests",
                "SELECT * FROM no_such_table"):  # fmt: skip
        result = query(sql, "--dir", str(root))
        assert result.exit_code == 2, (sql, result.output)
        assert result.output.startswith("Error: SQL: ") and "Traceback" not in result.output
    assert "LINE 1: SELEC layer" in query("SELEC layer FROM requests", "--dir", str(root)).output
    bad_day = query("SELECT 1", "--dir", str(root), "--since", "yesterday")
    assert bad_day.exit_code == 2 and "not a date" in bad_day.output


def test_no_files_is_a_clear_error(tmp_path: Path) -> None:
    result = query("SELECT 1", "--dir", str(tmp_path / "nothing"))
    assert result.exit_code == 1 and "no request log at" in result.output
    (tmp_path / "empty").mkdir()
    result = query("SELECT 1", "--dir", str(tmp_path / "empty"))
    assert result.exit_code == 1 and "no request log files under" in result.output


def test_a_buckets_days_are_fetched_then_queried(aws: MockAws, tmp_path: Path) -> None:
    s3 = aws.client("s3")
    s3.create_bucket(
        Bucket="prism-request-logs", CreateBucketConfiguration={"LocationConstraint": "ap-south-1"}
    )
    sink = FileSink(S3Files(s3, "prism-request-logs", "origin/main/requests/"))
    asyncio.run(sink.write(lines([record(i) for i in range(10)] + [record(10, ts=THURSDAY + DAY)])))
    args = ["SELECT day, count(*) AS n FROM requests GROUP BY 1 ORDER BY 1", "--json",
            "--bucket", "prism-request-logs", "--prefix", "origin/main/requests",
            "--cache", str(tmp_path / "cache")]  # fmt: skip

    both = query(*args, "--since", "2025-12-04", "--until", "2025-12-05")
    assert both.exit_code == 0, both.output
    assert json.loads(both.stdout) == [
        {"day": "2025-12-04", "n": 10},
        {"day": "2025-12-05", "n": 1},
    ]
    assert "2 new file(s)" in both.stderr
    again = query(*args, "--since", "2025-12-04", "--until", "2025-12-04")
    assert json.loads(again.stdout) == [{"day": "2025-12-04", "n": 10}]
    assert "0 new file(s)" in again.stderr  # already in the cache
