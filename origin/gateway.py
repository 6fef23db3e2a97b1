"""The origin's parts, built once from settings and shared by every route."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
import httpx

from prism import encode_envelope, entry_key
from prism.routes import MODELS_KEY

from .background import cancel_and_wait
from .connection.redis_client import RedisClient, RedisPyClient
from .connection.redis_pipe import RedisPipe
from .governance.audit import AuditWriter
from .governance.billing import Billing
from .governance.budgets import Budgets
from .governance.rate_limiter import RateLimiter
from .governance.usage import UsageRecorder
from .metrics import Metrics
from .providers.base import ChatProvider, UpstreamCompletion
from .providers.registry import build_provider
from .providers.upstream_http import ConnectorFactory
from .requestlog.durable import durable_sinks
from .requestlog.request_log import RequestLog, build_request_log
from .routing.coalescing import FlightTable
from .routing.flight_lease import FlightLeases, lease_ms
from .routing.model_catalog import ModelCatalog
from .routing.router import Router
from .settings import Settings, SettingsError
from .store.kv_writer import KVWriter
from .store.redis_cache import RedisCache
from .store.semantic import Pending, SemanticCache, build_semantic_cache

if TYPE_CHECKING:
    from .http.telemetry import Telemetry

__all__ = ["Gateway"]

log = logging.getLogger("prism.origin")

T = TypeVar("T")

# The model list in Workers KV (for the edge's /v1/models) lives this long unrefreshed;
# it is published once the catalog's first refresh is done, whenever it changes, and at
# least this often.
MODELS_TTL = 7 * 86_400
MODELS_REPUBLISH = 86_400.0


class Gateway:
    def __init__(
        self,
        settings: Settings,
        *,
        redis: RedisClient | None = None,
        connectors: Mapping[str, ConnectorFactory] | None = None,
        kv_transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = Metrics()
        if redis is None:
            redis = _redis_client(settings, settings.redis_url)
        self.redis = redis
        # The hot lookup on a nearby replica, when there is one; everything else on `redis`.
        self.redis_reader = (
            _redis_client(settings, settings.redis_read_url) if settings.redis_read_url else None
        )
        self.cache = RedisCache(
            self.redis,
            self.metrics,
            settings.redis_retry_after,
            reader=self.redis_reader,
            # A miss's lookup takes its shared flight's lease (self.flight_leases, below).
            flight_lease_ms=lease_ms(settings.flight_lease) if settings.flight_lease > 0 else 0,
        )
        # Tracing first: the parts that report to it are given it as they are made.
        self.telemetry = _telemetry(settings) if settings.otel_endpoint else None
        connectors = connectors or {}
        self.providers: dict[str, ChatProvider] = {}
        for name, spec in settings.providers.providers.items():
            try:  # a kind's adapter checks its own settings (the provider table's other keys)
                self.providers[name] = build_provider(
                    spec, connectors.get(name), self._trace_configs()
                )
            except ValueError as error:
                said = str(error)
                raise SettingsError(
                    said if repr(name) in said else f"provider {name!r}: {said}"
                ) from None
        self.router = Router(
            settings.providers, self.providers, self.metrics, telemetry=self.telemetry
        )
        self._background: set[asyncio.Task[Any]] = set()
        self.flight_leases: FlightLeases | None = None
        if settings.flight_lease > 0:
            counter = self.metrics.shared_flights
            self.flight_leases = FlightLeases(
                self.redis,
                settings.redis_url,
                self.router.first_byte_limit,
                lambda outcome: counter.labels(outcome).inc(),
                lease=settings.flight_lease,
                timeout=settings.redis_timeout,
            )
        self.flights = FlightTable(
            self.router, self.store, self.metrics.coalesced.inc, self.flight_leases
        )
        self._kv_client: httpx.AsyncClient | None = None
        self.kv_writer: KVWriter | None = None
        if settings.kv is not None:
            self._kv_client = httpx.AsyncClient(transport=kv_transport, timeout=30.0)
            self.kv_writer = KVWriter(settings.kv, self._kv_client, self.metrics, self.telemetry)
        self.usage = UsageRecorder(
            self.redis, lambda: self.cache.available, settings.usage_flush_interval
        )
        self.metrics.registry.register(self.usage)
        self.billing = Billing(
            settings.providers,
            Budgets(self.redis, settings.providers, settings.budget_hold),
            self.usage,
            self.spawn,
            lambda: self.cache.available,
        )
        # One audit writer and one rate limiter per process, shared by every API route.
        self.audit = AuditWriter(self.redis)
        self.limiter = RateLimiter(
            self.redis, self.metrics, self.audit, self.spawn, lambda: self.cache.available
        )
        # None when PRISM_SEMANTIC_MODEL=off; the model itself loads on first use.
        self.semantic: SemanticCache | None = build_semantic_cache(
            settings, self.redis, self.metrics, self.spawn
        )
        self.started = time.time()
        # /v1/models: the named routes and the wildcard routes' providers' own lists,
        # refreshed in the background and published to Workers KV for the edge.
        self.catalog = ModelCatalog(
            settings.providers, self.providers, self.metrics, created=self.started
        )
        self._models_task: asyncio.Task[None] | None = None
        # One record per request (origin/requestlog): the Redis window on a connection of
        # its own, and the access log as one more consumer. None: both off.
        self.request_log: RequestLog | None = build_request_log(
            settings,
            self.metrics.registry,
            lambda: _redis_client(settings, settings.redis_url),
            durable_sinks(settings) if settings.request_log else (),
        )

    def new_redis(self) -> RedisClient:
        """A connection of its own to the primary, for a reader whose replies are bulky (the
        dashboard's Requests page): no request's command waits behind them. The caller
        closes it."""
        return _redis_client(self.settings, self.settings.redis_url)

    def _trace_configs(self) -> tuple[aiohttp.TraceConfig, ...]:
        """A provider's request hooks: with tracing, the one adding ``traceparent``."""
        return () if self.telemetry is None else (self.telemetry.trace_config(),)

    def spawn(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``work`` after the response, holding a reference so it is not collected."""
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    @property
    def background_tasks(self) -> int:
        """Cache writes still running (for /healthz and for tests that wait for them)."""
        return len(self._background)

    def store(
        self,
        fingerprint: str,
        result: UpstreamCompletion,
        model: str,
        ttl: int,
        fallback: bool = False,
        semantic: Pending | None = None,
    ) -> asyncio.Task[bool]:
        """Write a new entry to Redis and queue it for Workers KV; neither delays the client.
        Returns the Redis write (the flight stays joinable until it has landed). A
        ``semantic`` question is indexed once the entry is in Redis, expiring with it."""
        if fallback:
            # A fallback's answer is kept briefly, and steps aside as soon as the route's
            # primary is healthy (``origin.apis.pipeline``): the primary's answer replaces it.
            ttl = min(ttl, self.settings.fallback_ttl)
        usage = result.completion.get("usage")
        created = int(time.time())
        data = encode_envelope(
            result.body,
            model=model,
            ttl=ttl,
            usage=usage if isinstance(usage, dict) else None,
            created=created,
            fallback=fallback,
        )
        storing = self.cache.store(fingerprint, data, ttl)
        if self.telemetry is not None:
            storing = self.telemetry.traced("prism.cache.store", storing)
        write = self.spawn(storing)
        # Not a fallback's answer: a PoP could not learn that the primary is back.
        if self.kv_writer is not None and not fallback:
            self.kv_writer.submit(entry_key(fingerprint), data, ttl)
        if semantic is not None and self.semantic is not None:
            self.spawn(self._index(write, semantic, fingerprint, created + ttl))
        return write

    async def _index(
        self, write: asyncio.Task[bool], semantic: Pending, fingerprint: str, expires: int
    ) -> None:
        # After the entry has landed: the index never points at an entry not yet written.
        if await asyncio.shield(write) and self.semantic is not None:
            await self.semantic.add(semantic, fingerprint, expires)

    async def start(self) -> None:
        self.cache.start()
        self.usage.start()
        if self.request_log is not None:
            self.request_log.start()
        if self.kv_writer is not None:
            self.kv_writer.start()
        if self.kv_writer is not None or self.catalog.sources:
            self._models_task = asyncio.create_task(self._keep_models())

    async def _keep_models(self) -> None:
        """Refresh the catalog now and every ``models_refresh_interval`` (never on a
        request's path), and publish it to Workers KV for the edge: once the first
        refresh is done (never a list from before the providers were asked), on every
        change, and at least every ``MODELS_REPUBLISH``."""
        catalog, writer = self.catalog, self.kv_writer
        interval = self.settings.models_refresh_interval if catalog.sources else MODELS_REPUBLISH
        loop = asyncio.get_running_loop()
        published_at: float | None = None
        while True:
            changed = await catalog.refresh()
            due = published_at is None or loop.time() - published_at >= MODELS_REPUBLISH
            if writer is not None and (changed or due):
                writer.submit(MODELS_KEY, catalog.body(None), MODELS_TTL, entry=False)
                published_at = loop.time()
            await asyncio.sleep(interval)

    async def close(self) -> None:
        await cancel_and_wait(self._models_task)
        if self._background:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await asyncio.gather(*self._background, return_exceptions=True)
        await self.usage.close()  # after the settles: the last counts go out
        if self.request_log is not None:  # the records of every answered request go out
            await self.request_log.close()
        if self.kv_writer is not None:
            await self.kv_writer.stop()
        if self._kv_client is not None:
            await self._kv_client.aclose()
        for provider in self.providers.values():
            await provider.aclose()
        if self.semantic is not None:
            self.semantic.close()
        if self.telemetry is not None:  # what is left goes out (the SDK's export blocks)
            await asyncio.to_thread(self.telemetry.shutdown)
        await self.cache.close()
        if self.flight_leases is not None:
            await self.flight_leases.close()
        await self.redis.close()
        if self.redis_reader is not None:
            await self.redis_reader.close()


def _telemetry(settings: Settings) -> Telemetry:
    """Tracing and the GenAI metrics. Imported here, only when configured: the
    OpenTelemetry SDK is an optional extra (``otel``)."""
    try:
        from .http.telemetry import Telemetry
    except ImportError as error:
        raise SettingsError(
            f"An OTLP endpoint is set but the OpenTelemetry SDK is missing ({error.name}): "
            "pip install 'prism-edge-gateway[otel]', or unset PRISM_OTEL_ENDPOINT."
        ) from None
    return Telemetry(settings)


def _redis_client(settings: Settings, url: str) -> RedisClient:
    if settings.redis_client == "redis-py":
        return RedisPyClient(url, settings.redis_timeout)
    return RedisPipe(url, settings.redis_timeout)
