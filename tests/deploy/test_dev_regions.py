"""`prism dev --regions 2`: two origins (the second on a Redis replica), the edge knowing
both, all on real parts; the edge picks by where a request comes from and fails over."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from deploy.cli import app
from deploy.local.stack import LocalStack, StackInfo
from tests.fixtures.stacks import CLI_START, two_region_stack
from tests.polling import wait_for

CHAT = "/v1/chat/completions"
ASIA = {"continent": "AS", "country": "IN", "colo": "BOM"}
AMERICA = {"continent": "NA", "country": "US", "colo": "SJC"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStack, StackInfo]]:
    local = two_region_stack(tmp_path_factory.mktemp("dev-regions"))
    info = local.start()
    try:
        yield local, info
    finally:
        local.stop()


def ask(
    info: StackInfo, url: str, body: dict[str, object], where: dict[str, str]
) -> httpx.Response:
    return httpx.post(
        url + CHAT,
        json=body,
        headers={"authorization": f"Bearer {info.api_key}", "mf-cf-blob": json.dumps(where)},
        timeout=30,
    )


def body() -> dict[str, object]:
    return {"model": "demo", "messages": [{"role": "user", "content": secrets.token_hex(8)}]}


def test_two_regions_the_edge_picks_the_near_one_and_the_far_one_reads_the_replica(
    stack: tuple[LocalStack, StackInfo],
) -> None:
    _, info = stack
    assert list(info.regions) == ["us-west-1", "ap-south-1"]
    assert {c.name for c in info.components} >= {"replica", "origin-ap-south-1"}

    asked = body()
    first = ask(info, info.edge_url, asked, AMERICA)
    assert first.status_code == 200, first.text
    assert first.headers["x-prism-origin-region"] == "us-west-1"
    assert first.headers["x-prism-edge-cache-layer"] == "miss"

    # The entry the us-west-1 origin wrote to the primary: the ap-south-1 origin, asked
    # directly (the edge would answer from KV), serves it from its replica.
    far = info.regions["ap-south-1"]
    wait_for(
        lambda: ask(info, far, asked, ASIA).headers["x-prism-edge-cache-layer"] == "redis",
        timeout=10,
    )
    other = ask(info, info.edge_url, body(), ASIA)
    assert other.status_code == 200, other.text
    assert other.headers["x-prism-origin-region"] == "ap-south-1"


def test_two_regions_with_one_origin_killed_the_other_answers(
    stack: tuple[LocalStack, StackInfo],
) -> None:
    local, info = stack
    pid = local.pid("origin-ap-south-1")
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: local.dead_component() == "origin-ap-south-1", timeout=10)
    response = ask(info, info.edge_url, body(), ASIA)
    assert response.status_code == 200, response.text
    assert response.headers["x-prism-origin-region"] == "us-west-1"
    assert 'origin-error;desc="ap-south-1"' in response.headers["server-timing"]


def test_an_origin_that_exits_is_restarted_while_the_rest_serves(
    stack: tuple[LocalStack, StackInfo],
) -> None:
    local, info = stack
    pid = local.pid("origin-ap-south-1")
    assert pid is not None
    with contextlib.suppress(ProcessLookupError):  # the test before may have killed it
        os.kill(pid, signal.SIGKILL)
    said = wait_for(lambda: local.origins.check(), timeout=30)
    assert "origin-ap-south-1 exited" in said[0]
    assert local.regions_up()["ap-south-1"] == "restarting"
    assert local.fatal_component() is None  # the stack serves on
    response = ask(info, info.edge_url, body(), ASIA)
    assert response.status_code == 200, response.text
    assert response.headers["x-prism-origin-region"] == "us-west-1"

    said = wait_for(lambda: local.origins.check(), timeout=CLI_START)
    assert said == [f"origin-ap-south-1 is back at {info.regions['ap-south-1']}"]
    assert local.regions_up() == {"us-west-1": "up", "ap-south-1": "up"}
    assert local.pid("origin-ap-south-1") != pid
    response = ask(info, info.regions["ap-south-1"], body(), ASIA)
    assert response.status_code == 200, response.text


def test_a_stopped_origin_is_reported_and_prism_status_names_the_region_down(
    stack: tuple[LocalStack, StackInfo],
) -> None:
    local, info = stack
    wait_for(lambda: local.regions_up()["ap-south-1"] == "up" or local.origins.check(), 60)
    pid = local.pid("origin-ap-south-1")
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        said = wait_for(lambda: local.origins.check(), timeout=30)
        assert "origin-ap-south-1 is stopped" in said[0]
        assert local.regions_up()["ap-south-1"] == "stopped"
        # A hung origin costs a probe (2 s, then 1 s), not the origin timeout (90 s).
        response = ask(info, info.edge_url, body(), ASIA)
        assert response.status_code == 200, response.text
        assert response.headers["x-prism-origin-region"] == "us-west-1"

        state = str(local.config.state_dir)
        result = CliRunner().invoke(app, ["status", "--state-dir", state, "--json"])
        rows = {row["part"]: row for row in json.loads(result.output)}
        assert rows["origin us-west-1"]["state"] == "ok"
        assert rows["origin ap-south-1"]["state"] == "down"
        assert result.exit_code == 1
    finally:
        os.kill(pid, signal.SIGCONT)
    assert wait_for(lambda: local.origins.check(), timeout=30) == ["origin-ap-south-1 resumed"]


def test_dev_takes_one_or_two_regions(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["dev", "--regions", "3", "--state-dir", str(tmp_path)])
    assert result.exit_code != 0
    assert "--regions" in result.output
