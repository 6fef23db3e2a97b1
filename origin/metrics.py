"""The origin's Prometheus metrics, in a registry owned by the app (no process globals)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["Metrics"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self._request_children: dict[tuple[str, int, str], Any] = {}
        self.requests = Counter(
            "prism_origin_requests",
            "Requests answered, by route, status and cache layer.",
            ("route", "status", "layer"),
            registry=registry,
        )
        self.request_seconds = Histogram(
            "prism_origin_request_duration_seconds",
            "Time to the response head, by route and cache layer.",
            ("route", "layer"),
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.provider_seconds = Histogram(
            "prism_provider_latency_seconds",
            "Provider time to first byte (stream) or to the full answer.",
            ("provider", "outcome"),
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.forward_rejected = Counter(
            "prism_origin_forward_rejected",
            "Edge forward headers refused: malformed, signature (forged, or replayed on another"
            " route or method), expired, or body (replayed with another body).",
            ("reason",),
            registry=registry,
        )
        self.coalesced = Counter(
            "prism_origin_coalesced_requests",
            "Requests answered by joining an identical in-flight provider call.",
            registry=registry,
        )
        self.redis_errors = Counter(
            "prism_redis_errors", "Redis operations that failed.", ("op",), registry=registry
        )
        self.kv_queue = Gauge(
            "prism_kv_writer_queue_depth", "Entries waiting to go to Workers KV.", registry=registry
        )
        self.kv_in_flight = Gauge(
            "prism_kv_writer_in_flight",
            "Entries in the bulk call being sent right now.",
            registry=registry,
        )
        self.kv_sent = Counter(
            "prism_kv_writer_sent", "Entries written to Workers KV.", registry=registry
        )
        self.kv_calls = Counter(
            "prism_kv_writer_calls", "Bulk REST calls made to Workers KV.", registry=registry
        )
        self.kv_retried = Counter(
            "prism_kv_writer_retries", "Bulk REST calls retried.", registry=registry
        )
        self.kv_dropped = Counter(
            "prism_kv_writer_dropped",
            "Entries given up on, by reason.",
            ("reason",),
            registry=registry,
        )

        self.provider_attempts = Counter(
            "prism_provider_attempts",
            "Upstream calls, by provider and outcome (ok, client_error, rate_limited,"
            " server_error, timeout, unreachable, malformed, auth, adapter_error, cancelled).",
            ("provider", "outcome"),
            registry=registry,
        )
        self.provider_hedges = Counter(
            "prism_provider_hedges",
            "Hedged calls started, by the provider hedged to.",
            ("provider",),
            registry=registry,
        )
        self.provider_stream_failures = Counter(
            "prism_provider_stream_failures",
            "Streams that broke after their first bytes reached the client, by provider.",
            ("provider",),
            registry=registry,
        )
        self.provider_state = Gauge(
            "prism_provider_state",
            "Provider health gate: 0 healthy, 1 probing, 2 demoted.",
            ("provider",),
            registry=registry,
        )

    def count_request(self, route: str, status: int, layer: str) -> None:
        """``requests.labels(...).inc()`` with the labelled child remembered (no lock, no
        label validation per request)."""
        key = (route, status, layer)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = self.requests.labels(route, str(status), layer)
        child.inc()

    def count_forward_rejected(self, reason: str) -> None:
        self.forward_rejected.labels(reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
