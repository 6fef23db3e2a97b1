"""The origin's Prometheus metrics, in a registry owned by the app (no process globals)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["Metrics"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        # The labelled children of requests / request_seconds, by (route, status, layer).
        self._request_children: dict[tuple[str, int, str], tuple[Any, Any]] = {}
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

    def record_request(self, route: str, status: int, layer: str, seconds: float) -> None:
        """Count one answered request and observe its time to the response head, with the
        labelled children remembered (no lock, no label validation per request)."""
        key = (route, status, layer)
        children = self._request_children.get(key)
        if children is None:
            children = self._request_children[key] = (
                self.requests.labels(route, str(status), layer),
                self.request_seconds.labels(route, layer),
            )
        count, duration = children
        count.inc()
        duration.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
