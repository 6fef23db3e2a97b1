"""A local stand-in for Globalping's HTTP API, answering in its format, for tests.

``POST /v1/measurements`` (type ``http`` only) checks the request as the API does (the
method one of GET, HEAD, OPTIONS; ``Host`` and ``User-Agent`` not the caller's), picks
a probe per location (``magic`` matched against a city, country or continent of a small
table, or another measurement's id for the same probes), answers 202 with the id, and
runs the request itself in the background against the target; ``GET
/v1/measurements/{id}`` says ``in-progress`` until every test has finished. Each probe
tells the local Workers runtime its PoP's location (the ``MF-CF-Blob`` header it reads
``request.cf`` from), as Cloudflare would for a client in that city. With a token set,
a request without it gets Globalping's 401.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import httpx

__all__ = ["PROBES", "GlobalpingStandIn"]

_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_RESERVED = frozenset({"host", "user-agent"})

# The probes: where each is, and its PoP's request.cf.
PROBES: tuple[dict[str, Any], ...] = (
    {"continent": "AS", "region": "South-eastern Asia", "country": "SG", "city": "Singapore",
     "asn": 64501, "network": "Probe Net SG", "colo": "SIN", "latitude": 1.29, "longitude": 103.85},
    {"continent": "NA", "region": "Northern America", "country": "US", "city": "San Francisco",
     "asn": 64502, "network": "Probe Net US", "colo": "SFO", "latitude": 37.77,
     "longitude": -122.42},
    {"continent": "AS", "region": "Southern Asia", "country": "IN", "city": "Mumbai",
     "asn": 64503, "network": "Probe Net IN", "colo": "BOM", "latitude": 19.08, "longitude": 72.88},
    {"continent": "EU", "region": "Western Europe", "country": "DE", "city": "Frankfurt",
     "asn": 64504, "network": "Probe Net DE", "colo": "FRA", "latitude": 50.11, "longitude": 8.68},
)  # fmt: skip
_NAMES = {"SG": "Singapore", "US": "United States", "IN": "India", "DE": "Germany"}


def _matches(probe: Mapping[str, Any], magic: str) -> bool:
    wanted = magic.strip().lower()
    names = (probe["city"], probe["country"], _NAMES[probe["country"]], probe["continent"])
    return any(wanted == str(name).lower() for name in names)


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"error": {"type": kind, "message": message}}


class _Measurement:
    def __init__(self, request: Mapping[str, Any], probes: list[dict[str, Any]]) -> None:
        self.id = secrets.token_urlsafe(12)
        self.request = request
        self.probes = probes
        self.created = datetime.now(UTC).isoformat()
        self.results: list[dict[str, Any] | None] = [None] * len(probes)

    def to_dict(self) -> dict[str, Any]:
        done = all(result is not None for result in self.results)
        in_progress = {"status": "in-progress", "rawOutput": ""}
        return {
            "id": self.id,
            "type": self.request["type"],
            "target": self.request["target"],
            "status": "finished" if done else "in-progress",
            "createdAt": self.created,
            "updatedAt": datetime.now(UTC).isoformat(),
            "probesCount": len(self.probes),
            "measurementOptions": self.request.get("measurementOptions", {}),
            "results": [
                {
                    "probe": {k: v for k, v in probe.items() if k != "colo"}
                    | {"state": None, "tags": [], "resolvers": ["private"]},
                    "result": result or in_progress,
                }
                for probe, result in zip(self.probes, self.results, strict=True)
            ],
        }


def _run_test(target: str, options: Mapping[str, Any], probe: Mapping[str, Any]) -> dict[str, Any]:
    """One HTTP test as a probe in ``probe``'s city would run it."""
    request = options.get("request") or {}
    scheme = "https" if options.get("protocol", "HTTPS") in ("HTTPS", "HTTP2") else "http"
    port = options.get("port") or (443 if scheme == "https" else 80)
    url = f"{scheme}://{target}:{port}{request.get('path', '/')}"
    if request.get("query"):
        url += "?" + request["query"]
    cf = {"continent": probe["continent"], "country": probe["country"], "colo": probe["colo"]}
    headers = {**request.get("headers", {}), "mf-cf-blob": json.dumps(cf)}
    marks: dict[str, float] = {}

    def trace(event: str, info: Mapping[str, Any]) -> None:
        marks[event] = time.perf_counter()

    started = time.perf_counter()
    try:
        with httpx.Client(timeout=10) as client:
            response = client.request(
                request.get("method", "GET"), url, headers=headers, extensions={"trace": trace}
            )
    except httpx.HTTPError as error:
        return {"status": "failed", "rawOutput": f"{type(error).__name__}: {error}"}
    ended = time.perf_counter()

    def between(start: str, end: str) -> int | None:
        if start in marks and end in marks:
            return round((marks[end] - marks[start]) * 1000)
        return None

    first_byte = between(
        "http11.send_request_body.complete", "http11.receive_response_headers.complete"
    )
    download = between(
        "http11.receive_response_headers.complete", "http11.receive_response_body.complete"
    )
    body = response.text
    raw_headers = "\n".join(f"{k}: {v}" for k, v in response.headers.multi_items())
    return {
        "status": "finished",
        "rawOutput": f"HTTP/1.1 {response.status_code}\n{raw_headers}\n\n{body[:10_000]}",
        "rawHeaders": raw_headers,
        "rawBody": body[:10_000] or None,
        "truncated": len(body) > 10_000,
        "headers": dict(response.headers),
        "statusCode": response.status_code,
        "statusCodeName": HTTPStatus(response.status_code).phrase,
        "resolvedAddress": target,
        "timings": {
            "total": round((ended - started) * 1000),
            "dns": 0,
            "tcp": between("connection.connect_tcp.started", "connection.connect_tcp.complete"),
            "tls": between("connection.start_tls.started", "connection.start_tls.complete"),
            "firstByte": first_byte,
            "download": download,
        },
        "tls": None,
    }  # fmt: skip


