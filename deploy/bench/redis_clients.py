"""Redis clients side by side on the origin's own Redis work, from one asyncio process.

Each client does what ``RedisCache`` does for a request: the lookup (EVALSHA of the
lookup script, 2 keys + 1 argument; the entry is a 1 KiB value) and, separately, a plain
GET of that entry. 32 tasks share one client; the clients take turns (pipe, glide,
coredis, redis-py, pipe, ...) so that a noisy neighbour hits them all alike. Per run:
requests per second (wall clock) and CPU microseconds per request (the whole process,
client threads included).

valkey-glide and coredis are optional (``pip install valkey-glide coredis``); a client
that does not import is skipped and said so.

Run it: ``python -m deploy.bench.redis_clients [--redis-url URL] [--rounds 5]``
(default: a private redis-server, so no one else's data is touched).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import uvloop

from deploy.local.redis import RedisServer
from origin.connection.redis_client import PreparedCommand, RedisPyClient
from origin.connection.redis_pipe import RedisPipe
from origin.store.redis_cache import LOOKUP_SCRIPT
from prism import REVOKED_KEY

__all__ = ["main"]

ENTRY_KEY = "prism:v1:bench-entry"
KEY_ID = "benchkey00000001"
NO_POLICY = ""  # the origin's own lookup, for a project with no policy
VALUE = b"x" * 1024

Call = Callable[[], Awaitable[Any]]


@dataclass
class Opened:
    lookup: Call
    get: Call
    close: Callable[[], Awaitable[None]]


async def open_pipe(host: str, port: int) -> Opened:
    pipe = RedisPipe(f"redis://{host}:{port}/0")
    sha = await pipe.execute("SCRIPT", "LOAD", LOOKUP_SCRIPT)
    prepared = PreparedCommand("EVALSHA", sha, 3, REVOKED_KEY)
    return Opened(
        lambda: pipe.run(prepared, ENTRY_KEY, NO_POLICY, KEY_ID),
        lambda: pipe.execute("GET", ENTRY_KEY),
        pipe.close,
    )


async def open_redis_py(host: str, port: int) -> Opened:
    client = RedisPyClient(f"redis://{host}:{port}/0")
    sha = await client.execute("SCRIPT", "LOAD", LOOKUP_SCRIPT)
    prepared = PreparedCommand("EVALSHA", sha, 3, REVOKED_KEY)
    return Opened(
        lambda: client.run(prepared, ENTRY_KEY, NO_POLICY, KEY_ID),
        lambda: client.execute("GET", ENTRY_KEY),
        client.close,
    )


async def open_glide(host: str, port: int) -> Opened:
    glide = importlib.import_module("glide")  # optional: not a dependency of Prism
    client = await glide.GlideClient.create(
        glide.GlideClientConfiguration([glide.NodeAddress(host, port)], request_timeout=1000)
    )
    script = glide.Script(LOOKUP_SCRIPT)
    keys, args = [REVOKED_KEY, ENTRY_KEY, NO_POLICY], [KEY_ID]
    return Opened(
        lambda: client.invoke_script(script, keys=keys, args=args),
        lambda: client.get(ENTRY_KEY),
        client.close,
    )


async def open_coredis(host: str, port: int) -> Opened:
    coredis = importlib.import_module("coredis")  # optional: not a dependency of Prism
    stack = AsyncExitStack()
    client = await stack.enter_async_context(coredis.Redis(host, port, stream_timeout=1.0))
    sha = await client.script_load(LOOKUP_SCRIPT)
    keys = [REVOKED_KEY, ENTRY_KEY, NO_POLICY]
    args = [KEY_ID]
    return Opened(
        lambda: client.evalsha(sha, keys=keys, args=args),
        lambda: client.get(ENTRY_KEY),
        stack.aclose,
    )


CLIENTS: dict[str, Callable[[str, int], Awaitable[Opened]]] = {
    "pipe": open_pipe,
    "glide": open_glide,
    "coredis": open_coredis,
    "redis-py": open_redis_py,
}


async def drive(call: Call, requests: int, concurrency: int) -> tuple[float, float]:
    """(requests per second, CPU microseconds per request) for ``requests`` calls."""
    per_task = requests // concurrency

    async def worker() -> None:
        for _ in range(per_task):
            await call()

    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    done = per_task * concurrency
    return done / wall, cpu / done * 1e6


async def bench(
    host: str, port: int, clients: Sequence[str], rounds: int, requests: int, concurrency: int
) -> dict[tuple[str, str], list[tuple[float, float]]]:
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for round_number in range(rounds):
        for name in clients:
            opened = await CLIENTS[name](host, port)
            try:
                expected = [0, VALUE, None]  # not revoked, the entry, no policy
                got = await opened.lookup()
                if list(got) != expected or await opened.get() != VALUE:
                    raise AssertionError(f"{name} answered {got!r}")
                await drive(opened.lookup, min(2_000, requests), concurrency)  # warm up
                for workload, call in (("lookup", opened.lookup), ("get", opened.get)):
                    rate, cpu = await drive(call, requests, concurrency)
                    results.setdefault((name, workload), []).append((rate, cpu))
                    print(
                        f"round {round_number + 1} {name:9} {workload:6} "
                        f"{rate:9,.0f} req/s  {cpu:6.1f} µs CPU/req",
                        flush=True,
                    )
            finally:
                await opened.close()
    return results


def report(results: dict[tuple[str, str], list[tuple[float, float]]]) -> None:
    baseline = {w: statistics.median(r for r, _ in results[("pipe", w)]) for w in ("lookup", "get")}
    print("\nclient    workload  median req/s  (min-max)           vs pipe  median CPU µs/req")
    for (name, workload), runs in results.items():
        rates = [r for r, _ in runs]
        median = statistics.median(rates)
        print(
            f"{name:9} {workload:8} {median:12,.0f}  ({min(rates):,.0f}-{max(rates):,.0f})"
            f"  {median / baseline[workload]:7.0%}  {statistics.median(c for _, c in runs):8.1f}"
        )


def available(name: str) -> bool:
    if name not in ("glide", "coredis"):
        return True
    try:
        importlib.import_module(name)
    except ImportError:
        print(f"{name}: not installed, skipped")
        return False
    return True


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m deploy.bench.redis_clients")
    parser.add_argument("--redis-url", help="host:port of a Redis to use (default: a private one)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--clients", default="pipe,glide,coredis,redis-py")
    args = parser.parse_args(argv)
    clients = [c for c in args.clients.split(",") if available(c)]
    server = None
    if args.redis_url:
        host, port = args.redis_url.removeprefix("redis://").split("/")[0].split(":")
    else:
        server = RedisServer().start()
        host, port = server.host, str(server.port)
    try:
        import redis

        setup = redis.Redis(host=host, port=int(port))
        setup.set(ENTRY_KEY, VALUE)
        setup.close()
        results = uvloop.run(
            bench(host, int(port), clients, args.rounds, args.requests, args.concurrency)
        )
        report(results)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
