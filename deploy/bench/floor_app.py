"""The floor for a Redis hit: an ASGI app that does one Redis GET and returns the bytes.

Same server settings as the origin (uvicorn, uvloop, httptools, no access log,
no server header) and the same Redis client (the origin's auto-pipelined
``RedisPipe``), but nothing else: no routing framework, no auth, no parsing, no
envelope. The origin's Redis-hit throughput is judged against this, so the
ratio measures what Prism's own work costs, not which Redis client is faster.
``--client redis-py`` runs the same app on redis-py's pooled asyncio client, for
context: what a minimal app on the usual client achieves.

Run it: ``python -m deploy.bench.floor_app --port 9200 --redis-url redis://... --key K``;
``--workers N`` serves the port from N processes, as ``prism origin serve --workers N`` does,
so a multi-process origin is judged against what N processes of nothing can do here.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.asyncio import Redis
from starlette.types import Receive, Scope, Send

from origin.connection.redis_pipe import RedisPipe

__all__ = ["FloorApp", "from_environment", "main"]

_HEADERS = [(b"content-type", b"application/json")]
# How ``--workers N`` hands its arguments to each worker's app factory.
_URL_ENV, _KEY_ENV, _CLIENT_ENV = "PRISM_FLOOR_REDIS_URL", "PRISM_FLOOR_KEY", "PRISM_FLOOR_CLIENT"


class FloorApp:
    """Answers every HTTP request with the value of one Redis key (404 when missing)."""

    def __init__(self, redis_url: str, key: str, client: str = "pipe") -> None:
        self._redis_url = redis_url
        self._key = key
        self._client = client
        self._get: Callable[[], Awaitable[Any]] | None = None
        self._close: Callable[[], Awaitable[None]] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        # Read the body like any real endpoint must, so the comparison is fair.
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        assert self._get is not None
        value = await self._get()
        status = 200 if value is not None else 404
        await send({"type": "http.response.start", "status": status, "headers": _HEADERS})
        await send({"type": "http.response.body", "body": value or b""})

    def _connect(self) -> None:
        key = self._key
        if self._client == "redis-py":
            pooled = Redis.from_url(self._redis_url, max_connections=512)
            self._get, self._close = (lambda: pooled.get(key)), pooled.aclose
        else:
            pipe = RedisPipe(self._redis_url)
            self._get, self._close = (lambda: pipe.execute("GET", key)), pipe.close

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._connect()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._close is not None:
                    await self._close()
                await send({"type": "lifespan.shutdown.complete"})
                return


def from_environment() -> FloorApp:
    """The app of one worker of ``--workers N`` (uvicorn imports it in each process)."""
    return FloorApp(os.environ[_URL_ENV], os.environ[_KEY_ENV], os.environ[_CLIENT_ENV])


def main(argv: Sequence[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m deploy.bench.floor_app")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--client", choices=("pipe", "redis-py"), default="pipe")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    from origin.http.server import DeadlineProtocol

    app: Any = FloorApp(args.redis_url, args.key, args.client)
    if args.workers > 1:  # uvicorn's own supervisor: each worker builds its app
        os.environ.update({_URL_ENV: args.redis_url, _KEY_ENV: args.key, _CLIENT_ENV: args.client})
        app = "deploy.bench.floor_app:from_environment"
    # The server `prism origin serve` runs (its HTTP protocol included), minus the app.
    uvicorn.run(
        app,
        factory=args.workers > 1,
        workers=args.workers,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http=DeadlineProtocol,
        server_header=False,
        proxy_headers=False,
    )


if __name__ == "__main__":
    main()
