"""OpenTelemetry for the origin: traces and the GenAI metrics, exported over OTLP/HTTP.

Imported only when an endpoint is configured (``PRISM_OTEL_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_ENDPOINT``): the SDK costs start-up time and memory an origin
without a collector should not pay, and with no endpoint the request path does nothing
more than check that ``telemetry`` is None (docs/architecture.md "Observability").

Per request (the trace):

- the edge's span, rebuilt from what the edge forwarded (``prism.trace_context``) with
  the span id its ``traceparent`` named, and one child per edge stage;
- the origin's ``SERVER`` span (``POST /v1/chat/completions``), its stages as children
  (``prism.cache.lookup`` is the Redis round trip), with the request's gen_ai.* attributes;
- one ``CLIENT`` span per provider attempt (``chat {model}``, retries and hedges each
  their own), current while the call is made, so the provider gets its ``traceparent``;
  a hedge is also an event on the request's span;
- ``prism.cache.store`` (the Redis write) and ``prism.kv.write`` (a Workers KV bulk call:
  a child of the first request it carries, linked to the others).

Metrics (the GenAI semantic conventions): ``gen_ai.client.token.usage`` (by
``gen_ai.token.type``), ``gen_ai.server.request.duration``,
``gen_ai.server.time_to_first_token`` and, per provider attempt,
``gen_ai.client.operation.duration``; by ``gen_ai.provider.name`` (the provider's kind:
``gen_ai.system`` is its deprecated name), ``gen_ai.request.model``,
``gen_ai.response.model``, ``prism.provider`` and ``prism.cache.layer``.

The providers are the SDK's own, private to this object (no global tracer provider is
set), so several origins in one process do not share them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar
from urllib.parse import urlsplit

import aiohttp
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from prism import headers as h
from prism.routes import EMBEDDINGS_PATH
from prism.trace_context import EDGE_SPAN, EDGE_TIMING, TRACEPARENT, parse_edge_span

from ..providers.base import ProviderSpec, UpstreamCompletion
from ..providers.token_counts import tokens_of
from ..settings import Settings
from .request import Request
from .responses import Reply

__all__ = ["Telemetry"]

T = TypeVar("T")


class AttemptTarget(Protocol):
    """What a span names of the target an attempt calls (``origin.routing.targets.Target``)."""

    @property
    def name(self) -> str: ...

    @property
    def model(self) -> str: ...

    @property
    def spec(self) -> ProviderSpec: ...


class NamedOperation(Protocol):
    """What a span names of the API an attempt serves (``origin.routing.operation``)."""

    @property
    def name(self) -> str: ...


Tg = TypeVar("Tg", bound=AttemptTarget)
Op = TypeVar("Op", bound=NamedOperation)

_SCOPE = "prism.origin"
# The GenAI conventions' advised buckets (seconds; tokens).
_SECONDS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92]
_TOKENS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216]
_OPERATIONS = {"embeddings": "embeddings"}  # an Operation's name -> gen_ai.operation.name
_PATH_OPERATIONS = {EMBEDDINGS_PATH: "embeddings"}  # a request's path -> the same
_STAGE_SPANS = {"redis": "prism.cache.lookup", "semantic": "prism.semantic.lookup"}
_MODELS = 256  # distinct model names a metric is labelled with; later ones are "other"
_LINKS = 128  # requests a KV bulk write's span links to


class _Open(NamedTuple):
    """A request's span while it is served, and where its clocks start."""

    span: trace.Span
    token: object  # the context attached for the request's task
    wall_ns: int  # time.time_ns() when the request arrived
    perf: float  # the StageTimer's start (perf_counter) at that moment
    edge: bool  # the request came from the edge with its span to rebuild


