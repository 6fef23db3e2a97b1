"""The request log as OpenTelemetry log records, exported over OTLP/HTTP ({endpoint}/v1/logs).

Built only when an OTLP endpoint is configured (``PRISM_OTEL_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_ENDPOINT``, as for traces and metrics, origin/http/telemetry.py).
One log record per request, event ``prism.request``, at the time of the request (``ts``),
severity INFO, WARN for a 4xx and ERROR for a 5xx. Its attributes are the record's scalar
fields, named after the semantic conventions where one fits (``gen_ai.request.model``,
``gen_ai.usage.input_tokens``, ``http.response.status_code``, ``error.type``,
``cloud.region``, ...) and ``prism.<field>`` otherwise (a list of strings, ``providers``,
as an array); the nested ones (``attempts``, ``stages``, ``parts``, ``body``), which
attributes cannot hold, are the log record's body, a map.

A batch is sent as OTLP's JSON encoding (``application/json``, which every collector takes
beside protobuf): through the SDK's objects and its protobuf encoder a record cost ~50 us
of the origin's CPU. The JSON is written here as bytes, each record's from fragments made
once (a field's key, a repeating value's whole attribute) and values encoded by orjson,
and the module is compiled with the hot path: on 1,000 of a real origin's records (a
quarter misses) that is 47,000 instructions a record, against 181,000 when it built OTLP's
mapping as dicts (two an attribute) for orjson (81,000 as pure Python). ``write`` returns
once the collector has accepted the whole batch, or raises, and the request log's buffer
sends it again (the SDK's batching processor would drop what it cannot send).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

import httpx
import orjson
from mypy_extensions import mypyc_attr

from .record import Logged

__all__ = ["ATTRIBUTES", "EVENT", "OTLPExportError", "OTLPLogSink", "log_record"]

_dumps: Final = orjson.dumps  # a constant where compiled: no module lookup a value
EVENT: Final = "prism.request"
_SCOPE: Final = "prism.requestlog"
# A record's field -> its attribute (the others: "prism.<field>"; "ts" is the timestamp).
ATTRIBUTES: Final = {
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
_OPERATIONS: Final = {"embeddings": "embeddings"}  # the record's api -> gen_ai.operation.name


@mypyc_attr(native_class=False)  # compiled (setup.py): a native class cannot subclass it
class OTLPExportError(RuntimeError):
    """The collector did not take the batch (down, refused it, or too slow)."""


# opentelemetry.proto.logs.v1.SeverityNumber: INFO, WARN for a 4xx, ERROR for a 5xx.
_INFO: Final = b'"severityNumber":9,"severityText":"INFO"'
_WARN: Final = b'"severityNumber":13,"severityText":"WARN"'
_ERROR: Final = b'"severityNumber":17,"severityText":"ERROR"'


def _severity(status: Any) -> bytes:
    if type(status) is int and status >= 400:
        return _ERROR if status >= 500 else _WARN
    return _INFO


def _write_value(value: Any, out: list[bytes]) -> None:
    """An AnyValue in OTLP's JSON mapping (64-bit integers as strings), appended to
    ``out``; a map's None is a key without a value (collectors refuse an empty one), a
    list's is left out."""
    kind = type(value)
    if kind is str:
        out.append(b'{"stringValue":')
        out.append(_dumps(value))
        out.append(b"}")
    elif kind is float:
        out.append(b'{"doubleValue":')
        out.append(_dumps(value))
        out.append(b"}")
    elif kind is bool:
        out.append(b'{"boolValue":true}' if value else b'{"boolValue":false}')
    elif kind is int:
        out.append(b'{"intValue":"%d"}' % value)
    elif kind is dict or isinstance(value, Mapping):
        out.append(b'{"kvlistValue":{"values":[')
        comma = b""
        for key, item in value.items():
            out.append(comma)
            comma = b","
            if item is None:
                out.append(b'{"key":' + _dumps(key) + b"}")
            else:
                out.append(_KEYS.get(key) or _pair_start(key))
                _write_value(item, out)
                out.append(b"}")
        out.append(b"]}}")
    elif kind is list or isinstance(value, list | tuple):
        out.append(b'{"arrayValue":{"values":[')
        comma = b""
        for item in value:
            if item is not None:
                out.append(comma)
                comma = b","
                _write_value(item, out)
        out.append(b"]}}")
    else:  # a subclass of one of those kinds, as its base; anything else as its text
        base = next((base for base in (str, int, float) if isinstance(value, base)), str)
        _write_value(base(value), out)


_KEYS: Final[dict[str, bytes]] = {}  # a map's key's start of a pair: '{"key":KEY,"value":'
_KEYS_AT_MOST: Final = 1_000  # keys of bodies' maps are the client's: beyond, made each time


def _pair_start(key: str) -> bytes:
    start = b'{"key":' + orjson.dumps(key) + b',"value":'
    if len(_KEYS) < _KEYS_AT_MOST:
        _KEYS[key] = start
    return start


