"""``prism origin serve --workers 2`` against ``--workers 1``: Redis hits and misses a second.

Alternate runs on the same private Redis and the same local provider stand-in: each round
starts an origin of 1 worker, then one of 2, and loads each with wrk (``loadgen``) at the
same concurrency, first one stored question (Redis hits), then a new question per request
(misses, each a provider call). Each row also says where the CPU went during its load: the
origin's processes (and the answers per second of their CPU), Redis, the load generator,
and how busy the whole machine was (of every core). A shared machine moves these by tens
of per cent: a ratio means something only when the machine had CPU to spare
(``machine_busy`` well under 1), which each row shows.

    python -m deploy.bench.workers_ab --rounds 3 --duration 10 --concurrency 32
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import redis as redis_py

from deploy.local.ports import free_port
from deploy.local.processes import ChildProcess, process_tree
from deploy.local.provider import ProviderServer
from deploy.local.redis import RedisServer
from prism import parse_key_secrets

from .loadgen import UNIQUE, LoadSpec, run_load
from .machine import cpu_seconds

__all__ = ["main", "run"]

_SECRET = "bench-key-secret-0123456789abcdef"
_FORWARD = "bench-forward-secret-0123456789ab"
_FLOOR_KEY = "prism-bench:floor"
_TICK = os.sysconf("SC_CLK_TCK")


def _machine() -> tuple[float, float]:
    """(busy, all) CPU seconds of every core since boot."""
    ticks = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]
    return (sum(ticks) - idle) / _TICK, sum(ticks) / _TICK


@contextmanager
def _origin(workers: int, env: dict[str, str], logs: Path) -> Iterator[tuple[str, int]]:
    port, admin = free_port(), free_port()
    command = [sys.executable, "-m", "deploy.cli", "origin", "serve", "--port", str(port)]
    command += ["--admin-port", str(admin), "--workers", str(workers)]
    process = ChildProcess(f"origin-{workers}", command, logs / f"origin-{workers}.log", env)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{admin}/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or not process.alive():
                raise RuntimeError(f"the origin did not serve: see {process.log_path}")
            time.sleep(0.2)  # polling a child we do not control, with a deadline
        yield f"http://127.0.0.1:{port}", process.pid
    finally:
        process.stop(timeout=30)


def _load(spec: LoadSpec, pids: Sequence[int], redis_pid: int | None) -> dict[str, Any]:
    before = {pid: cpu_seconds(pid) for pid in pids}
    redis_before = cpu_seconds(redis_pid) if redis_pid else 0.0
    busy, total = _machine()
    result = run_load(spec)
    busy_after, total_after = _machine()
    origin_cpu = sum(cpu_seconds(pid) - before[pid] for pid in pids)
    return {
        "rps": round(result.rps),
        # Answers per second of the origin's CPU: what a row gets for the CPU it was given.
        "per_origin_cpu_s": round(result.requests / origin_cpu) if origin_cpu else None,
        "p99_ms": round(result.p99_ms, 1),
        "failed": result.errors + result.non_2xx,
        "origin_cpu_s": round(origin_cpu, 2),
        "redis_cpu_s": round((cpu_seconds(redis_pid) if redis_pid else 0.0) - redis_before, 2),
        "loadgen_cpu_s": round(result.loadgen_cpu_s, 2),
        "seconds": round(result.duration_s, 2),
        "machine_busy": round((busy_after - busy) / max(total_after - total, 1e-9), 2),
        "tool": result.tool,
    }


@contextmanager
def _floor(workers: int, redis_url: str, key: str, logs: Path) -> Iterator[tuple[str, int]]:
    """The one-GET floor app on ``workers`` processes: what that many processes can serve
    here at all, with the load generator, Redis and the origin's server on the same cores."""
    port = free_port()
    command = [sys.executable, "-m", "deploy.bench.floor_app", "--port", str(port)]
    command += ["--redis-url", redis_url, "--key", key, "--workers", str(workers)]
    process = ChildProcess(f"floor-{workers}", command, logs / f"floor-{workers}.log")
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or not process.alive():
                raise RuntimeError(f"the floor app did not serve: see {process.log_path}")
            time.sleep(0.1)  # polling a child we do not control, with a deadline
        yield url, process.pid
    finally:
        process.stop(timeout=30)


def run(rounds: int, duration: float, concurrency: int) -> dict[str, Any]:
    """Every row (round, workers, hit and miss figures) and the ratios of the medians."""
    key = parse_key_secrets(_SECRET).mint("bench")
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    hit = json.dumps({"model": "demo", "messages": [{"role": "user", "content": "the hit"}]})
    miss = json.dumps({"model": "demo", "messages": [{"role": "user", "content": UNIQUE}]})
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as work, RedisServer(workdir=Path(work)) as redis:
        redis_py.Redis.from_url(redis.url).set(_FLOOR_KEY, b"x" * 600)  # an answer's size
        provider = ProviderServer().start()
        env = {
            **os.environ,
            "PRISM_KEY_SECRET": _SECRET,
            "PRISM_FORWARD_SECRET": _FORWARD,
            "REDIS_URL": redis.url,
            "OPENAI_BASE_URL": provider.url + "/v1",
            "OPENAI_API_KEY": "bench",
        }
        env.pop("PRISM_PROVIDERS_FILE", None)
        try:
            for index in range(rounds):
                for workers in (1, 2):
                    with _origin(workers, env, Path(work)) as (url, pid):
                        chat = url + "/v1/chat/completions"
                        for _ in range(2):  # stored by the first; the second must hit
                            answer = httpx.post(chat, content=hit, headers=headers, timeout=30)
                            time.sleep(0.5)  # the entry is written after the answer
                        if answer.headers.get("x-prism-edge-cache-layer") != "redis":
                            raise RuntimeError("the hit was not stored in Redis")
                        pids = process_tree(pid)
                        row: dict[str, Any] = {"round": index, "workers": workers}
                        for kind, body in (("hit", hit), ("miss", miss)):
                            spec = LoadSpec(
                                chat, concurrency, duration, body=body, headers=headers,
                                nonce=secrets.token_hex(4),
                            )  # fmt: skip
                            row[kind] = _load(spec, pids, redis.pid)
                    with _floor(workers, redis.url, _FLOOR_KEY, Path(work)) as (url, pid):
                        spec = LoadSpec(url, concurrency, duration, body=hit, headers=headers)
                        row["floor"] = _load(spec, process_tree(pid), redis.pid)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
        finally:
            provider.stop()
    ratios = {}
    for kind in ("hit", "miss", "floor"):
        one = statistics.median(r[kind]["rps"] for r in rows if r["workers"] == 1)
        two = statistics.median(r[kind]["rps"] for r in rows if r["workers"] == 2)
        ratios[kind] = round(two / one, 2) if one else None
    # What the origin's hit ratio is of what two processes of nothing gain here.
    if ratios["hit"] and ratios["floor"]:
        ratios["hit_of_floor"] = round(ratios["hit"] / ratios["floor"], 2)
    return {"concurrency": concurrency, "duration": duration, "rows": rows, "ratio": ratios}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m deploy.bench.workers_ab")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args(argv)
    report = run(args.rounds, args.duration, args.concurrency)
    print(json.dumps({"ratio": report["ratio"], "concurrency": args.concurrency}))


if __name__ == "__main__":
    main()