class Telemetry:
    def __init__(self, settings: Settings) -> None:
        assert settings.otel_endpoint is not None
        base = settings.otel_endpoint.rstrip("/")
        resource = Resource.create(
            {"service.name": settings.otel_service_name, "service.version": settings.release}
        )
        self._resource = resource
        self._spans = BatchSpanProcessor(
            OTLPSpanExporter(endpoint=f"{base}/v1/traces"),
            schedule_delay_millis=min(5.0, settings.otel_export_interval) * 1000,
        )
        self._tracer_provider = TracerProvider(resource=resource)
        self._tracer_provider.add_span_processor(self._spans)
        self._tracer = self._tracer_provider.get_tracer(_SCOPE)
        self._scope = InstrumentationScope(_SCOPE)
        self._reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=f"{base}/v1/metrics"),
            export_interval_millis=settings.otel_export_interval * 1000,
        )
        self._meter_provider = MeterProvider(resource=resource, metric_readers=[self._reader])
        meter = self._meter_provider.get_meter(_SCOPE)
        self._token_usage = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Tokens per answer, input and output (a cache hit: the stored answer's).",
            explicit_bucket_boundaries_advisory=_TOKENS,
        )
        self._request_duration = meter.create_histogram(
            "gen_ai.server.request.duration",
            unit="s",
            description="Each request, from its arrival to the end of its response.",
            explicit_bucket_boundaries_advisory=_SECONDS,
        )
        self._first_token = meter.create_histogram(
            "gen_ai.server.time_to_first_token",
            unit="s",
            description="From a successful request's arrival to its response's first bytes.",
            explicit_bucket_boundaries_advisory=_SECONDS,
        )
        self._operation_duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="Each provider attempt (a stream: until its first bytes).",
            explicit_bucket_boundaries_advisory=_SECONDS,
        )
        self._propagator = TraceContextTextMapPropagator()
        self._kinds = {name: spec.kind for name, spec in settings.providers.providers.items()}
        self._hosts = {
            name: urlsplit(spec.base_url).hostname or ""
            for name, spec in settings.providers.providers.items()
        }
        self._models: set[str] = set()

    # -- the request ---------------------------------------------------------------------

    def start(self, request: Request) -> _Open:
        """The request's span, current in its task (so the flight's task inherits it)."""
        headers = request.headers
        parent = (
            self._propagator.extract(headers) if TRACEPARENT in headers else otel_context.Context()
        )
        wall_ns = time.time_ns()
        span = self._tracer.start_span(
            f"{request.method} {request.path}",
            context=parent,
            kind=SpanKind.SERVER,
            start_time=wall_ns,
            attributes={
                "http.request.method": request.method,
                "url.path": request.path,
                "prism.request_id": request.id,
            },
        )
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        # Only a forward carries the edge's span (the edge sends no client's copy of it).
        edge = EDGE_SPAN in headers and h.FORWARD in headers and TRACEPARENT in headers
        return _Open(span, token, wall_ns, request.timer.started, edge)

    def finish(
        self, request: Request, reply: Reply, opened: _Open | None, first_byte: float, ended: float
    ) -> None:
        """After the response: the request's attributes, stage spans and metrics."""
        if opened is None:
            return
        span = opened.span
        otel_context.detach(opened.token)  # type: ignore[arg-type]
        end_ns = opened.wall_ns + int((ended - opened.perf) * 1e9)
        layer = reply.headers.get(h.CACHE_LAYER, "bypass")
        parsed = request.parsed
        model = parsed.model if parsed is not None else ""
        operation = _PATH_OPERATIONS.get(request.path, "chat")
        charge = request.charge
        served = charge.served if charge is not None else None
        tokens = charge.tokens if charge is not None else None
        if tokens is None:  # a hit: its stored answer's usage, read as the bill reads it
            tokens = tokens_of(request.usage)
        token_counts = (
            {} if tokens is None else {"input": tokens.prompt, "output": tokens.completion}
        )

        # What both the span and the metrics say about the request's outcome.
        outcome: dict[str, str] = {"prism.cache.layer": layer, **self._served(served)}
        if request.error:
            outcome["error.type"] = request.error
        attributes: dict[str, Any] = {"http.response.status_code": reply.status, **outcome}
        if request.project:
            attributes["prism.project"] = request.project
        if model:
            attributes["gen_ai.operation.name"] = operation
            attributes["gen_ai.request.model"] = model
        for token_type, count in token_counts.items():
            attributes[f"gen_ai.usage.{token_type}_tokens"] = count
        span.set_attributes(attributes)
        if reply.status >= 500:
            span.set_status(Status(StatusCode.ERROR, request.error or None))

        self._stage_spans(
            trace.set_span_in_context(span),
            opened.wall_ns,
            [(_STAGE_SPANS.get(name, f"prism.{name}"), ms) for name, ms in request.timer.stages],
        )
        if opened.edge:
            self._edge_span(request, opened, end_ns)
        span.end(end_ns)

        metric = {"gen_ai.operation.name": operation, **outcome}
        if model:
            metric["gen_ai.request.model"] = self._model_label(model)
        self._request_duration.record(ended - opened.perf, metric)
        if reply.status == 200:
            self._first_token.record(first_byte - opened.perf, metric)
        for token_type, count in token_counts.items():
            self._token_usage.record(count, {**metric, "gen_ai.token.type": token_type})

    def _served(self, served: tuple[str, str] | None) -> dict[str, str]:
        """What answered (provider name, upstream model) as attributes; none for a hit."""
        if served is None:
            return {}
        provider, model = served
        return {
            "gen_ai.provider.name": self._kinds.get(provider, provider),
            "prism.provider": provider,
            "gen_ai.response.model": model,
        }

    def _model_label(self, model: str) -> str:
        """A request may name any model: metrics are labelled with the first few only."""
        if model not in self._models and len(self._models) < _MODELS:
            self._models.add(model)
        return model if model in self._models else "other"

    def _edge_span(self, request: Request, opened: _Open, end_ns: int) -> None:
        """The edge's span, with the id its traceparent gave the origin, and its stages."""
        headers = request.headers
        edge = parse_edge_span(headers.get(EDGE_SPAN), headers.get(EDGE_TIMING))
        remote = trace.get_current_span(self._propagator.extract(headers)).get_span_context()
        if edge is None or not remote.is_valid:
            return
        # The halves' clocks differ a little: the edge's span never starts after the origin's.
        start_ns = min(int(edge.start_ms * 1e6), opened.wall_ns)
        parent = None
        if edge.parent_span_id is not None:
            parent = SpanContext(
                remote.trace_id, int(edge.parent_span_id, 16), True, remote.trace_flags
            )
        context = SpanContext(remote.trace_id, remote.span_id, False, remote.trace_flags)
        self._spans.on_end(
            ReadableSpan(
                "prism.edge",
                context=context,
                parent=parent,
                resource=self._resource,
                attributes={"prism.request_id": request.id, "prism.edge.rebuilt": True},
                kind=SpanKind.SERVER,
                start_time=start_ns,
                end_time=max(end_ns, start_ns),
                instrumentation_scope=self._scope,
            )
        )
        self._stage_spans(
            trace.set_span_in_context(trace.NonRecordingSpan(context)),
            start_ns,
            [(f"edge.{name}", ms) for name, ms in edge.stages],
        )

    def _stage_spans(
        self, parent: otel_context.Context, start_ns: int, stages: list[tuple[str, float]]
    ) -> None:
        """One child span per (name, milliseconds) stage, back to back from ``start_ns``."""
        for name, ms in stages:
            end_ns = start_ns + int(ms * 1e6)
            self._tracer.start_span(name, context=parent, start_time=start_ns).end(end_ns)
            start_ns = end_ns

    # -- the provider attempt --------------------------------------------------------------

    async def attempt(
        self,
        call: Callable[[Tg, dict[str, Any], bool, Op], Awaitable[T]],
        target: Tg,
        body: dict[str, Any],
        stream: bool,
        op: Op,
    ) -> T:
        """``call`` (the router's attempt) inside its ``CLIENT`` span."""
        operation = _OPERATIONS.get(op.name, "chat")
        metric: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": target.spec.kind,
            "gen_ai.request.model": target.model,
            "prism.provider": target.name,
        }
        attributes = {
            **metric,
            "prism.stream": stream,
            "server.address": self._hosts.get(target.name, ""),
        }
        started = time.perf_counter()
        with self._tracer.start_as_current_span(
            f"{operation} {target.model}",
            kind=SpanKind.CLIENT,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                value = await call(target, body, stream, op)
            except BaseException as error:
                code = getattr(error, "code", None)
                error_type = code if isinstance(code, str) else type(error).__name__
                span.set_attribute("error.type", error_type)
                span.set_status(Status(StatusCode.ERROR, error_type))
                metric["error.type"] = error_type
                self._operation_duration.record(time.perf_counter() - started, metric)
                raise
            if isinstance(value, UpstreamCompletion):
                completion = value.completion
                model = completion.get("model")
                if isinstance(model, str):
                    span.set_attribute("gen_ai.response.model", model)
                usage = completion.get("usage")
                if isinstance(usage, dict):
                    for key, name in (
                        ("prompt_tokens", "gen_ai.usage.input_tokens"),
                        ("completion_tokens", "gen_ai.usage.output_tokens"),
                    ):
                        count = _int(usage.get(key))
                        if count is not None:
                            span.set_attribute(name, count)
            self._operation_duration.record(time.perf_counter() - started, metric)
            return value

    def hedged(self, target: AttemptTarget) -> None:
        """A hedge started (called where the request's span is current)."""
        trace.get_current_span().add_event(
            "prism.hedge", {"prism.provider": target.name, "gen_ai.request.model": target.model}
        )

    def trace_config(self) -> aiohttp.TraceConfig:
        """Adds the current span's ``traceparent`` to each upstream request."""
        config = aiohttp.TraceConfig()

        async def inject(
            session: aiohttp.ClientSession,
            context: Any,
            params: aiohttp.TraceRequestStartParams,
        ) -> None:
            self._propagator.inject(params.headers)

        config.on_request_start.append(inject)
        return config

    # -- background writes -----------------------------------------------------------------

    def current(self) -> SpanContext | None:
        """The current span's context (to link a later batch write to this request)."""
        context = trace.get_current_span().get_span_context()
        return context if context.is_valid else None

    async def traced(self, name: str, work: Awaitable[T]) -> T:
        with self._tracer.start_as_current_span(
            name, kind=SpanKind.CLIENT, attributes={"db.system.name": "redis"}
        ):
            return await work

    async def kv_write(
        self,
        send: Callable[[list[Any]], Awaitable[None]],
        batch: list[Any],
        origins: Sequence[SpanContext | None],
    ) -> None:
        """One bulk call's span: a child of the first request it carries, linked to the rest."""
        unique = {(o.trace_id, o.span_id): o for o in origins if o is not None}
        carried = list(unique.values())
        parent = otel_context.Context()
        if carried:
            parent = trace.set_span_in_context(trace.NonRecordingSpan(carried[0]))
        with self._tracer.start_as_current_span(
            "prism.kv.write",
            context=parent,
            kind=SpanKind.CLIENT,
            links=[Link(c) for c in carried[1 : _LINKS + 1]],
            attributes={"prism.kv.entries": len(batch)},
        ):
            await send(batch)

    # -- lifecycle -------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Export what is left and stop (blocking: run it in a thread)."""
        self._tracer_provider.shutdown()
        self._meter_provider.shutdown()


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