def _pairs(mapping: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A map's pairs in OTLP's JSON mapping, for orjson (the resource's: strings)."""
    return [{"key": key, "value": {"stringValue": value}} for key, value in mapping.items()]


# A log record is written as JSON fragments joined once, not as OTLP's mapping of dicts
# for orjson (two dicts an attribute, ~40 a record). An attribute is its start (its comma,
# its key, its kind of value), the value's JSON, and its end; a field whose values repeat
# from request to request (methods, paths, models, projects, ...) has each value's whole
# attribute made once. A record's fragments are joined at its end: kept for the whole
# batch, ~60 a record, they cost twice as much (memory not reused while still warm).
_REPEATING: Final = frozenset(
    {"source", "method", "path", "layer", "api", "project", "key", "model", "answered_model",
     "provider", "region", "pop", "error"}
)  # fmt: skip
_MADE_AT_MOST: Final = 1_000  # a field's repeating values' attributes kept: beyond, made each time
_STRING_END: Final = b"}}"
_INT_END: Final = b'"}}'


class _Attribute:
    """One field's attribute: the JSON before its value, for each kind of value."""

    __slots__ = ("boolean", "double", "integer", "made", "repeating", "string")

    def __init__(self, name: str, repeating: bool) -> None:
        start = b',{"key":' + orjson.dumps(name) + b',"value":{"'
        self.string = start + b'stringValue":'
        self.integer = start + b'intValue":"'
        self.double = start + b'doubleValue":'
        self.boolean = start + b'boolValue":'
        self.repeating = repeating
        self.made: dict[str, bytes] = {}  # a repeating field's values' whole attributes


_FIELDS: Final[dict[str, _Attribute]] = {}  # a field's attribute, once made


def _attribute(field: str) -> _Attribute:
    found = _FIELDS.get(field)
    if found is None:
        name = ATTRIBUTES.get(field) or f"prism.{field}"
        found = _FIELDS[field] = _Attribute(name, field in _REPEATING)
    return found


_OPERATION: Final = _Attribute("gen_ai.operation.name", False)
_RECORD_HEAD: Final = b',"eventName":' + orjson.dumps(EVENT) + b',"attributes":['


def log_record(record: Mapping[str, Any], observed: bytes) -> bytes:
    """The request's OpenTelemetry log record in OTLP's JSON (``observed``: the time it
    was observed, nanoseconds, as a JSON string)."""
    ts = record.get("ts")
    out = [b'{"timeUnixNano":"']
    out.append(b"%d" % int(ts * 1e9) if type(ts) is float or type(ts) is int else observed[1:-1])
    out.append(b'","observedTimeUnixNano":')
    out.append(observed)
    out.append(b",")
    out.append(_severity(record.get("status")))
    out.append(_RECORD_HEAD)
    first = len(out)
    body: dict[str, Any] | None = None
    for field, value in record.items():
        kind = type(value)  # the record's own values: no subclasses (one test per type)
        if kind is str:
            attribute = _FIELDS.get(field) or _attribute(field)
            if not attribute.repeating:
                out.append(attribute.string)
                out.append(_dumps(value))
                out.append(_STRING_END)
                continue
            made = attribute.made.get(value)
            if made is None:
                made = attribute.string + _dumps(value) + _STRING_END
                if len(attribute.made) < _MADE_AT_MOST:
                    attribute.made[value] = made
            out.append(made)
        elif kind is float:
            if field == "ts":  # the log record's own time
                continue
            out.append((_FIELDS.get(field) or _attribute(field)).double)
            out.append(_dumps(value))
            out.append(_STRING_END)
        elif kind is int:
            if field == "ts":
                continue
            out.append((_FIELDS.get(field) or _attribute(field)).integer)
            out.append(b"%d" % value)
            out.append(_INT_END)
        elif kind is bool:
            out.append((_FIELDS.get(field) or _attribute(field)).boolean)
            out.append(b"true}}" if value else b"false}}")
        elif value is None:
            continue
        elif kind is list and all(type(item) is str for item in value):
            out.append(b',{"key":' + _dumps(f"prism.{field}") + b',"value":')  # "providers"
            _write_value(value, out)
            out.append(b"}")
        else:
            if body is None:
                body = {}
            body[field] = value
    api = record.get("api")
    if api is not None:
        out.append(_OPERATION.string)
        out.append(_dumps(_OPERATIONS.get(api, "chat")))
        out.append(_STRING_END)
    if len(out) > first:
        out[first] = out[first][1:]  # the first attribute's comma
    if body is None:
        out.append(b"]}")
    else:
        out.append(b'],"body":')
        _write_value(body, out)
        out.append(b"}")
    return b"".join(out)


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
        scope = {"resource": {"attributes": _pairs(resource)}, "scope": {"name": _SCOPE}}
        # The request around the batch's log records: {"resourceLogs":[{"resource":...,
        # "scopeLogs":[{"scope":...,"logRecords":[ and its end.
        head = orjson.dumps({"resourceLogs": [{"resource": scope["resource"], "scopeLogs": [
            {"scope": scope["scope"], "logRecords": []}]}]})  # fmt: skip
        self._head, self._tail = head[: -len(b"]}]}]}")], b"]}]}]}"

    async def write(self, records: Sequence[Logged]) -> None:
        if records:
            await asyncio.to_thread(self._export, list(records))

    def _export(self, records: list[Logged]) -> None:
        content = self._body(records, time.time_ns())
        try:
            reply = self._client.post(
                self._url,
                content=content,
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

    def _body(self, records: Sequence[Logged], observed_ns: int) -> bytes:
        """The export request for ``records`` (observed now, ``observed_ns``), as JSON; each
        record's fields read back from its JSON (here, in the export's thread: the buffers
        hold the JSON alone)."""
        observed = b'"%d"' % observed_ns
        logs = b",".join([log_record(orjson.loads(line), observed) for line, _, _, _ in records])
        return b"".join((self._head, logs, self._tail))

    async def close(self) -> None:
        await asyncio.to_thread(self._client.close)
