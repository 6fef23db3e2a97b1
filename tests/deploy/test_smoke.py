"""`prism smoke` against the edge stack: the layers its help promises, and a failure when
they are not what they should be."""

from __future__ import annotations

import json
from typing import Any

from typer.testing import CliRunner

from deploy.cli import app
from deploy.commands.smoke import expected_layers
from tests.fixtures.edge import EdgeStack

runner = CliRunner()


def smoke(url: str, key: str) -> tuple[int, list[dict[str, Any]]]:
    result = runner.invoke(
        app, ["smoke", url, "--key", key, "--json", "--pause", "0.3", "--model", "demo"]
    )
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def test_help_names_the_layers_smoke_checks() -> None:
    result = runner.invoke(app, ["smoke", "--help"], env={"COLUMNS": "200"})
    text = " ".join(result.output.split())
    assert "miss (the provider), then redis (the origin's cache;" in text
    assert "or kv (the origin's KV writer got there first), then kv (the edge's cache)" in text
    assert "straight at the origin, miss, redis, redis" in text


def test_through_the_edge_the_layers_are_miss_a_hit_then_kv(edge: EdgeStack, api_key: str) -> None:
    code, rows = smoke(edge.url, api_key)

    assert code == 0, rows
    assert [r["expected"] for r in rows] == [["miss"], ["redis", "kv"], ["kv"]]
    assert [r["status"] for r in rows] == [200, 200, 200]
    # the origin replicates to KV here, so the repeat may already come from there
    assert rows[0]["layer"] == "miss" and rows[1]["layer"] in ("redis", "kv")
    assert rows[2]["layer"] == "kv"
    assert "origin-" in rows[0]["server_timing"]  # the edge forwarded the miss


def test_at_the_origin_the_layers_are_miss_redis_redis(edge: EdgeStack, api_key: str) -> None:
    code, rows = smoke(edge.origin.url, api_key)

    assert code == 0, rows
    assert [r["layer"] for r in rows] == ["miss", "redis", "redis"]
    assert [r["expected"] for r in rows] == [["miss"], ["redis"], ["redis"]]


def test_an_edge_whose_kv_never_answers_fails_the_smoke_test(edge: EdgeStack, api_key: str) -> None:
    # Every answer is right, but the third came from the origin again: KV did not keep it.
    code, rows = smoke(edge.extra("slow_kv"), api_key)

    assert code == 1
    assert [(r["status"], r["layer"]) for r in rows][:2] == [(200, "miss"), (200, "redis")]
    assert rows[2]["expected"] == ["kv"] and rows[2]["layer"] == "redis"
    assert not rows[2]["ok"]


def test_a_failing_request_stops_the_smoke_test(edge: EdgeStack, api_key: str) -> None:
    code, rows = smoke(edge.extra("no_origin"), api_key)

    assert code == 1
    assert len(rows) == 1 and rows[0]["status"] == 502
    assert rows[0]["error"] == "The Prism origin is unreachable from this edge."


def test_expected_layers_follow_where_the_first_answer_came_from() -> None:
    assert expected_layers("auth;dur=1, kv;dur=2, origin;dur=3, origin-upstream;dur=4") == (
        ("miss",),
        ("redis", "kv"),
        ("kv",),
    )
    assert expected_layers("upstream;dur=4") == (("miss",), ("redis",), ("redis",))
