"""The request log as OpenTelemetry log records, exported over OTLP/HTTP ({endpoint}/v1/logs).

Built only when an OTLP endpoint is configured (``PRISM_OTEL_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_ENDPOINT``, as for traces and metrics, origin/http/telemetry.py),
and it imports the SDK only then. One log record per request, event ``prism.request``,
at the time of the request (``ts``), severity INFO, WARN for a 4xx and ERROR for a 5xx.
Its attributes are the record's scalar fields, named after the semantic conventions where
one fits (``gen_ai.request.model``, ``gen_ai.usage.input_tokens``, ``http.response.status_code``,
``error.type``, ``cloud.region``, ...) and ``prism.<field>`` otherwise; the nested ones
(``attempts``, ``stages``, ``providers``, ``body``), which attributes cannot hold, are the
log record's body, a map.

The batch goes to the exporter directly, not through the SDK's batching processor (which
drops what it cannot send): ``write`` returns once the collector has accepted the whole
batch, or raises, and the request log's buffer sends it again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry._logs import LogRecord, SeverityNumber
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExportResult
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

__all__ = ["ATTRIBUTES", "EVENT", "OTLPExportError", "OTLPLogSink", "log_record"]

EVENT = "prism.request"
_SCOPE = InstrumentationScope("prism.requestlog")
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
_SCALARS = (str, bool, int, float)


class OTLPExportError(RuntimeError):
    """The collector did not take the batch (down, refused it, or too slow)."""


def _severity(status: Any) -> tuple[SeverityNumber, str]:
    if isinstance(status, int) and status >= 500:
        return SeverityNumber.ERROR, "ERROR"
    if isinstance(status, int) and status >= 400:
        return SeverityNumber.WARN, "WARN"
    return SeverityNumber.INFO, "INFO"


def log_record(record: Mapping[str, Any], observed_ns: int) -> LogRecord:
    """The request's OpenTelemetry log record."""
    attributes: dict[str, Any] = {}
    body: dict[str, Any] = {}
    for field, value in record.items():
        if value is None or field == "ts":
            continue
        if isinstance(value, _SCALARS):
            attributes[ATTRIBUTES.get(field) or f"prism.{field}"] = value
        elif isinstance(value, list) and all(isinstance(item, str) for item in value):
            attributes[f"prism.{field}"] = value  # "providers": a list attributes can hold
        else:
            body[field] = value
    api = record.get("api")
    if api is not None:
        attributes["gen_ai.operation.name"] = _OPERATIONS.get(api, "chat")
    severity, severity_text = _severity(record.get("status"))
    ts = record.get("ts")
    return LogRecord(
        timestamp=int(ts * 1e9) if isinstance(ts, int | float) else observed_ns,
        observed_timestamp=observed_ns,
        severity_number=severity,
        severity_text=severity_text,
        body=body or None,
        attributes=attributes,
        event_name=EVENT,
    )


class OTLPLogSink:
    """A ``RecordSink`` (``origin.requestlog.sink``) exporting to an OTLP/HTTP collector."""

    name = "otlp"

    def __init__(
        self, endpoint: str, service_name: str, release: str, timeout: float = 5.0
    ) -> None:
        self._exporter = OTLPLogExporter(
            endpoint=f"{endpoint.rstrip('/')}/v1/logs", timeout=timeout
        )
        self._resource = Resource.create({"service.name": service_name, "service.version": release})

    async def write(self, records: Sequence[Mapping[str, Any]]) -> None:
        if records:
            await asyncio.to_thread(self._export, list(records))

    def _export(self, records: list[Mapping[str, Any]]) -> None:
        now = time.time_ns()
        batch = [
            ReadableLogRecord(log_record(record, now), self._resource, _SCOPE) for record in records
        ]
        if self._exporter.export(batch) is not LogRecordExportResult.SUCCESS:
            raise OTLPExportError(f"the collector did not take {len(batch)} request log records")

    async def close(self) -> None:
        await asyncio.to_thread(self._exporter.shutdown)
