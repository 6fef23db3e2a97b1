"""`prism usage` reads what a real origin recorded in a real Redis: a table for people,
JSON for scripts, the budget's state, and one clear line for bad input."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import redis
from typer.testing import CliRunner, Result

from deploy.cli import app
from origin.governance.usage import usage_key
from prism import Budget, Policy, policy_key
from tests.fixtures.origin import RunningOrigin
from tests.polling import wait_for

runner = CliRunner()
MODEL = "gpt-4o-mini"


def usage(redis_url: str, *args: str) -> Result:
    return runner.invoke(app, ["usage", *args], env={"REDIS_URL": redis_url, "COLUMNS": "200"})


def post(origin: RunningOrigin, key: str, content: str) -> httpx.Response:
    payload = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
    response = httpx.post(
        origin.url + "/v1/chat/completions",
        json=payload,
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert response.status_code == 200
    return response


def test_usage_prints_what_the_origin_recorded(
    origin: RunningOrigin, api_key: str, redis_url: str
) -> None:
    admin = redis.Redis.from_url(redis_url)
    admin.set(policy_key("acme"), Policy(budget=Budget(2.5, "day")).encode())
    first = post(origin, api_key, "hello")
    post(origin, api_key, "world")
    origin.wait_stored()
    post(origin, api_key, "hello")  # a hit
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    wait_for(
        lambda: admin.hget(f"prism:usage:acme:{day}", f"requests.redis|{_key_id(api_key)}|{MODEL}")
    )
    admin.close()

    result = usage(redis_url, "--project", "acme", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    [row] = report["rows"]
    assert (row["day"], row["key_id"], row["model"]) == (day, _key_id(api_key), MODEL)
    assert row["requests"] == {
        "redis": 1,
        "semantic": 0,
        "miss": 2,
        "bypass": 0,
        "coalesced": 0,
        "kv": 0,
    }
    assert row["tokens_in"] > first.json()["usage"]["prompt_tokens"]
    assert row["cost_usd"] > 0 and 0 < row["saved_usd"] < row["cost_usd"]
    assert report["totals"]["requests"]["miss"] == 2
    budget = report["budget"]
    assert budget["usd"] == 2.5 and budget["current"] == day and budget["reserved_usd"] == 0
    assert budget["spent_usd"] == pytest.approx(row["cost_usd"])
    assert budget["left_usd"] == pytest.approx(2.5 - row["cost_usd"])

    text = usage(redis_url, "--project", "acme", "--since", day)
    assert text.exit_code == 0, text.output
    assert f"Usage of acme, {day} to {day}" in text.stdout
    assert MODEL in text.stdout and _key_id(api_key) in text.stdout
    assert "Budget: $2.5 per UTC day" in text.stdout and "left" in text.stdout

    empty = usage(redis_url, "--project", "other")
    assert empty.exit_code == 0 and "No usage recorded" in empty.stdout


def test_a_day_written_before_semantic_hits_were_counted_apart_reads_none(
    admin: redis.Redis, redis_url: str
) -> None:
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    # As origins wrote it before the semantic layer: its hits were counted under redis.
    admin.hset(usage_key("acme", day), mapping={"requests.redis|k1|m": 3, "requests.miss|k1|m": 1})

    result = usage(redis_url, "--project", "acme", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    [row] = report["rows"]
    assert row["requests"] == {
        "redis": 3,
        "semantic": 0,
        "miss": 1,
        "bypass": 0,
        "coalesced": 0,
        "kv": 0,
    }
    assert report["totals"]["requests"]["semantic"] == 0

    text = usage(redis_url, "--project", "acme")
    assert text.exit_code == 0, text.output
    assert "Semantic" in text.stdout


def _key_id(key: str) -> str:
    return key.split(".")[2]  # sk-prism-v1.<project>.<key id>.<signature>


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--project", "Acme!"], "--project: 'Acme!' is not a project id"),
        (["--project", "acme", "--since", "yesterday"], "--since: 'yesterday' is not a date"),
        (["--project", "acme", "--since", "2026-13-01"], "is not a date (YYYY-MM-DD)"),
        (["--project", "acme", "--since", "20261101"], "is not a date (YYYY-MM-DD)"),
        (["--project", "acme", "--since", "2999-01-01"], "is in the future"),
        (["--project", "acme", "--since", "2001-01-01"], "usage is kept 400 days"),
    ],
)
def test_bad_input_is_one_clear_line(redis_url: str, args: list[str], message: str) -> None:
    result = usage(redis_url, *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr


def test_an_unreachable_redis_is_one_line() -> None:
    from deploy.local.ports import free_port

    week = (datetime.now(UTC) - timedelta(days=3)).strftime("%Y-%m-%d")
    result = usage(f"redis://127.0.0.1:{free_port()}", "--project", "acme", "--since", week)
    assert result.exit_code == 1
    assert "Redis at redis://127.0.0.1" in result.stderr and "Traceback" not in result.stderr
