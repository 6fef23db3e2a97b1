"""The origin's Prometheus metrics, in a registry owned by the app (no process globals)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["Metrics"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class _RequestStats(Collector):
    """``{prefix}_requests_total`` and ``{prefix}_request_duration_seconds``: the origin's
    answers (``prism_origin``), and the edge's own as its records tell (``prism_edge``).

    Recorded on every request, so kept as plain numbers and exported at scrape time:
    only the event loop's thread touches them (scrapes included), so they need none of
    the locks a prometheus_client Counter or Histogram takes per update. One series per
    (route, status, layer) holds both: its count is the sum of its buckets, and the
    histogram (by route and layer) adds up the statuses at scrape time, so a request
    costs one dict lookup.
    """

    def __init__(self, prefix: str, answered_by: str) -> None:
        self._prefix = prefix
        self._answered_by = answered_by
        # Per (route, status, layer): a count per bucket (the last one is +Inf), then the sum.
        self.series: dict[tuple[str, int, str], list[float]] = {}

    def record(self, route: str, status: int, layer: str, seconds: float) -> None:
        series = self.series.get((route, status, layer))
        if series is None:
            series = self.series[(route, status, layer)] = [0.0] * (len(_LATENCY_BUCKETS) + 2)
        series[bisect_left(_LATENCY_BUCKETS, seconds)] += 1
        series[-1] += seconds

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            f"{self._prefix}_requests",
            f"Requests {self._answered_by}, by route, status and cache layer.",
            labels=("route", "status", "layer"),
        )
        histograms: dict[tuple[str, str], list[float]] = {}
        for (route, status, layer), series in self.series.items():
            requests.add_metric((route, str(status), layer), sum(series[:-1]))
            histogram = histograms.setdefault((route, layer), [0.0] * len(series))
            for index, value in enumerate(series):
                histogram[index] += value
        yield requests
        durations = HistogramMetricFamily(
            f"{self._prefix}_request_duration_seconds",
            "Time to the response head, by route and cache layer.",
            labels=("route", "layer"),
        )
        bounds = [*map(str, map(float, _LATENCY_BUCKETS)), "+Inf"]
        for (route, layer), histogram in histograms.items():
            cumulative, buckets = 0.0, []
            for bound, in_bucket in zip(bounds, histogram[:-1], strict=True):
                cumulative += in_bucket
                buckets.append((bound, cumulative))
            durations.add_metric((route, layer), buckets, histogram[-1])
        yield durations


class Metrics:
    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self._requests = _RequestStats("prism_origin", "answered")
        registry.register(self._requests)
        # Count one answered request and observe its time to the response head (route,
        # status, layer, seconds): the stats' own method, one call per request.
        self.record_request: Callable[[str, int, str, float], None] = self._requests.record
        edge = _RequestStats("prism_edge", "the edge answered itself (KV hits, refusals)")
        registry.register(edge)
        self.record_edge_request: Callable[[str, int, str, float], None] = edge.record
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
        self.edge_records = Counter(
            "prism_edge_request_records",
            "Records of requests the edge answered itself (KV hits, refusals): received, or"
            " dropped at the edge (its queue was full while no origin took them).",
            ("outcome",),
            registry=registry,
        )
        self.edge_record_batches = Counter(
            "prism_edge_request_record_batches",
            "Batches of those records received: one POST from an isolate each (at most two a"
            " second an isolate).",
            registry=registry,
        )
        self.coalesced = Counter(
            "prism_origin_coalesced_requests",
            "Requests answered by joining an identical in-flight provider call.",
            registry=registry,
        )
        self.shared_flights = Counter(
            "prism_origin_shared_flights",
            "Misses by their part in a provider call shared across processes: lead (this "
            "process called), follow (another process's call answered), take_over (its "
            "leader was lost), own (called alone: the leader failed, or was silent past the "
            "first-byte limit, or Redis could not say).",
            ("outcome",),
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
        self.kv_submitted = Counter(
            "prism_kv_writer_submitted",
            "New entries handed to the KV writer (each is later sent or dropped).",
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
        self.provider_stream_resumptions = Counter(
            "prism_provider_stream_resumptions",
            "Broken chat streams another target was asked to continue, by the provider whose"
            " stream broke and outcome (resumed, failed, unavailable: no target could).",
            ("provider", "outcome"),
            registry=registry,
        )
        self.provider_state = Gauge(
            "prism_provider_state",
            "Provider health gate: 0 healthy, 1 probing, 2 demoted.",
            ("provider",),
            registry=registry,
        )

        # The model catalog's fetches (origin.routing.model_catalog): a few per provider
        # per refresh interval.
        self.model_list_fetches = Counter(
            "prism_model_list_fetches",
            "Provider model-list fetches, by provider and outcome (ok, failed; a failed one"
            " keeps the provider's last list).",
            ("provider", "outcome"),
            registry=registry,
        )
        self.models_listed = Gauge(
            "prism_models_listed",
            "Models /v1/models lists (named routes and the providers' own lists).",
            registry=registry,
        )

        # Rate limit refusals (origin.governance.rate_limiter): few by design, so a locked Counter
        # is fine.
        self.rate_limited = Counter(
            "prism_rate_limited",
            "Requests refused by a rate limit, by project, kind (requests, tokens) and scope"
            " (project, key).",
            ("project", "kind", "scope"),
            registry=registry,
        )

        # The event loop's lag (origin.http.loop_watch): set by its ticks, a few a second.
        self.loop_lag = Gauge(
            "prism_origin_event_loop_lag_seconds",
            "How late the event loop ran its last watch tick (0: on time).",
            registry=registry,
        )
        self.loop_lag_refused = Counter(
            "prism_origin_loop_lag_refused",
            "Requests refused with a 503 while the event loop lagged past its limit.",
            registry=registry,
        )

    def count_forward_rejected(self, reason: str) -> None:
        self.forward_rejected.labels(reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
