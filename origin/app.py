"""``create_app(settings)``: the only place the origin is wired together."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from prism import PrismError
from prism import headers as h

from .asgi import Receive, Scope, Send
from .auth import authenticate
from .chat import PATH as CHAT_PATH
from .chat import ChatCompletions
from .gateway import Gateway
from .providers._http import ConnectorFactory
from .redis_pipe import RedisPipe
from .responses import error_response, exception_handlers
from .settings import Settings

__all__ = ["OriginApp", "create_app"]


def _json(data: object, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status, media_type="application/json")


class OriginApp:
    """The chat route as plain ASGI, everything else (and the lifespan) through Starlette."""

    def __init__(self, framework: Starlette, chat: ChatCompletions) -> None:
        self.framework = framework
        self.state = framework.state
        self._chat = chat

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == CHAT_PATH:
            await self._chat(scope, receive, send)
        else:
            await self.framework(scope, receive, send)


def create_app(
    settings: Settings,
    *,
    redis: RedisPipe | None = None,
    connectors: Mapping[str, ConnectorFactory] | None = None,
    kv_transport: httpx.AsyncBaseTransport | None = None,
) -> OriginApp:
    """The origin ASGI app. ``connectors`` swap a provider's connection pool (by name)."""
    gateway = Gateway(settings, redis=redis, connectors=connectors, kv_transport=kv_transport)
    chat = ChatCompletions(gateway)
    started = time.time()

    async def models(request: Request) -> Response:
        try:
            authenticate(request.headers, settings.key_ring, settings.forward_secret)
        except PrismError as error:
            gateway.metrics.requests.labels("models", str(error.status), "bypass").inc()
            return error_response(error, request.headers.get(h.REQUEST_ID))
        gateway.metrics.requests.labels("models", "200", "bypass").inc()
        data = [
            {"id": name, "object": "model", "created": int(started), "owned_by": "prism"}
            for name in settings.providers.public_models()
        ]
        return _json({"object": "list", "data": data})

    async def healthz(request: Request) -> Response:
        redis_ok = await gateway.cache.ping()
        writer = gateway.kv_writer
        body = {
            "status": "ok" if redis_ok else "degraded",
            "version": os.environ.get("PRISM_RELEASE", "dev"),  # set per release by the deploy
            "redis": {"ok": redis_ok},
            "providers": {
                name: {
                    "kind": p.spec.kind,
                    "base_url": p.spec.base_url,
                    **gateway.router.health[name].snapshot(),
                }
                for name, p in gateway.providers.items()
            },
            "kv_writer": {
                "enabled": writer is not None,
                "queued": writer.queued if writer is not None else 0,
            },
            "background_writes": gateway.background_tasks,
            "uptime_seconds": round(time.time() - started, 1),
        }
        return _json(body)

    async def metrics(request: Request) -> Response:
        return Response(gateway.metrics.render(), media_type="text/plain; version=0.0.4")

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.close()

    framework = Starlette(
        routes=[
            Route("/v1/models", models, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ],
        exception_handlers=exception_handlers,
        lifespan=lifespan,
    )
    framework.state.gateway = gateway
    return OriginApp(framework, chat)
