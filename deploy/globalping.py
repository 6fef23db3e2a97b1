"""Globalping's HTTP API: measurements from probes in other places, for `prism smoke --from`.

The API (https://api.globalping.io): ``POST /v1/measurements`` with ``{"type": "http",
"target": host, "locations": [{"magic": "Singapore", "limit": 1}], "measurementOptions":
{"protocol": "HTTPS", "port": 443, "request": {"method": "GET", "path": ..., "headers":
{...}}}}`` answers 202 with ``{"id", "probesCount"}``; ``GET /v1/measurements/{id}`` is
polled until ``status`` is no longer ``in-progress``. Each result holds the probe's place
and the test's ``statusCode``, ``headers`` and ``timings`` (``total``, ``dns``, ``tcp``,
``tls``, ``firstByte``, ``download``, in ms). A token (``Authorization: Bearer``) raises
the hourly limit; it is optional.

What a probe can send: only ``GET``, ``HEAD`` or ``OPTIONS``, with headers of its own
(``Host`` and ``User-Agent`` are the API's) and no body. The chat smoke (a POST) cannot
run from a probe, so each region asks what a GET can show, three times:

- ``edge``: ``GET /v1/models`` with no key: refused by the PoP alone (no KV, no origin);
  the distance to the nearest PoP.
- ``kv``: ``GET /v1/models`` with the key: checked at the PoP (signature, revocation
  list) and answered from Workers KV there, as a KV hit is.
- ``origin``: the same with ``cache-control: no-cache``: forwarded to the nearest origin,
  which checks the key and revocation in its Redis: a Redis hit's path, one PoP-origin
  round trip (``x-prism-origin-region`` names the origin).

The key travels to the probes in a request header, and Globalping returns a
measurement's options to whoever asks for it by id: use a key made for the smoke and
revoke it afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from prism import headers as h

__all__ = [
    "GLOBALPING_API",
    "GlobalpingClient",
    "GlobalpingError",
    "ProbeRequest",
    "RegionResult",
    "row_of",
    "smoke_from",
]

GLOBALPING_API = "https://api.globalping.io"
_MODELS = "/v1/models"
_LAYER = "x-prism-edge-cache-layer"


class GlobalpingError(RuntimeError):
    """The API refused or failed; said in one line (never with the token)."""


@dataclass(frozen=True, slots=True)
class ProbeRequest:
    name: str  # edge | kv | origin
    headers: Mapping[str, str]
    expect: int  # the status that says this path works


@dataclass
class RegionResult:
    asked: str  # the location as given (--from)
    probe: str = ""  # where the probe was: "Singapore, SG (AS123 Network)"
    rows: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.rows) and all(row["ok"] for row in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "from": self.asked,
            "probe": self.probe,
            "ok": self.ok,
            "error": self.error,
            "requests": self.rows,
        }


class GlobalpingClient:
    def __init__(
        self, api_url: str = GLOBALPING_API, token: str | None = None, timeout: float = 30
    ) -> None:
        headers = {"accept": "application/json"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        self.http = httpx.Client(base_url=api_url.rstrip("/"), headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def create(self, measurement: Mapping[str, Any]) -> str:
        """A new measurement's id."""
        response = self.http.post("/v1/measurements", json=dict(measurement))
        if response.status_code != 202:
            raise GlobalpingError(f"creating a measurement: {_api_error(response)}")
        return str(response.json()["id"])

    def wait(self, measurement_id: str, timeout: float = 60, interval: float = 0.5) -> Any:
        """The measurement once finished (polled; Globalping asks for no faster than this)."""
        deadline = time.monotonic() + timeout
        while True:
            response = self.http.get(f"/v1/measurements/{measurement_id}")
            if response.status_code != 200:
                raise GlobalpingError(
                    f"reading measurement {measurement_id}: {_api_error(response)}"
                )
            found = response.json()
            if found.get("status") != "in-progress":
                return found
            if time.monotonic() > deadline:
                raise GlobalpingError(
                    f"measurement {measurement_id} unfinished after {timeout:g} s"
                )
            time.sleep(interval)  # the API's own pace: polled, with a deadline


