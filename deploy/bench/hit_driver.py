"""Redis hits through the origin's ASGI app in-process: a load-independent measure of a hit.

Wall-clock throughput on a shared machine moves by ±10 % from run to run; instructions
do not. This drives ``count`` hits (``concurrency`` at a time) through ``create_app``'s
app with no sockets but Redis's, so ``valgrind --tool=callgrind`` counts what one hit
costs: run it twice with different counts and divide the difference of the totals by
the difference of the counts (start-up cancels out)::

    valgrind --tool=callgrind python -m deploy.bench.hit_driver redis://127.0.0.1:6379/0 1000
    valgrind --tool=callgrind python -m deploy.bench.hit_driver redis://127.0.0.1:6379/0 3000

It plants its own entry (project ``bench``) and checks every answer is a Redis hit. With
``--http`` the hits go through the HTTP server too (uvicorn with the origin's protocol
and options, on a loopback socket, ``concurrency`` keep-alive connections from a minimal
client in the same process): what uvicorn spends on a response's head, for instance,
counts as well. ``--floor`` serves the one-GET floor (``deploy.bench.floor_app``) the same
way instead, GETting the same planted entry, with the same client and request: the ratio of
the two counts is the instruction-level hit/floor the benchmark's throughput rows measure
on the wall clock (``--floor`` implies ``--http``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

import redis
import uvicorn
import uvloop

from deploy.policy_store import PolicyStore
from origin import Settings, create_app
from origin.http.server import freeze_heap, server_options
from prism import (
    RateLimits,
    encode_envelope,
    entry_key,
    fingerprint,
    parse_chat_request,
    parse_key_secrets,
)
from prism import headers as h
from prism.routes import CHAT_PATH

from .floor_app import FloorApp
from .http1 import Connection, build_request
from .workload import MODEL, chat_body, chat_scope, serving

__all__ = ["drive_hits", "main"]

_KEY_SECRET = "bench-hit-driver-key-secret-0123456789"
_PROJECT = "bench"
_LIMITS = RateLimits.from_dict({"project": {"rpm": 1_000_000}, "key": {"rpm": 1_000_000}})
_WARM = 100  # hits before counting: the script is loaded and the memos are filled
_ANSWER = (
    b'{"id":"bench","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"' + b"word " * 150 + b'"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":400,"completion_tokens":150,"total_tokens":550}}'
)


def drive_hits(
    redis_url: str,
    count: int,
    concurrency: int = 32,
    rate_limits: bool = False,
    http: bool = False,
    floor: bool = False,
) -> float:
    """Send ``count`` hits after a warm-up; the wall time per hit in seconds (the
    instruction count is what to trust). With ``rate_limits`` the project has request
    limits per project and per key (high enough never to refuse), so every hit is checked."""
    env = {
        "PRISM_KEY_SECRET": _KEY_SECRET,
        "PRISM_FORWARD_SECRET": _KEY_SECRET,
        "REDIS_URL": redis_url,
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",  # never called: every request hits
        "OPENAI_API_KEY": "unused",
        # The request log on or off as the caller's environment says (on by default), so
        # its cost is measured with the rest of a hit's.
        "PRISM_REQUEST_LOG": os.environ.get("PRISM_REQUEST_LOG", ""),
        # The durable files too when the caller names a directory for them.
        "PRISM_LOG_DIR": os.environ.get("PRISM_LOG_DIR", ""),
    }
    # Under valgrind a turn of the loop is 50 x slower: no Redis timeout may fire.
    settings = dataclasses.replace(Settings.from_env(env), redis_timeout=60.0)
    body = chat_body("planted-hit").encode()
    fp = fingerprint(_PROJECT, CHAT_PATH, parse_chat_request(body))
    client = redis.Redis.from_url(redis_url)
    try:
        client.set(entry_key(fp), encode_envelope(_ANSWER, model=MODEL, ttl=3600), ex=3600)
    finally:
        client.close()
    store = PolicyStore.from_url(redis_url)
    if rate_limits:
        store.set(_PROJECT, rate_limits=_LIMITS, updated_by="hit-driver")
    else:
        store.clear(_PROJECT, actor="hit-driver")
    key = parse_key_secrets(_KEY_SECRET).mint(_PROJECT)
    app = create_app(settings)
    scope = chat_scope(f"Bearer {key}".encode(), len(body))
    message = {"type": "http.request", "body": body, "more_body": False}
    layer_header = h.CACHE_LAYER.encode()

    async def receive() -> dict[str, Any]:
        return message

    async def one() -> None:
        head: dict[str, Any] = {}

        async def send(event: MutableMapping[str, Any]) -> None:
            if event["type"] == "http.response.start":
                head.update(event)

        await app(dict(scope), receive, send)
        layer = dict(head.get("headers", ())).get(layer_header)
        if head.get("status") != 200 or layer != b"redis":
            raise RuntimeError(f"not a Redis hit: {head.get('status')} {layer!r}")

    async def run() -> float:
        async with serving(app):
            return await _timed(count, concurrency, [one] * concurrency)

    if not (http or floor):
        return uvloop.run(run())
    request = build_request(
        "POST", "127.0.0.1", 0, CHAT_PATH, {"authorization": f"Bearer {key}"}, body
    )
    if floor:
        floor_app = FloorApp(redis_url, entry_key(fp))
        return uvloop.run(_over_http(floor_app, settings, count, concurrency, request, None))
    return uvloop.run(_over_http(app, settings, count, concurrency, request, "redis"))


async def _timed(
    count: int, concurrency: int, clients: list[Callable[[], Awaitable[None]]]
) -> float:
    """Warm up, then ``count`` hits ``concurrency`` at a time (client ``i`` sends the
    ``i``th of each batch); the wall time per hit."""
    for _ in range(_WARM):
        await clients[0]()
    begun = time.perf_counter()
    done = 0
    while done < count:
        batch = min(concurrency, count - done)
        await asyncio.gather(*(clients[i]() for i in range(batch)))
        done += batch
    return (time.perf_counter() - begun) / max(count, 1)


async def _over_http(
    app: Any, settings: Settings, count: int, concurrency: int, request: bytes, layer: str | None
) -> float:
    """``count`` requests through uvicorn; each answered 200 (and from ``layer``, if given)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", log_config=None, lifespan="on", access_log=False,
        loop="none", **server_options(settings),
    )  # fmt: skip
    server = uvicorn.Server(config)
    serving_task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        if serving_task.done():
            serving_task.result()  # start-up failed: raise why
        await asyncio.sleep(0.01)
    freeze_heap()  # as ``prism origin serve`` does once started
    connections = [await Connection.open("127.0.0.1", port) for _ in range(concurrency)]

    def client(connection: Connection) -> Callable[[], Awaitable[None]]:
        async def one() -> None:
            reply = await connection.send(request)
            if reply.status != 200 or (layer and reply.headers.get(h.CACHE_LAYER) != layer):
                raise RuntimeError(f"not a {layer} answer: {reply.status} {reply.headers}")

        return one

    try:
        return await _timed(count, concurrency, [client(c) for c in connections])
    finally:
        for connection in connections:
            await connection.close()
        server.should_exit = True
        await serving_task


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("redis_url")
    parser.add_argument("count", type=int)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--rate-limits", action="store_true", help="Check project and key request limits."
    )
    parser.add_argument(
        "--http", action="store_true", help="Through uvicorn on a loopback socket as well."
    )
    parser.add_argument(
        "--floor", action="store_true", help="The one-GET floor app instead, through uvicorn."
    )
    args = parser.parse_args(argv)
    per_hit = drive_hits(
        args.redis_url, args.count, args.concurrency, args.rate_limits, args.http, args.floor
    )
    what = "floor answers" if args.floor else "Redis hits"
    print(f"{args.count} {what}, {args.concurrency} at a time: {per_hit * 1e6:.1f} µs each")


if __name__ == "__main__":
    main()
