"""The origin's Redis hit with the request log on (every sink) against off, alternated.

    python -m deploy.bench.request_log_ab [--rounds 4] [--seconds 6] [--concurrency 32] [--otlp]

Two `prism origin serve` processes on one Redis and one provider stand-in, the same hit
body: one with the request log off (``PRISM_REQUEST_LOG=off``), one with it on and every
sink it has here: the Redis window, the durable files (a temporary ``PRISM_LOG_DIR``)
and, with ``--otlp``, OpenTelemetry logs to a local OTLP/HTTP receiver that takes every
export (the endpoint is set for both origins then, so the traces it also turns on cost
both alike). Each round loads both, back to back, the order alternating, so load from
elsewhere on a shared machine hits both alike. Per run: requests a second, latency, and
the CPU per request of the origin process and of redis-server (from /proc/PID/stat,
user + system; with the files sink's thread included): on a busy machine the CPU figures
are the steadier measure.
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
import time
from pathlib import Path
from typing import Any

from deploy.local.asgi_thread import ThreadedServer
from deploy.local.ports import free_port
from deploy.local.provider import ProviderServer
from deploy.local.redis import RedisServer
from prism import parse_key_secrets

from .loadgen import LoadSpec, run_load
from .machine import cpu_seconds
from .workload import CHAT_PATH, chat_body, wait_for_hit

__all__ = ["main", "measure"]

_KEY_SECRET = "bench-key-secret-0123456789abcdef"
Scope = dict[str, Any]


async def _otlp_receiver(scope: Scope, receive: Any, send: Any) -> None:
    """Takes every OTLP/HTTP export (logs, traces, metrics) and answers 200."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def _serve_origin(env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "deploy.cli", "origin", "serve", "--port", str(port)]
    command += ["--admin-port", str(free_port()), "--workers", "1"]  # one admin port each
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(
    rounds: int, seconds: float, concurrency: int, otlp: bool, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory() as folder,
        RedisServer(workdir=Path(folder)) as redis_server,
    ):
        provider = ProviderServer().start()
        receiver = ThreadedServer(_otlp_receiver, lifespan="off").start() if otlp else None
        base = {
            **os.environ,
            "PRISM_KEY_SECRET": _KEY_SECRET,
            "PRISM_FORWARD_SECRET": "bench-forward-secret-0123456789ab",
            "REDIS_URL": redis_server.url,
            "OPENAI_BASE_URL": provider.url + "/v1",
            "OPENAI_API_KEY": "bench",
        }
        for name in ("PRISM_PROVIDERS_FILE", "PRISM_LOG_DIR", "PRISM_LOG_BUCKET"):
            base.pop(name, None)
        if receiver is not None:
            base["PRISM_OTEL_ENDPOINT"] = receiver.url
        every = {
            "off": {**base, "PRISM_REQUEST_LOG": "off"},
            "window": {**base, "PRISM_REQUEST_LOG": "on"},
            "on": {**base, "PRISM_REQUEST_LOG": "on", "PRISM_LOG_DIR": f"{folder}/log"},
        }
        cases = {case: every[case] for case in ("off", *extra, "on")}
        ports = {case: free_port() for case in cases}
        origins = {case: _serve_origin(env, ports[case]) for case, env in cases.items()}
        key = parse_key_secrets(_KEY_SECRET).mint("acme")
        headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
        body = chat_body("request-log-ab")
        runs: dict[str, list[dict[str, float]]] = {case: [] for case in cases}
        try:
            for case in cases:
                wait_for_hit(f"http://127.0.0.1:{ports[case]}", body, headers)
            for number in range(rounds):
                order = list(cases)
                for case in order if number % 2 == 0 else order[::-1]:
                    pid, redis_pid = origins[case].pid, redis_server.pid or 0
                    before, redis_before = cpu_seconds(pid), cpu_seconds(redis_pid)
                    spec = LoadSpec(
                        f"http://127.0.0.1:{ports[case]}{CHAT_PATH}",
                        concurrency,
                        seconds,
                        body=body,
                        headers=headers,
                        nonce=secrets.token_hex(4),
                    )
                    result = run_load(spec)
                    time.sleep(1.2)  # the batches of this run's records are written (and counted)
                    cpu = cpu_seconds(pid) - before
                    redis_cpu = cpu_seconds(redis_pid) - redis_before
                    requests = max(1, result.requests)
                    runs[case].append(
                        {
                            "rps": round(result.rps, 1),
                            "p50_ms": result.p50_ms,
                            "p99_ms": result.p99_ms,
                            "non_2xx": result.non_2xx,
                            "cpu_us_per_request": round(1e6 * cpu / requests, 1),
                            "redis_cpu_us_per_request": round(1e6 * redis_cpu / requests, 1),
                        }
                    )
        finally:
            for origin in origins.values():
                origin.terminate()
            for origin in origins.values():
                origin.wait(10)
            provider.stop()
            if receiver is not None:
                receiver.stop()

    def median(case: str, field: str) -> float:
        return statistics.median(run[field] for run in runs[case])

    return {
        "runs": runs,
        "median_rps": {case: median(case, "rps") for case in runs},
        "median_cpu_us_per_request": {case: median(case, "cpu_us_per_request") for case in runs},
        "median_redis_cpu_us_per_request": {
            case: median(case, "redis_cpu_us_per_request") for case in runs
        },
        # Each round's two runs are next to each other in time: their ratio is the least
        # touched by load from elsewhere, and the median of those ratios the steadiest.
        "throughput_kept_paired_median": round(
            statistics.median(
                on["rps"] / off["rps"] for on, off in zip(runs["on"], runs["off"], strict=True)
            ),
            3,
        ),
        "config": {"rounds": rounds, "seconds": seconds, "concurrency": concurrency, "otlp": otlp},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--otlp", action="store_true", help="OTLP logs too (traces on in both)")
    parser.add_argument(
        "--window", action="store_true", help="a third origin: the Redis window the only sink"
    )
    args = parser.parse_args()
    extra = ("window",) if args.window else ()
    result = measure(args.rounds, args.seconds, args.concurrency, args.otlp, extra)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
