"""``create_app(settings)``: the only place the origin is wired together.

Two route tables. The API (``/v1/chat/completions``, ``/v1/embeddings``, ``/v1/messages``,
``/v1/responses``, ``/v1/models``, and a bare ``/healthz`` for load balancers) is served
on the public listener. The admin routes (``/healthz`` with every detail, ``/metrics``
with every tenant's counters) are served only on the admin listener, bound to loopback by
default (``origin.http.server``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping

import httpx
import orjson

from prism import AuthenticationError, NotFoundError, UpstreamUnavailableError
from prism import headers as h
from prism.routes import (
    CHAT_PATH,
    EMBEDDINGS_PATH,
    MESSAGES_PATH,
    MODELS_PATH,
    REQUEST_LOG_PATH,
    RESPONSES_PATH,
)

from .apis.chat import CHAT
from .apis.edge_records import EdgeRecords
from .apis.embeddings import EMBEDDINGS
from .apis.messages import MESSAGES
from .apis.pipeline import ApiRoute
from .apis.responses import RESPONSES, stored_owner_key
from .auth import authenticate
from .connection.redis_client import RedisClient, RedisClientError
from .dashboard import Dashboard, History, dashboard_off_routes
from .gateway import Gateway
from .governance.project_policies import ProjectPolicies
from .http.asgi import Route, Routes
from .http.loop_watch import LoopWatch
from .http.request import Request
from .http.responses import Reply, json_reply
from .providers.openai import OpenAICompatibleProvider
from .providers.upstream_http import ConnectorFactory
from .requestlog.window_reader import WindowReader
from .settings import Settings

__all__ = ["OriginApp", "create_app"]

_BYPASS = {h.CACHE_LAYER: "bypass"}


class OriginApp(Routes):
    """The API's route table, with the admin table for connections to the admin listener
    (``origin.http.server.listen`` binds both) and the gateway it serves."""

    def __init__(
        self,
        gateway: Gateway,
        routes: Iterable[Route],
        admin: Routes,
        dashboard: Dashboard | None = None,
        *,
        admin_port: int | None = None,
        loop_watch: LoopWatch | None = None,
    ) -> None:
        super().__init__(
            routes,
            metrics=gateway.metrics,
            on_startup=self._start,
            on_shutdown=self._close,
            admin=admin,
            admin_port=admin_port,
            telemetry=gateway.telemetry,
            recorder=gateway.request_log,
            loop_watch=loop_watch,
        )
        self.gateway = gateway
        self.dashboard = dashboard  # None: no PRISM_ADMIN_KEY, nothing sampled

    async def _start(self) -> None:
        await self.gateway.start()
        if self.dashboard is not None:
            self.dashboard.history.start()

    async def _close(self) -> None:
        if self.dashboard is not None:
            await self.dashboard.close()
        await self.gateway.close()


def create_app(
    settings: Settings,
    *,
    redis: RedisClient | None = None,
    connectors: Mapping[str, ConnectorFactory] | None = None,
    kv_transport: httpx.AsyncBaseTransport | None = None,
    admin_port: int | None = None,
    on_loop_tick: Callable[[], None] | None = None,
) -> OriginApp:
    """The origin ASGI app. ``connectors`` swap a provider's connection pool (by name);
    ``admin_port``: the admin listener's (``origin.http.server.listen``), None to serve no
    admin routes; ``on_loop_tick``: called from the event loop's every tick (systemd's
    watchdog, ``origin.http.watchdog``)."""
    gateway = Gateway(settings, redis=redis, connectors=connectors, kv_transport=kv_transport)
    started, catalog = gateway.started, gateway.catalog
    policies = ProjectPolicies()

    async def models(request: Request) -> Reply:
        caller = authenticate(
            request.headers,
            settings.key_ring,
            settings.forward_secret,
            "GET",
            MODELS_PATH,
            gateway.metrics,
        )
        lookup = await gateway.cache.lookup(caller.key_id, None, caller.project)
        if lookup.revoked:
            raise AuthenticationError("This API key has been revoked.", code="key_revoked")
        body = catalog.body(policies.resolve(caller.project, lookup))
        return Reply(200, {"content-type": "application/json", **_BYPASS}, body)

    async def stored_response(request: Request) -> Reply:
        # GET/DELETE /v1/responses/{id} (and what is under it): a response a provider of the
        # Responses API was asked to keep (``store: true``) is that provider's to read or
        # delete, for the project that asked only; Prism itself keeps none (a 404).
        caller = authenticate(
            request.headers,
            settings.key_ring,
            settings.forward_secret,
            request.method,
            request.path,
            gateway.metrics,
        )
        lookup = await gateway.cache.lookup(caller.key_id, None, caller.project)
        if lookup.revoked:
            raise AuthenticationError("This API key has been revoked.", code="key_revoked")
        rest = request.path.removeprefix(RESPONSES_PATH + "/")
        name = rest.split("/", 1)[0]
        provider = await _stored_with(name, caller.project)
        if provider is None:
            raise NotFoundError(
                f"No response with id '{name[:100]}' was kept for this project: Prism stores "
                "no responses itself, and only those asked for with store: true reach the "
                "provider that keeps them.",
                code="response_not_found",
            )
        body = await provider.stored_response(request.method, rest)
        if request.method == "DELETE" and rest == name:
            gateway.spawn(_forget_stored(name))
        return Reply(200, {"content-type": "application/json", **_BYPASS}, body)

    async def _forget_stored(name: str) -> None:
        with contextlib.suppress(RedisClientError):  # else it lapses on its own
            await gateway.redis.execute("DEL", stored_owner_key(name))

    async def _stored_with(name: str, project: str) -> OpenAICompatibleProvider | None:
        """The provider keeping response ``name`` for ``project`` (None: none known)."""
        if not name or len(name) > 200:
            return None
        try:
            owner = await gateway.redis.execute("GET", stored_owner_key(name))
        except RedisClientError:
            raise UpstreamUnavailableError(
                "Where that response is kept cannot be read now; try again shortly.",
                code="redis_unavailable",
            ) from None
        if not isinstance(owner, bytes):
            return None
        kept_for, provider_name = orjson.loads(owner)
        provider = gateway.providers.get(provider_name)
        if kept_for != project or not isinstance(provider, OpenAICompatibleProvider):
            return None  # another project's: as if unknown, so no id is confirmed to exist
        return provider

    alive_body = json_reply({"status": "ok", "version": settings.release}).body

    async def alive(request: Request) -> Reply:
        return Reply(200, {"content-type": "application/json"}, alive_body)

    async def health(request: Request) -> Reply:
        redis_ok = await gateway.cache.ping()
        writer = gateway.kv_writer
        return json_reply(
            {
                "status": "ok" if redis_ok else "degraded",
                "version": settings.release,
                "redis": {"ok": redis_ok, "replica": await gateway.cache.replica_status()},
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
                "semantic": _semantic_health(gateway),
                "background_writes": gateway.background_tasks,
                "uptime_seconds": round(time.time() - started, 1),
            }
        )

    async def metrics(request: Request) -> Reply:
        return Reply(200, {"content-type": "text/plain; version=0.0.4"}, gateway.metrics.render())

    api = [
        Route(CHAT_PATH, ApiRoute(gateway, CHAT, policies), frozenset({"POST"}), name="chat"),
        Route(MODELS_PATH, models, name="models"),
        Route(
            EMBEDDINGS_PATH,
            ApiRoute(gateway, EMBEDDINGS, policies),
            frozenset({"POST"}),
            name="embeddings",
        ),
        Route(
            MESSAGES_PATH,
            ApiRoute(gateway, MESSAGES, policies),
            frozenset({"POST"}),
            name="messages",
            error_body=MESSAGES.error_body,
        ),
        Route(
            RESPONSES_PATH,
            ApiRoute(gateway, RESPONSES, policies),
            frozenset({"POST"}),
            name="responses",
        ),
        Route(RESPONSES_PATH + "/", stored_response, frozenset({"GET", "POST", "DELETE"})),
        Route(
            REQUEST_LOG_PATH,
            EdgeRecords(
                settings.forward_secret,
                gateway.billing,
                gateway.metrics,
                gateway.request_log.add if gateway.request_log is not None else None,
            ),
            frozenset({"POST"}),
            recorded=False,  # the records it brings are logged; their delivery is not a request
        ),
        Route("/healthz", alive, recorded=False),
    ]
    dashboard = None
    if settings.admin_key is not None:
        history = History(gateway, settings.dashboard_interval)
        dashboard = Dashboard(history, settings.admin_key, WindowReader(gateway.new_redis()))
    board = dashboard.routes() if dashboard is not None else dashboard_off_routes()
    admin = Routes(
        [Route("/healthz", health), Route("/metrics", metrics), *board], reads_query=True
    )
    return OriginApp(
        gateway,
        api,
        admin,
        dashboard,
        admin_port=admin_port,
        loop_watch=LoopWatch(settings.loop_lag_limit, gateway.metrics, on_loop_tick),
    )


def _semantic_health(gateway: Gateway) -> dict[str, object]:
    """Whether the semantic layer is on, its model loaded (on first use), or why not."""
    semantic = gateway.semantic
    if semantic is None:
        return {"enabled": False}
    embedder = semantic.embedder
    return {"enabled": True, "loaded": embedder.loaded, "error": embedder.failed}
