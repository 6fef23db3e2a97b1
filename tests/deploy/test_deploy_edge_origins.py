"""`prism deploy edge --origin REGION=URL ...`: the edge's PRISM_ORIGINS binding, offline
(the pinned wrangler's dry run; no Cloudflare API)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from deploy.commands import deploy
from tests.deploy.test_deploy_edge import edge_env, needs_wrangler
from tests.fixtures.workers import KVApi

US, AP = "us-west-1=https://us.example.com", "ap-south-1=https://ap.example.com/"


@pytest.fixture
def cli() -> typer.Typer:
    root = typer.Typer()
    root.add_typer(deploy.app)
    return root


@needs_wrangler
def test_origins_become_the_edges_binding_and_the_first_its_origin_url(
    kv_api: KVApi, cli: typer.Typer, tmp_path: Path
) -> None:
    out = tmp_path / "stage"
    args = ["deploy", "edge", "--dry-run", "--out", str(out), "--origin", US, "--origin", AP]
    env = edge_env(kv_api, CLOUDFLARE_API_TOKEN=None, PRISM_ORIGIN_URL=None)
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    variables = tomllib.loads((out / "wrangler.toml").read_text())["vars"]
    assert variables["PRISM_ORIGINS"] == f"{US},{AP}"
    assert variables["ORIGIN_URL"] == "https://us.example.com"


@pytest.mark.parametrize(
    ("origin", "message"),
    [
        ("https://us.example.com", "expected region=url"),
        ("us-west-1=http://us.example.com", "must use https"),
        ("us-west-1=https://user:pw@us.example.com", "must not contain credentials"),
    ],
)
def test_a_bad_origin_is_one_line_and_exit_2(
    kv_api: KVApi, cli: typer.Typer, tmp_path: Path, origin: str, message: str
) -> None:
    args = ["deploy", "edge", "--dry-run", "--out", str(tmp_path / "s"), "--origin", origin]
    result = CliRunner().invoke(cli, args, env=edge_env(kv_api))
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
