"""The request log as OpenTelemetry log records, exported over OTLP/HTTP ({endpoint}/v1/logs).

Built only when an OTLP endpoint is configured (``PRISM_OTEL_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_ENDPOINT``, as for traces and metrics, origin/http/telemetry.py).
One log record per request, event ``prism.request``, at the time of the request (``ts``),
severity INFO, WARN for a 4xx and ERROR for a 5xx. Its attributes are the record's scalar
fields, named after the semantic conventions where one fits (``gen_ai.request.model``,
``gen_ai.usage.input_tokens``, ``http.response.status_code``, ``error.type``,
``cloud.region``, ...) and ``prism.<field>`` otherwise; the nested ones (``attempts``,
``stages``, ``providers``, ``body``), which attributes cannot hold, are the log record's
body, a map.

A batch is sent as OTLP's JSON encoding (``application/json``, which every collector takes
beside protobuf), made here from the records with orjson: through the SDK's objects and its
protobuf encoder a record cost ~50 us of the origin's CPU, as JSON ~5x less, and the
records are already JSON-shaped. ``write`` returns once the collector has accepted the
whole batch, or raises, and the request log's buffer sends it again (the SDK's batching
processor would drop what it cannot send).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import orjson

from .record import ENCODED

__all__ = ["ATTRIBUTES", "EVENT", "OTLPExportError", "OTLPLogSink", "log_record"]

EVENT = "prism.request"
_SCOPE = "prism.requestlog"
# A record's field -> its attribute (the others: "prism.<field>"; "ts" is the timestamp).
ATTRIBUTES = {
    "id": "prism.request.id",
    "key": "prism.key.id",
    "method": "http.request.method",
    "path": "url.path",
    "status": "http.response.status_code",
    "error": "error.type",
    "model": "gen_ai.request.model",
    "answered_model": "gen_ai.response.model",
    "tokens_in": "gen_ai.usage.input_tokens",
    "tokens_out": "gen_ai.usage.output_tokens",
    "layer": "prism.cache.layer",
    "score": "prism.semantic.score",
    "region": "cloud.region",
    "pop": "prism.edge.pop",
}
_OPERATIONS = {"embeddings": "embeddings"}  # the record's api -> gen_ai.operation.name


class OTLPExportError(RuntimeError):
    """The collector did not take the batch (down, refused it, or too slow)."""


_INFO, _WARN, _ERROR = 9, 13, 17  # opentelemetry.proto.logs.v1.SeverityNumber


def _severity(status: Any) -> tuple[int, str]:
    if isinstance(status, int) and status >= 500:
        return _ERROR, "ERROR"
    if isinstance(status, int) and status >= 400:
        return _WARN, "WARN"
    return _INFO, "INFO"


def _value(value: Any) -> dict[str, Any]:
    """An AnyValue in OTLP's JSON mapping (64-bit integers as strings)."""
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, Mapping):
        return {"kvlistValue": {"values": _pairs(value)}}
    if isinstance(value, list | tuple):
        return {"arrayValue": {"values": [_value(item) for item in value if item is not None]}}
    return {"stringValue": str(value)}


def _pairs(mapping: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A map's pairs; a None is a key without a value (collectors refuse an empty one)."""
    return [
        {"key": key} if value is None else {"key": key, "value": _value(value)}
        for key, value in mapping.items()
    ]


def _attribute_name(field: str) -> str:
    name = _NAMES.get(field)
    if name is None:
        name = _NAMES[field] = ATTRIBUTES.get(field) or f"prism.{field}"
    return name


_NAMES: dict[str, str] = {}  # a field's attribute name, once made


def log_record(record: Mapping[str, Any], observed_ns: int) -> dict[str, Any]:
    """The request's OpenTelemetry log record, in OTLP's JSON mapping."""
    attributes: list[dict[str, Any]] = []
    body: dict[str, Any] = {}
    add = attributes.append
    for field, value in record.items():
        kind = type(value)  # the record's own values: no subclasses (one test per type)
        if field == "ts" or field == ENCODED:  # the log record's own time; the JSON
            continue
        if kind is str:
            add({"key": _attribute_name(field), "value": {"stringValue": value}})
        elif kind is float:
            add({"key": _attribute_name(field), "value": {"doubleValue": value}})
        elif kind is int:
            add({"key": _attribute_name(field), "value": {"intValue": str(value)}})
        elif kind is bool:
            add({"key": _attribute_name(field), "value": {"boolValue": value}})
        elif value is None:
            continue
        elif kind is list and all(type(item) is str for item in value):
            add({"key": f"prism.{field}", "value": _value(value)})  # "providers"
        else:
            body[field] = value
    api = record.get("api")
    if api is not None:
        operation = _OPERATIONS.get(api, "chat")
        add({"key": "gen_ai.operation.name", "value": {"stringValue": operation}})
    severity, severity_text = _severity(record.get("status"))
    ts = record.get("ts")
    log: dict[str, Any] = {
        "timeUnixNano": str(int(ts * 1e9) if isinstance(ts, int | float) else observed_ns),
        "observedTimeUnixNano": str(observed_ns),
        "severityNumber": severity,
        "severityText": severity_text,
        "attributes": attributes,
        "eventName": EVENT,
    }
    if body:
        log["body"] = _value(body)
    return log


class OTLPLogSink:
    """A ``RecordSink`` (``origin.requestlog.sink``) exporting to an OTLP/HTTP collector."""

    name = "otlp"

    def __init__(
        self, endpoint: str, service_name: str, release: str, timeout: float = 5.0
    ) -> None:
        self._url = f"{endpoint.rstrip('/')}/v1/logs"
        # Never the environment's proxies: the collector is the one configured.
        self._client = httpx.Client(timeout=timeout, trust_env=False)
        resource = {"service.name": service_name, "service.version": release}
        self._resource = {"attributes": _pairs(resource)}

    async def write(self, records: Sequence[Mapping[str, Any]]) -> None:
        if records:
            await asyncio.to_thread(self._export, list(records))

    def _export(self, records: list[Mapping[str, Any]]) -> None:
        now = time.time_ns()
        request = {
            "resourceLogs": [
                {
                    "resource": self._resource,
                    "scopeLogs": [
                        {
                            "scope": {"name": _SCOPE},
                            "logRecords": [log_record(record, now) for record in records],
                        }
                    ],
                }
            ]
        }
        try:
            reply = self._client.post(
                self._url,
                content=orjson.dumps(request),
                headers={"content-type": "application/json"},
            )
        except httpx.HTTPError as error:
            raise OTLPExportError(
                f"the collector did not take {len(records)} request log records ({error!r})"
            ) from None
        if not reply.is_success:
            raise OTLPExportError(
                f"the collector did not take {len(records)} request log records"
                f" (HTTP {reply.status_code})"
            )

    async def close(self) -> None:
        await asyncio.to_thread(self._client.close)