def _api_error(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", {})
        return f"{response.status_code} {error.get('type', '')}: {error.get('message', '')}"[:300]
    except ValueError:
        return f"{response.status_code} {response.text[:200]}"


def _probe_requests(key: str) -> tuple[ProbeRequest, ...]:
    keyed = {"authorization": f"Bearer {key}"}
    return (
        ProbeRequest("edge", {}, 401),
        ProbeRequest("kv", keyed, 200),
        ProbeRequest("origin", {**keyed, "cache-control": "no-cache"}, 200),
    )


def _measurement(url: str, probe: ProbeRequest, locations: Any) -> dict[str, Any]:
    parts = urlsplit(url)
    secure = parts.scheme == "https"
    if parts.hostname is None:
        raise GlobalpingError(f"not a URL: {url[:80]!r}")
    return {
        "type": "http",
        "target": parts.hostname,
        "locations": locations,
        "measurementOptions": {
            "protocol": "HTTPS" if secure else "HTTP",
            "port": parts.port or (443 if secure else 80),
            "request": {
                "method": "GET",
                "path": parts.path.rstrip("/") + _MODELS,
                "headers": dict(probe.headers),
            },
        },
    }


def _header(headers: Mapping[str, Any], name: str) -> str:
    for key, value in headers.items():
        if key.lower() == name:
            return ", ".join(value) if isinstance(value, list) else str(value)
    return ""


def row_of(probe: ProbeRequest, result: Mapping[str, Any]) -> dict[str, Any]:
    """One test's result (Globalping's format) as a row of the region's table."""
    status = result.get("statusCode")
    headers = result.get("headers") or {}
    timings = result.get("timings") or {}
    ray = _header(headers, "cf-ray")
    return {
        "request": probe.name,
        "status": status,
        "expected": probe.expect,
        "ok": result.get("status") == "finished" and status == probe.expect,
        "first_byte_ms": timings.get("firstByte"),
        "total_ms": timings.get("total"),
        "tcp_ms": timings.get("tcp"),
        "tls_ms": timings.get("tls"),
        "pop": ray.rpartition("-")[2] if "-" in ray else "",
        "origin_region": _header(headers, h.ORIGIN_REGION) or None,
        "layer": _header(headers, _LAYER) or None,
        "server_timing": _header(headers, "server-timing"),
        "failure": None if result.get("status") == "finished" else result.get("rawOutput"),
    }


def _place(probe: Mapping[str, Any]) -> str:
    where = ", ".join(str(probe[k]) for k in ("city", "country") if probe.get(k))
    network = f" (AS{probe['asn']} {probe.get('network', '')})".rstrip() if probe.get("asn") else ""
    return where + network


def smoke_from(
    client: GlobalpingClient, url: str, key: str, regions: Sequence[str], timeout: float = 60
) -> list[RegionResult]:
    """Per region, the three GETs from one probe there (the same probe for all three)."""
    results: list[RegionResult] = []
    for asked in regions:
        region = RegionResult(asked)
        results.append(region)
        try:
            first: str | None = None
            for probe in _probe_requests(key):
                # The first picks a probe; the others reuse it by the first's id.
                locations = first or [{"magic": asked, "limit": 1}]
                measurement_id = client.create(_measurement(url, probe, locations))
                first = first or measurement_id
                found = client.wait(measurement_id, timeout)
                items = found.get("results") or []
                if not items:
                    raise GlobalpingError(f"no probe found for {asked!r}")
                region.probe = region.probe or _place(items[0].get("probe") or {})
                region.rows.append(row_of(probe, items[0].get("result") or {}))
        except (GlobalpingError, httpx.HTTPError, ValueError, KeyError) as error:
            region.error = (
                str(error) if isinstance(error, GlobalpingError) else type(error).__name__
            )
    return results