class GlobalpingStandIn:
    """``with GlobalpingStandIn(token="t") as api: ...api.url...``"""

    def __init__(self, token: str | None = None, host: str = "127.0.0.1") -> None:
        self.token = token
        self.measurements: dict[str, _Measurement] = {}
        self.created = 0  # measurements accepted
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                stand_in._post(self)

            def do_GET(self) -> None:
                stand_in._get(self)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def _reply(self, handler: BaseHTTPRequestHandler, status: int, body: Any, **extra: str) -> None:
        data = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(data)))
        for name, value in extra.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(data)

    def _authorized(self, handler: BaseHTTPRequestHandler) -> bool:
        if self.token is None:
            return True
        if handler.headers.get("authorization") == f"Bearer {self.token}":
            return True
        self._reply(handler, 401, _error("unauthorized", "Invalid or missing token."))
        return False

    def _post(self, handler: BaseHTTPRequestHandler) -> None:
        if handler.path != "/v1/measurements":
            self._reply(handler, 404, _error("not_found", "Not found."))
            return
        if not self._authorized(handler):
            return
        try:
            request = json.loads(handler.rfile.read(int(handler.headers["content-length"])))
            probes = self._validated(request)
        except (ValueError, KeyError, TypeError) as error:
            self._reply(handler, 400, _error("validation_error", str(error)))
            return
        if not probes:
            self._reply(handler, 422, _error("no_probes_found", "No suitable probes found."))
            return
        measurement = _Measurement(request, probes)
        self.measurements[measurement.id] = measurement
        self.created += 1
        for index, probe in enumerate(probes):
            threading.Thread(
                target=self._test, args=(measurement, index, probe), daemon=True
            ).start()
        self._reply(
            handler,
            202,
            {"id": measurement.id, "probesCount": len(probes)},
            location=f"{self.url}/v1/measurements/{measurement.id}",
        )

    def _validated(self, request: Mapping[str, Any]) -> list[dict[str, Any]]:
        if request.get("type") != "http":
            raise ValueError('"type" must be http here (the stand-in runs HTTP tests only)')
        if not isinstance(request.get("target"), str) or not request["target"]:
            raise ValueError('"target" is required')
        options = request.get("measurementOptions") or {}
        asked = options.get("request") or {}
        if asked.get("method", "GET") not in _METHODS:
            raise ValueError(
                '"measurementOptions.request.method" must be one of [HEAD, GET, OPTIONS]'
            )
        if any(name.lower() in _RESERVED for name in asked.get("headers", {})):
            raise ValueError("the Host and User-Agent headers are reserved")
        locations = request.get("locations") or [{"magic": "world", "limit": 1}]
        if isinstance(locations, str):  # the same probes as an earlier measurement
            return list(self.measurements[locations].probes)
        chosen: list[dict[str, Any]] = []
        for location in locations:
            magic = str(location.get("magic", ""))
            found = [p for p in PROBES if magic.lower() == "world" or _matches(p, magic)]
            chosen += found[: int(location.get("limit", 1))]
        return chosen

    def _test(self, measurement: _Measurement, index: int, probe: Mapping[str, Any]) -> None:
        options = measurement.request.get("measurementOptions") or {}
        measurement.results[index] = _run_test(measurement.request["target"], options, probe)

    def _get(self, handler: BaseHTTPRequestHandler) -> None:
        prefix = "/v1/measurements/"
        measurement = self.measurements.get(handler.path.removeprefix(prefix))
        if not handler.path.startswith(prefix) or measurement is None:
            self._reply(
                handler, 404, _error("not_found", "Couldn't find the requested measurement.")
            )
            return
        self._reply(handler, 200, measurement.to_dict())

    def start(self) -> GlobalpingStandIn:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> GlobalpingStandIn:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
