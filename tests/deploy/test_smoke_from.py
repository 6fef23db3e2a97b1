"""`prism smoke URL --from PLACE`: Globalping probes in those places ask the edge, through
a local stand-in of Globalping's API that runs the probes' requests itself against the
two-region local stack (real HTTP, the real Workers runtime, two origins)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from typer.testing import CliRunner, Result

from deploy.cli import app
from deploy.globalping import ProbeRequest, row_of
from deploy.local.globalping_api import GlobalpingStandIn
from deploy.local.stack import StackInfo
from tests.fixtures.stacks import two_region_stack

TOKEN = "gp-test-token-do-not-print"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackInfo]:
    local = two_region_stack(tmp_path_factory.mktemp("smoke-from"))
    try:
        yield local.start()
    finally:
        local.stop()


@pytest.fixture(scope="module")
def globalping() -> Iterator[GlobalpingStandIn]:
    with GlobalpingStandIn(token=TOKEN) as api:
        yield api


def smoke(info: StackInfo, api: GlobalpingStandIn, *places: str, token: str = TOKEN) -> Result:
    args = ["smoke", info.edge_url, "--key", info.api_key, "--json"]
    for place in places:
        args += ["--from", place]
    env = {"PRISM_GLOBALPING_API": api.url, "PRISM_GLOBALPING_TOKEN": token}
    return CliRunner().invoke(app, args, env=env)


def test_each_place_is_answered_by_its_pop_and_its_nearest_origin(
    stack: StackInfo, globalping: GlobalpingStandIn
) -> None:
    created = globalping.created
    result = smoke(stack, globalping, "Singapore", "San Francisco")
    assert result.exit_code == 0, result.output
    assert TOKEN not in result.output and stack.api_key not in result.output
    regions = {region["from"]: region for region in json.loads(result.output)}
    assert set(regions) == {"Singapore", "San Francisco"}
    for place, origin in (("Singapore", "ap-south-1"), ("San Francisco", "us-west-1")):
        region = regions[place]
        assert region["ok"], region
        assert region["probe"].startswith(place)
        rows = {row["request"]: row for row in region["requests"]}
        assert [rows[name]["status"] for name in ("edge", "kv", "origin")] == [401, 200, 200]
        assert rows["edge"]["origin_region"] is None  # the PoP refused it alone
        assert rows["origin"]["origin_region"] == origin  # no-cache: the nearest origin
        assert all(isinstance(row["total_ms"], int) for row in rows.values())
    assert globalping.created == created + 6  # three measurements per place


def test_a_wrong_token_or_an_unknown_place_fails_and_says_why(
    stack: StackInfo, globalping: GlobalpingStandIn
) -> None:
    result = smoke(stack, globalping, "Singapore", token="not-the-token")
    assert result.exit_code == 1
    assert "not-the-token" not in result.output
    assert "401" in json.loads(result.output)[0]["error"]

    result = smoke(stack, globalping, "Atlantis")
    assert result.exit_code == 1
    assert "no_probes_found" in json.loads(result.output)[0]["error"]


def test_the_stand_in_refuses_what_globalping_refuses(globalping: GlobalpingStandIn) -> None:
    """A probe sends no POST, no body, and not its own Host or User-Agent: why the chat
    smoke cannot run from a probe."""
    auth = {"authorization": f"Bearer {TOKEN}"}
    base = {"type": "http", "target": "127.0.0.1", "locations": [{"magic": "Singapore"}]}
    for request in ({"method": "POST"}, {"method": "GET", "headers": {"Host": "x"}}):
        response = httpx.post(
            globalping.url + "/v1/measurements",
            json={**base, "measurementOptions": {"request": request}},
            headers=auth,
        )
        assert response.status_code == 400, response.text
        assert response.json()["error"]["type"] == "validation_error"
    assert httpx.get(globalping.url + "/v1/measurements/nope").status_code == 404


def test_the_text_output_is_a_table_per_place(
    stack: StackInfo, globalping: GlobalpingStandIn
) -> None:
    args = ["smoke", stack.edge_url, "--key", stack.api_key, "--from", "Mumbai"]
    env = {"PRISM_GLOBALPING_API": globalping.url, "PRISM_GLOBALPING_TOKEN": TOKEN}
    result = CliRunner().invoke(app, args, env={**env, "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "--from Mumbai" in result.output and "Mumbai, IN" in result.output
    assert "ap-south-1" in result.output
    assert "GET only" in result.output  # the limitation, said where the numbers are
    assert TOKEN not in result.output and stack.api_key not in result.output


def test_a_result_in_globalpings_format_names_the_pop_from_cf_ray() -> None:
    result = {
        "status": "finished",
        "statusCode": 200,
        "headers": {"cf-ray": "8f1a2b3c4d5e6f70-SIN", "x-prism-origin-region": "ap-south-1"},
        "timings": {"total": 180, "dns": 2, "tcp": 4, "tls": 9, "firstByte": 150, "download": 1},
    }
    row = row_of(ProbeRequest("origin", {}, 200), result)
    assert (row["pop"], row["origin_region"], row["ok"]) == ("SIN", "ap-south-1", True)
    assert (row["first_byte_ms"], row["total_ms"]) == (150, 180)
    failed = row_of(ProbeRequest("kv", {}, 200), {"status": "failed", "rawOutput": "timeout"})
    assert not failed["ok"] and failed["failure"] == "timeout"
