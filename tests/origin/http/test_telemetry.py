"""OpenTelemetry at the origin, through a real collector (Rotel, tests/fixtures/otlp.py):
a miss and a hit as traces and GenAI metrics, the provider called with the attempt's
traceparent, and no endpoint meaning no OpenTelemetry at all."""

from __future__ import annotations

import secrets
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import httpx

from deploy.local.provider import ProviderServer, ProviderSettings
from origin import Settings
from tests.fixtures.origin import OriginFactory, origin_env
from tests.fixtures.otlp import Collector, ReceivedSpan

SERVER, CLIENT = 2, 3  # opentelemetry.proto.trace.v1.Span.SpanKind


def _telemetry_env(collector: Collector) -> dict[str, str]:
    return {"PRISM_OTEL_ENDPOINT": collector.url, "PRISM_OTEL_EXPORT_INTERVAL": "0.2"}


def _ask(client: httpx.Client, content: str, traceparent: str) -> httpx.Response:
    return client.post(
        "/v1/chat/completions",
        json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}]},
        headers={"traceparent": traceparent},
    )


def test_a_miss_and_a_hit_arrive_as_traces_under_the_callers_span(
    origin_factory: OriginFactory,
    otel_collector: Collector,
    provider: ProviderServer,
    api_key: str,
) -> None:
    origin = origin_factory(_telemetry_env(otel_collector))
    content = f"telemetry {secrets.token_hex(6)}"
    miss_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    with httpx.Client(
        base_url=origin.url, headers={"authorization": f"Bearer {api_key}"}, timeout=30
    ) as client:
        miss = _ask(client, content, f"00-{miss_trace}-{caller_span}-01")
        assert miss.status_code == 200 and miss.headers["x-prism-edge-cache-layer"] == "miss"
        origin.wait_stored()
        hit_trace = secrets.token_hex(16)
        hit = _ask(client, content, f"00-{hit_trace}-{secrets.token_hex(8)}-01")
        assert hit.headers["x-prism-edge-cache-layer"] == "redis"

    spans = otel_collector.trace(
        miss_trace,
        "POST /v1/chat/completions",
        "chat gpt-4o-mini",
        "prism.cache.lookup",
        "prism.cache.store",
    )
    request = spans["POST /v1/chat/completions"]
    assert request.kind == SERVER and request.parent_span_id == caller_span
    assert request.resource["service.name"] == "prism-origin"
    assert request.attributes["gen_ai.request.model"] == "gpt-4o-mini"
    assert request.attributes["gen_ai.response.model"] == "gpt-4o-mini"
    assert request.attributes["gen_ai.provider.name"] == "openai"
    assert request.attributes["prism.cache.layer"] == "miss"
    assert request.attributes["prism.project"] == "acme"
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["gen_ai.usage.input_tokens"] > 0
    assert request.attributes["gen_ai.usage.output_tokens"] > 0
    assert request.attributes["gen_ai.operation.name"] == "chat"

    attempt = spans["chat gpt-4o-mini"]
    assert attempt.kind == CLIENT and attempt.parent_span_id == request.span_id
    assert attempt.attributes["gen_ai.operation.name"] == "chat"
    assert attempt.attributes["gen_ai.provider.name"] == "openai"
    assert attempt.attributes["prism.provider"] == "openai"
    assert attempt.attributes["gen_ai.usage.output_tokens"] > 0
    lookup = spans["prism.cache.lookup"]
    assert lookup.parent_span_id == request.span_id
    assert request.start_ns <= lookup.start_ns <= lookup.end_ns <= request.end_ns
    assert spans["prism.cache.store"].parent_span_id == request.span_id

    # The provider was called under the attempt's span.
    [seen] = [r for r in provider.control.requests() if content in str(r["body"])]
    assert seen["headers"]["traceparent"] == f"00-{miss_trace}-{attempt.span_id}-01"

    hit_spans = otel_collector.trace(hit_trace, "POST /v1/chat/completions")
    assert hit_spans["POST /v1/chat/completions"].attributes["prism.cache.layer"] == "redis"
    assert "chat gpt-4o-mini" not in hit_spans  # a hit calls no provider


def test_an_embeddings_request_is_traced_as_the_embeddings_operation(
    origin_factory: OriginFactory, otel_collector: Collector, api_key: str
) -> None:
    origin = origin_factory(_telemetry_env(otel_collector))
    trace_id = secrets.token_hex(16)
    answer = httpx.post(
        origin.url + "/v1/embeddings",
        json={"model": "text-embedding-3-small", "input": f"traced {secrets.token_hex(6)}"},
        headers={
            "authorization": f"Bearer {api_key}",
            "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01",
        },
        timeout=30,
    )
    assert answer.status_code == 200
    spans = otel_collector.trace(
        trace_id, "POST /v1/embeddings", "embeddings text-embedding-3-small"
    )
    for name in ("POST /v1/embeddings", "embeddings text-embedding-3-small"):
        assert spans[name].attributes["gen_ai.operation.name"] == "embeddings"


