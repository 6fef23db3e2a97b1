"""`prism bench`: a smoke-sized run of the real benchmark, so it never rots.

The smoke run checks the result's shape and sanity (every section present,
numbers positive, percentiles ordered, hits really came from KV and Redis),
never the performance targets: a busy CI machine must not fail a build over a
millisecond. The targets live in the benchmark's own report.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from deploy.bench.loadgen import FALLBACK_TOOL, UNIQUE, LoadSpec, lua_string, run_load, wrk_path
from deploy.bench.profiler import summarize_collapsed
from deploy.local.asgi_thread import ThreadedServer

PRISM = [sys.executable, "-m", "deploy.cli"]
EchoServer = tuple[ThreadedServer, list[bytes]]  # the server, and the bodies it was sent


def assert_load_row(row: dict[str, Any], *, expect_2xx: bool = True) -> None:
    assert row["requests"] > 0
    assert row["errors"] == 0
    if expect_2xx:
        assert row["non_2xx"] == 0
    else:
        assert row["non_2xx"] == row["requests"]
    assert row["rps"] > 0
    assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"] <= row["max_ms"]


@pytest.mark.timeout(180)
def test_quick_bench_writes_every_section_with_sane_numbers(tmp_path: Path) -> None:
    out = tmp_path / "results"
    run = subprocess.run(
        [*PRISM, "bench", "--quick", "--json", "--out", str(out)],
        capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout)
    assert json.loads((out / "latest.json").read_text()) == result

    meta = result["meta"]
    assert meta["machine"]["cores"] >= 1
    assert len(meta["load_average"]["before"]) == 3
    assert meta["versions"]["uvicorn"] and meta["versions"]["miniflare"]
    assert meta["loadgen"]["tool"].startswith("wrk") or meta["loadgen"]["tool"] == FALLBACK_TOOL

    assert_load_row(result["loadgen_ceiling"])
    edge = result["edge"]
    assert_load_row(edge["trivial_worker"])
    assert_load_row(edge["trivial_worker_kv_read"])
    assert_load_row(edge["kv_hit"])
    assert_load_row(edge["bad_key"], expect_2xx=False)
    assert edge["layers"] == {"kv_hit": "kv", "bad_key_status": 401}

    origin = result["origin"]
    assert origin["layers"] == {"redis_hit": "redis", "miss": "miss"}
    for case in (
        "floor",
        "floor_redis_py",
        "redis_hit",
        "redis_hit_limited",
        "provider_direct",
        "miss",
    ):
        assert set(origin[case]) == {"1", "32"}
        for row in origin[case].values():
            assert_load_row(row)

    for path in ("provider_direct", "origin", "forward_origin", "edge_origin"):
        stream = result["streaming"][path]
        assert stream["requests"] > 0 and stream["errors"] == 0
        assert 0 < stream["ttfb_p50_ms"] <= stream["ttfb_p90_ms"] <= stream["ttfb_p99_ms"]
        assert stream["ttfb_p50_ms"] <= stream["total_p50_ms"]
    assert result["streaming"]["origin"]["layers"] == ["miss"]
    assert result["streaming"]["edge_origin"]["layers"] == ["miss"]
    assert result["streaming"]["forward_origin"]["layers"] == ["miss"]

    kv = result["kv_writer"]
    assert kv["entries_created"] > 0
    assert kv["entries_replicated"] + kv["dropped"] == kv["entries_created"]
    # Batched: far fewer REST calls than entries.
    assert 0 < kv["rest_calls"] < kv["entries_created"]

    memory = result["memory"]
    assert 0 < memory["origin_idle_rss_mb"] <= memory["origin_load_rss_mb"]

    assert {t["name"].split(" (")[0] for t in result["targets"]} == {
        "edge KV hit median",
        "origin Redis hit throughput",
        "origin Redis hit with rate limits",
        "origin miss overhead",
        "origin Redis hit tail",
        "origin miss tail",
        "streaming TTFB added",
        "origin idle RSS",
    }
    assert all(isinstance(t["met"], bool) for t in result["targets"])
    if importlib.util.find_spec("matplotlib"):
        assert (out / "latest.png").read_bytes().startswith(b"\x89PNG")
    else:
        assert "matplotlib" in result["chart_skipped"]


@pytest.fixture
def echo_server() -> Iterator[EchoServer]:
    """Records every request body, answers 200 (or 418 for a body containing "teapot")."""
    bodies: list[bytes] = []

    async def echo(request: Request) -> Response:
        body = await request.body()
        bodies.append(body)
        return Response(b"{}", 418 if b"teapot" in body else 200)

    with ThreadedServer(Starlette(routes=[Route("/v1/x", echo, methods=["POST"])])) as server:
        yield server, bodies


@pytest.fixture(params=["wrk", "python"])
def tool(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each load-generator test runs with wrk (when installed) and with the fallback."""
    if request.param == "wrk" and wrk_path() is None:
        pytest.skip("wrk is not installed")
    if request.param == "python":
        monkeypatch.setenv("PRISM_BENCH_LOADGEN", "python")
    return str(request.param)


def test_load_generator_sends_a_new_body_per_request_when_asked(
    tool: str, echo_server: EchoServer
) -> None:
    server, bodies = echo_server
    spec = LoadSpec(
        url=server.url + "/v1/x",
        concurrency=2,
        duration=0.5 if tool == "python" else 1,
        body='{"q":"' + UNIQUE + '"}',
        headers={"content-type": "application/json"},
        nonce="n1",
    )
    result = run_load(spec)
    assert result.tool == ("wrk" if tool == "wrk" else FALLBACK_TOOL)
    assert result.requests > 0 and result.errors == 0 and result.non_2xx == 0
    assert len(set(bodies)) == len(bodies) >= result.requests
    assert all(body.startswith(b'{"q":"n1-') for body in bodies)


def test_load_generator_counts_non_2xx_apart_from_errors(
    tool: str, echo_server: EchoServer
) -> None:
    server, _ = echo_server
    spec = LoadSpec(url=server.url + "/v1/x", concurrency=1, duration=0.5, body="teapot")
    result = run_load(spec)
    assert result.requests > 0 and result.errors == 0
    assert result.non_2xx == result.requests


def test_lua_strings_escape_quotes_backslashes_and_non_ascii() -> None:
    assert lua_string('a"b\\c\n') == '"a\\034b\\092c\\010"'
    assert lua_string("é") == '"\\195\\169"'


def test_profile_summary_groups_own_time_by_package_and_drops_the_trunk() -> None:
    loop = "main (cli.py:1);run (uvicorn/main.py:5);Runner.run (asyncio/runners.py:118)"
    collapsed = "\n".join(
        [
            f"{loop};handle (origin/apis/chat.py:10) 4",
            "handle (origin/apis/chat.py:12) 2",  # a coroutine resumed by the C event loop
            "send (httpx/_client.py:3) 3",
            f"{loop} 1",
        ]
    )
    summary = summarize_collapsed(collapsed)
    assert summary["samples"] == 10
    assert [(r["frame"], r["share"]) for r in summary["by_area"]] == [
        ("origin", 0.6),
        ("httpx", 0.3),
        ("event loop (uvloop, C)", 0.1),
    ]
    assert summary["top_own"][0] == {
        "frame": "handle (origin/apis/chat.py)",
        "share": 0.6,
        "samples": 6,
    }
    # Start-up frames under the event loop say nothing about where the time goes.
    assert {r["frame"] for r in summary["top_total"]} == {
        "handle (origin/apis/chat.py)",
        "send (httpx/_client.py)",
    }
