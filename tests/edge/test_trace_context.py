"""One trace from the client through the edge (the real local Workers runtime) and the
origin to the provider, as a real collector (Rotel) receives it: the edge's span rebuilt
at the origin under the client's, the origin's under the edge's, the cache lookup, the
provider attempt and the Workers KV write under the origin's; and the GenAI metrics."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from deploy.edge_bundle import build_edge
from deploy.local.ports import free_port
from deploy.local.provider import ProviderServer
from deploy.local.redis import RedisServer
from origin import Settings
from tests.fixtures.origin import (
    FORWARD_SECRET,
    KEY_SECRET,
    RunningOrigin,
    origin_env,
    serve_origin,
)
from tests.fixtures.otlp import Collector, ReceivedSpan
from tests.fixtures.workers import KVApi, WorkersRuntimeFactory

CHAT = "/v1/chat/completions"
SERVER, CLIENT = 2, 3  # opentelemetry.proto.trace.v1.Span.SpanKind
REQUEST = "POST /v1/chat/completions"


@dataclass
class TracedStack:
    edge_url: str
    origin: RunningOrigin
    collector: Collector
    provider: ProviderServer


@pytest.fixture(scope="module")
def traced(
    tmp_path_factory: pytest.TempPathFactory,
    workers_runtime_factory: WorkersRuntimeFactory,
    edge_redis: RedisServer,
    provider_server: ProviderServer,
    otel_collector: Collector,
) -> Iterator[TracedStack]:
    bundle = build_edge("local", tmp_path_factory.mktemp("traced") / "bundle")
    port = free_port()
    runtime = workers_runtime_factory(
        bundle.root,
        {
            "PRISM_KEY_SECRET": KEY_SECRET,
            "PRISM_FORWARD_SECRET": FORWARD_SECRET,
            "ORIGIN_URL": f"http://127.0.0.1:{port}",
            "PRISM_TRACE": "on",
        },
        api_token="kv-api-test-token",
    )
    kv = KVApi(runtime)
    env = origin_env(
        edge_redis.url,
        provider_server.url,
        **kv.settings(),
        PRISM_KV_FLUSH_INTERVAL="0.05",
        PRISM_OTEL_ENDPOINT=otel_collector.url,
        PRISM_OTEL_EXPORT_INTERVAL="0.2",
    )
    origin = serve_origin(Settings.from_env(env), port)
    try:
        assert runtime.edge_url is not None
        yield TracedStack(runtime.edge_url, origin, otel_collector, provider_server)
    finally:
        origin.server.stop()
        kv.close()


def _ask(stack: TracedStack, api_key: str, **headers: str) -> tuple[httpx.Response, str]:
    request_id = f"trace-{secrets.token_hex(6)}"
    response = httpx.post(
        stack.edge_url + CHAT,
        json={
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": f"edge trace {secrets.token_hex(6)}"}],
        },
        headers={"authorization": f"Bearer {api_key}", "x-request-id": request_id, **headers},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response, request_id


def _trace_of(collector: Collector, request_id: str, *names: str) -> dict[str, ReceivedSpan]:
    """The spans of the trace whose origin span answered ``request_id``, by name, once
    every one of ``names`` has arrived."""

    def answered(span: ReceivedSpan) -> bool:
        return span.name == REQUEST and span.attributes.get("prism.request_id") == request_id

    [request] = [s for s in collector.spans(lambda spans: any(map(answered, spans))) if answered(s)]
    return collector.trace(request.trace_id, *names)


def test_a_miss_through_the_edge_is_one_trace_under_the_clients_span(
    traced: TracedStack, api_key: str
) -> None:
    client_trace, client_span = secrets.token_hex(16), secrets.token_hex(8)
    response, request_id = _ask(traced, api_key, traceparent=f"00-{client_trace}-{client_span}-01")
    assert response.headers["x-prism-edge-cache-layer"] == "miss"
    spans = _trace_of(
        traced.collector,
        request_id,
        "prism.edge",
        "edge.auth",
        "edge.kv",
        REQUEST,
        "prism.cache.lookup",
        "chat gpt-4o-mini",
        "prism.kv.write",
    )
    edge, origin = spans["prism.edge"], spans[REQUEST]
    assert edge.trace_id == client_trace  # the client's trace, continued
    assert edge.parent_span_id == client_span
    assert edge.kind == SERVER
    assert origin.parent_span_id == edge.span_id
    assert edge.start_ns <= origin.start_ns and origin.end_ns <= edge.end_ns
    for stage in ("edge.auth", "edge.kv"):
        assert spans[stage].parent_span_id == edge.span_id
    assert spans["edge.auth"].end_ns <= spans["edge.kv"].start_ns

    assert spans["prism.cache.lookup"].parent_span_id == origin.span_id
    attempt = spans["chat gpt-4o-mini"]
    assert attempt.kind == CLIENT and attempt.parent_span_id == origin.span_id
    assert attempt.attributes["gen_ai.request.model"] == "gpt-4o-mini"
    assert attempt.attributes["gen_ai.provider.name"] == "openai"
    assert origin.attributes["gen_ai.request.model"] == "gpt-4o-mini"
    assert origin.attributes["gen_ai.usage.input_tokens"] > 0
    assert origin.attributes["prism.cache.layer"] == "miss"
    # The KV write carrying this answer: in this request's trace (or linked to it).
    kv_write = spans["prism.kv.write"]
    assert (
        kv_write.parent_span_id == origin.span_id
        or (
            client_trace,
            origin.span_id,
        )
        in kv_write.links
    )
    assert kv_write.attributes["prism.kv.entries"] >= 1

    # And the request's metrics arrived.
    traced.collector.points(
        lambda points: any(
            p.name == "gen_ai.client.token.usage"
            and p.attributes.get("prism.cache.layer") == "miss"
            and p.attributes.get("gen_ai.token.type") == "output"
            for p in points
        )
    )


def test_the_edge_starts_a_trace_when_the_client_sent_none_or_a_broken_one(
    traced: TracedStack, api_key: str
) -> None:
    for headers in ({}, {"traceparent": "00-not-a-trace-parent"}):
        _, request_id = _ask(traced, api_key, **headers)
        spans = _trace_of(traced.collector, request_id, "prism.edge", REQUEST)
        edge, origin = spans["prism.edge"], spans[REQUEST]
        assert edge.parent_span_id == ""  # the edge's span is the trace's root
        assert origin.parent_span_id == edge.span_id
        assert len(edge.trace_id) == 32 and edge.trace_id != "0" * 32