def test_the_gen_ai_metrics_arrive_by_provider_model_and_layer(
    origin_factory: OriginFactory, otel_collector: Collector, api_key: str
) -> None:
    origin = origin_factory(_telemetry_env(otel_collector), OTEL_SERVICE_NAME="prism-metrics")
    with httpx.Client(
        base_url=origin.url, headers={"authorization": f"Bearer {api_key}"}, timeout=30
    ) as client:
        content = f"metrics {secrets.token_hex(6)}"
        assert _ask(client, content, f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01")
        origin.wait_stored()
        assert _ask(client, content, f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01")

    def arrived(name: str, **attributes: object) -> bool:
        return any(
            p.name == name
            and p.count > 0
            and all(p.attributes.get(k) == v for k, v in attributes.items())
            for p in otel_collector.received.point_list()
        )

    miss = {"prism.cache.layer": "miss", "gen_ai.request.model": "gpt-4o-mini"}
    served = {"gen_ai.provider.name": "openai", "gen_ai.response.model": "gpt-4o-mini"}
    otel_collector.points(
        lambda _: (
            arrived("gen_ai.client.token.usage", **miss, **served, **{"gen_ai.token.type": "input"})
            and arrived("gen_ai.client.token.usage", **miss, **{"gen_ai.token.type": "output"})
            and arrived(
                "gen_ai.client.token.usage",
                **{"prism.cache.layer": "redis", "gen_ai.token.type": "output"},
            )
            and arrived("gen_ai.server.request.duration", **miss, **served)
            and arrived("gen_ai.server.request.duration", **{"prism.cache.layer": "redis"})
            and arrived("gen_ai.server.time_to_first_token", **miss)
            and arrived("gen_ai.client.operation.duration", **{"prism.provider": "openai"})
        )
    )
    [usage] = [
        p for p in otel_collector.received.point_list() if p.name == "gen_ai.client.token.usage"
    ][:1]
    assert usage.unit == "{token}"
    durations = [
        p
        for p in otel_collector.received.point_list()
        if p.name == "gen_ai.server.request.duration"
    ]
    assert durations and all(p.unit == "s" for p in durations)


def test_with_no_endpoint_nothing_of_opentelemetry_is_imported_or_built(
    redis_url: str, provider: ProviderServer
) -> None:
    env = origin_env(redis_url, provider.url)
    settings = Settings.from_env(env)
    assert settings.otel_endpoint is None
    # A fresh interpreter: what building the app imported. (redis-py imports the SDK's
    # metrics module itself when it is installed, for its own opt-in metrics: not ours.)
    script = textwrap.dedent(
        f"""
        import sys
        from origin import Settings, create_app
        app = create_app(Settings.from_env({env!r}))
        assert app.telemetry is None and app.gateway.telemetry is None
        assert app.gateway.router.telemetry is None
        ours = ("origin.http.telemetry", "opentelemetry.sdk.trace", "opentelemetry.exporter")
        print(sorted(name for name in sys.modules if name.startswith(ours)))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_standard_otlp_endpoint_variable_turns_it_on_too(
    redis_url: str, provider: ProviderServer
) -> None:
    env = origin_env(redis_url, provider.url, OTEL_EXPORTER_OTLP_ENDPOINT="http://collector:4318")
    assert Settings.from_env(env).otel_endpoint == "http://collector:4318"
    ours = {**env, "PRISM_OTEL_ENDPOINT": "http://ours:4318"}
    assert Settings.from_env(ours).otel_endpoint == "http://ours:4318"


def test_a_hedge_is_an_event_and_each_attempt_its_own_span(
    origin_factory: OriginFactory,
    otel_collector: Collector,
    provider: ProviderServer,
    provider_factory: Callable[[ProviderSettings], ProviderServer],
    api_key: str,
    tmp_path: Path,
) -> None:
    second = provider_factory(ProviderSettings())
    providers = tmp_path / "providers.toml"
    providers.write_text(
        f"""
[providers.first]
base_url = "{provider.url}/v1"
api_key = "provider-test-key"
hedge_delay = 0.05
[providers.second]
base_url = "{second.url}/v1"
api_key = "provider-test-key"
[models]
"demo" = ["first", "second"]
"""
    )
    origin = origin_factory(_telemetry_env(otel_collector), PRISM_PROVIDERS_FILE=str(providers))
    # The first is slow: it stalls until the hedge has answered (the minute is a backstop).
    provider.control.set_fault("stall_before_first_byte", seconds=60)
    trace_id = secrets.token_hex(16)
    response = httpx.post(
        origin.url + "/v1/chat/completions",
        json={"model": "demo", "messages": [{"role": "user", "content": secrets.token_hex(8)}]},
        headers={
            "authorization": f"Bearer {api_key}",
            "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01",
        },
        timeout=30,
    )
    provider.control.release()  # the loser's stall, left behind by the origin
    assert response.status_code == 200

    def both_attempts(spans: list[ReceivedSpan]) -> bool:
        attempts = [s for s in spans if s.trace_id == trace_id and s.name == "chat demo"]
        return len(attempts) == 2 and any(
            s.name == "POST /v1/chat/completions" and s.trace_id == trace_id for s in spans
        )

    spans = [s for s in otel_collector.spans(both_attempts) if s.trace_id == trace_id]
    [request] = [s for s in spans if s.name == "POST /v1/chat/completions"]
    attempts = {s.attributes["prism.provider"]: s for s in spans if s.name == "chat demo"}
    assert set(attempts) == {"first", "second"}
    assert all(a.parent_span_id == request.span_id for a in attempts.values())
    assert attempts["first"].attributes["error.type"] == "CancelledError"  # the loser
    assert "error.type" not in attempts["second"].attributes
    assert ("prism.hedge", {"prism.provider": "second", "gen_ai.request.model": "demo"}) in (
        request.events
    )
    assert request.attributes["prism.provider"] == "second"
