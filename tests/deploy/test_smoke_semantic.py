"""`prism smoke --semantic` against the edge stack (the real Workers runtime, a real
origin with the real model): the paraphrase comes from the semantic cache when the
project's policy turns it on, and the smoke test fails when it does not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from deploy.cli import app
from tests.fixtures.edge import EdgeStack

pytest.importorskip("numpy", reason="the semantic extra is not installed")

PROJECT = "smoke-semantic"  # its own project: the stack is shared with the other edge tests
runner = CliRunner()


def policy(edge: EdgeStack, *args: str) -> None:
    done = runner.invoke(app, ["policy", *args, "--project", PROJECT], env=edge.cli_env())
    assert done.exit_code == 0, done.output


@pytest.fixture
def project_key(edge: EdgeStack) -> Iterator[str]:
    yield edge.key_ring.mint(PROJECT)
    policy(edge, "clear")


def smoke(url: str, key: str) -> tuple[int, list[dict[str, Any]]]:
    args = ["smoke", url, "--key", key, "--json", "--pause", "1", "--model", "demo", "--semantic"]
    result = runner.invoke(app, args)
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def test_smoke_semantic_shows_a_paraphrase_answered_semantically(
    edge: EdgeStack, project_key: str
) -> None:
    policy(edge, "set", "--semantic")
    code, rows = smoke(edge.url, project_key)

    assert code == 0, rows
    assert [r["expected"] for r in rows[3:]] == [["miss"], ["semantic"]]
    assert [r["layer"] for r in rows[3:]] == ["miss", "semantic"]


def test_smoke_semantic_fails_for_a_project_without_the_semantic_cache(
    edge: EdgeStack, project_key: str
) -> None:
    code, rows = smoke(edge.origin.url, project_key)

    assert code == 1
    assert [r["layer"] for r in rows] == ["miss", "redis", "redis", "miss", "miss"]
    assert rows[4]["expected"] == ["semantic"] and not rows[4]["ok"]
