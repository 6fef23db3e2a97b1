"""The origin's Redis-hit path with a rate limit set against without one, alternated.

    python -m deploy.bench.rate_limit_ab [--rounds 4] [--seconds 8] [--concurrency 32]

One `prism origin serve` process on its own Redis; the same hit body throughout. Each
round measures both cases back to back (the order alternates), so load from elsewhere
on a shared machine hits both alike. Per run: requests a second, and the CPU per request
of the origin process and of redis-server from /proc/PID/stat (user + system): on a
busy machine the CPU figures are the steadier measure. The limit is set high
enough never to refuse (project and key rpm 1,000,000): what is measured is the
check itself, both GCRA limits of it, riding in the lookup script.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from deploy.local.ports import free_port
from deploy.local.provider import ProviderServer
from deploy.local.redis import RedisServer
from deploy.policy_store import PolicyStore
from prism import RateLimits, parse_key_secrets

from .loadgen import LoadSpec, run_load
from .machine import cpu_seconds
from .workload import CHAT_PATH, chat_body, wait_for_hit

__all__ = ["main", "measure"]

_LIMITS = RateLimits.from_dict({"project": {"rpm": 1_000_000}, "key": {"rpm": 1_000_000}})


def _serve_origin(redis_url: str, provider_url: str, port: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PRISM_KEY_SECRET": "bench-key-secret-0123456789abcdef",
        "PRISM_FORWARD_SECRET": "bench-forward-secret-0123456789ab",
        "REDIS_URL": redis_url,
        "OPENAI_BASE_URL": provider_url + "/v1",
        "OPENAI_API_KEY": "bench",
    }
    env.pop("PRISM_PROVIDERS_FILE", None)
    command = [sys.executable, "-m", "deploy.cli", "origin", "serve", "--port", str(port)]
    command += ["--workers", "1"]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(rounds: int, seconds: float, concurrency: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder, RedisServer(workdir=Path(folder)) as redis_server:
        provider = ProviderServer().start()
        port = free_port()
        origin = _serve_origin(redis_server.url, provider.url, port)
        url = f"http://127.0.0.1:{port}"
        store = PolicyStore.from_url(redis_server.url)
        try:
            key = parse_key_secrets("bench-key-secret-0123456789abcdef").mint("acme")
            headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
            body = chat_body("rate-limit-ab")
            wait_for_hit(url, body, headers)
            runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
            for number in range(rounds):
                for case in ("off", "on") if number % 2 == 0 else ("on", "off"):
                    if case == "on":
                        store.set("acme", rate_limits=_LIMITS, updated_by="bench")
                    else:
                        store.clear("acme", actor="bench")
                    check = httpx.post(url + CHAT_PATH, content=body, headers=headers)
                    assert check.status_code == 200
                    assert ("x-ratelimit-limit-requests" in check.headers) == (case == "on")
                    redis_pid = redis_server.pid or 0
                    before, redis_before = cpu_seconds(origin.pid), cpu_seconds(redis_pid)
                    spec = LoadSpec(url + CHAT_PATH, concurrency, seconds, body=body,
                                    headers=headers, nonce=secrets.token_hex(4))  # fmt: skip
                    result = run_load(spec)
                    cpu = cpu_seconds(origin.pid) - before
                    redis_cpu = cpu_seconds(redis_pid) - redis_before
                    runs[case].append(
                        {
                            "rps": round(result.rps, 1),
                            "p50_ms": result.p50_ms,
                            "p99_ms": result.p99_ms,
                            "non_2xx": result.non_2xx,
                            "cpu_us_per_request": round(1e6 * cpu / max(1, result.requests), 1),
                            "redis_cpu_us_per_request": round(
                                1e6 * redis_cpu / max(1, result.requests), 1
                            ),
                        }
                    )
        finally:
            store.close()
            origin.terminate()
            origin.wait(10)
            provider.stop()

    def median(case: str, field: str) -> float:
        return statistics.median(run[field] for run in runs[case])

    return {
        "runs": runs,
        "median_rps": {case: median(case, "rps") for case in runs},
        "median_cpu_us_per_request": {case: median(case, "cpu_us_per_request") for case in runs},
        "median_redis_cpu_us_per_request": {
            case: median(case, "redis_cpu_us_per_request") for case in runs
        },
        "throughput_kept": round(median("on", "rps") / median("off", "rps"), 3),
        # Each round's two runs are next to each other in time: their ratio is the least
        # touched by load from elsewhere, and the median of those ratios the steadiest.
        "throughput_kept_paired_median": round(
            statistics.median(
                on["rps"] / off["rps"] for on, off in zip(runs["on"], runs["off"], strict=True)
            ),
            3,
        ),
        "config": {"rounds": rounds, "seconds": seconds, "concurrency": concurrency},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    print(json.dumps(measure(args.rounds, args.seconds, args.concurrency), indent=2))


if __name__ == "__main__":
    main()
