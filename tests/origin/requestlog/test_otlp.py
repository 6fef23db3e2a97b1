"""The request log as OpenTelemetry logs through a real collector (Rotel,
tests/fixtures/otlp.py): one log record per request with the GenAI and HTTP attributes
and the nested fields as its body; a collector that is down raises, so the batch is kept."""

from __future__ import annotations

import asyncio
import secrets
from enum import IntEnum, StrEnum

import orjson
import pytest

from deploy.local.ports import free_port
from origin import Settings
from origin.requestlog.durable import durable_sinks
from origin.requestlog.otlp import OTLPExportError, OTLPLogSink, log_record
from tests.fixtures.origin import origin_env
from tests.fixtures.otlp import Collector, ReceivedLog
from tests.origin.requestlog.samples import THURSDAY, drive, lines, record

INFO, WARN, ERROR = 9, 13, 17  # opentelemetry.proto.logs.v1.SeverityNumber


def test_each_request_arrives_as_one_log_record_through_the_collector(
    otel_collector: Collector,
) -> None:
    run = secrets.token_hex(4)
    batch = [record(i, id=f"{run}-{i}") for i in range(1500)]
    batch[7] |= {"status": 429, "error": "rate_limit_exceeded"}
    batch[8] |= {"status": 502, "error": "upstream_error", "providers": ["openai", "anthropic"]}
    batch[9] |= {"body": {"request": {"messages": []}, "response": {"choices": []}}, "score": 0.91}
    sink = OTLPLogSink(otel_collector.url, "prism-origin", "r42")
    assert asyncio.run(drive(sink, batch)) == 0  # two batches, each taken at once
    asyncio.run(sink.close())

    def ours(logs: list[ReceivedLog]) -> list[ReceivedLog]:
        return [
            log for log in logs if str(log.attributes.get("prism.request.id", "")).startswith(run)
        ]

    found = {
        log.attributes["prism.request.id"]: log
        for log in ours(otel_collector.logs(lambda logs: len(ours(logs)) >= 1500))
    }
    assert len(found) == 1500  # each once
    first = found[f"{run}-0"]
    assert first.event_name == "prism.request" and first.scope == "prism.requestlog"
    assert first.resource["service.name"] == "prism-origin"
    assert first.resource["service.version"] == "r42"
    assert first.time_ns == int(THURSDAY * 1e9)
    assert first.severity_number == INFO and first.severity_text == "INFO"
    assert first.attributes == {
        "prism.request.id": f"{run}-0", "prism.source": "origin", "prism.project": "acme",
        "prism.key.id": "k1", "prism.api": "chat", "gen_ai.operation.name": "chat",
        "http.request.method": "POST", "url.path": "/v1/chat/completions", "prism.stream": True,
        "gen_ai.request.model": "gpt-4o-mini", "gen_ai.response.model": "gpt-4o-mini-2024-07-18",
        "prism.provider": "openai", "prism.cache.layer": "miss", "http.response.status_code": 200,
        "gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 30,
        "prism.cost_usd": 0.000021, "prism.saved_usd": 0.0, "prism.ttfb_ms": 45.2,
        "prism.total_ms": 51.0, "cloud.region": "eu-west-1", "prism.fingerprint": f"{0:064x}",
    }  # fmt: skip
    assert first.body == {
        "attempts": [
            {"provider": "openai", "model": "gpt-4o-mini", "status": 200, "error": None, "ms": 41.5}
        ],
        "stages": {"auth": 0.1, "redis": 0.4},
    }
    limited, failed, with_body = found[f"{run}-7"], found[f"{run}-8"], found[f"{run}-9"]
    assert (
        limited.severity_number == WARN
        and limited.attributes["error.type"] == "rate_limit_exceeded"
    )
    assert failed.severity_number == ERROR
    assert failed.attributes["prism.providers"] == ["openai", "anthropic"]
    assert with_body.body["body"] == {"request": {"messages": []}, "response": {"choices": []}}
    assert with_body.attributes["prism.semantic.score"] == 0.91


class Colour(StrEnum):
    RED = "red"


class Level(IntEnum):
    HIGH = 3


def test_a_log_record_is_otlps_json_mapping_for_every_kind_of_value() -> None:
    found = {
        "ts": 1.5, "id": 'say "hi"\n\u00e9\U0001f600', "status": 503, "stream": False,
        "score": float("nan"), "tokens_in": 2**63 - 1, "error": None, "providers": [],
        "body": {"request": {"messages": [{"role": "user", "content": "x"}, None]},
                 "flags": [True, 1.25, Colour.RED, Level.HIGH, ("a",)], "gone": None},
    }  # fmt: skip
    log = orjson.loads(log_record(found, b'"7"'))
    assert log == {
        "timeUnixNano": "1500000000", "observedTimeUnixNano": "7",
        "severityNumber": 17, "severityText": "ERROR", "eventName": "prism.request",
        "attributes": [
            {"key": "prism.request.id", "value": {"stringValue": 'say "hi"\n\u00e9\U0001f600'}},
            {"key": "http.response.status_code", "value": {"intValue": "503"}},
            {"key": "prism.stream", "value": {"boolValue": False}},
            {"key": "prism.semantic.score", "value": {"doubleValue": None}},
            {"key": "gen_ai.usage.input_tokens", "value": {"intValue": str(2**63 - 1)}},
            {"key": "prism.providers", "value": {"arrayValue": {"values": []}}},
        ],
        "body": {"kvlistValue": {"values": [{"key": "body", "value": {"kvlistValue": {"values": [
            {"key": "request", "value": {"kvlistValue": {"values": [
                {"key": "messages", "value": {"arrayValue": {"values": [
                    {"kvlistValue": {"values": [
                        {"key": "role", "value": {"stringValue": "user"}},
                        {"key": "content", "value": {"stringValue": "x"}},
                    ]}},
                ]}}},
            ]}}},
            {"key": "flags", "value": {"arrayValue": {"values": [
                {"boolValue": True}, {"doubleValue": 1.25}, {"stringValue": "red"},
                {"intValue": "3"}, {"arrayValue": {"values": [{"stringValue": "a"}]}},
            ]}}},
            {"key": "gone"},  # a None: a key with no value
        ]}}}]}},
    }  # fmt: skip
    # No time of its own: the observed one; no attributes, an empty list.
    assert orjson.loads(log_record({"ts": None}, b'"7"'))["timeUnixNano"] == "7"
    assert orjson.loads(log_record({}, b'"7"'))["attributes"] == []


def test_a_collector_that_is_down_raises() -> None:
    sink = OTLPLogSink(f"http://127.0.0.1:{free_port()}", "prism-origin", "dev", timeout=1.0)
    with pytest.raises(OTLPExportError, match="did not take 1 request log records"):
        asyncio.run(sink.write(lines([record(1)])))
    asyncio.run(sink.close())


def test_an_otlp_endpoint_adds_the_logs_sink_and_none_adds_none() -> None:
    env = origin_env("redis://127.0.0.1:1/0", "http://127.0.0.1:1")
    assert durable_sinks(Settings.from_env(env)) == []
    with_both = durable_sinks(
        Settings.from_env(
            {**env, "PRISM_OTEL_ENDPOINT": "http://127.0.0.1:1", "PRISM_LOG_DIR": "/tmp/x"}
        )
    )
    assert [sink.name for sink in with_both] == ["files", "otlp"]
