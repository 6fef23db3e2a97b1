"""Sequential probes: time to first byte of streams, and one-request checks.

wrk cannot see when the first byte of a body arrives, so streaming is measured
here with the small HTTP/1.1 client: one keep-alive connection per target,
requests sent one at a time, targets interleaved round-robin so a burst of
load from elsewhere on the machine hits every target alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .http1 import Connection, build_request, split_url
from .loadgen import UNIQUE, percentile

__all__ = ["StreamTarget", "measure_ttfb"]


@dataclass(frozen=True, slots=True)
class StreamTarget:
    name: str
    url: str
    headers: Mapping[str, str]


def _summary(
    ttfb: list[float], total: list[float], layers: set[str], errors: int
) -> dict[str, Any]:
    ttfb, total = sorted(ttfb), sorted(total)
    return {
        "requests": len(ttfb),
        "errors": errors,
        "ttfb_p50_ms": round(percentile(ttfb, 50), 3),
        "ttfb_p90_ms": round(percentile(ttfb, 90), 3),
        "ttfb_p99_ms": round(percentile(ttfb, 99), 3),
        "total_p50_ms": round(percentile(total, 50), 3),
        "layers": sorted(layers),
    }


async def _measure(
    targets: Sequence[StreamTarget], body: str, count: int, nonce: str
) -> dict[str, dict[str, Any]]:
    conns: dict[str, Connection] = {}
    ttfb: dict[str, list[float]] = {t.name: [] for t in targets}
    total: dict[str, list[float]] = {t.name: [] for t in targets}
    layers: dict[str, set[str]] = {t.name: set() for t in targets}
    errors = dict.fromkeys(ttfb, 0)
    try:
        for target in targets:
            host, port, _ = split_url(target.url)
            conns[target.name] = await Connection.open(host, port)
        for i in range(count):
            for target in targets:
                host, port, path = split_url(target.url)
                data = body.replace(UNIQUE, f"{nonce}-{target.name}-{i}").encode()
                raw = build_request("POST", host, port, path, dict(target.headers), data)
                started = time.perf_counter()
                reply = await conns[target.name].send(raw)
                done = time.perf_counter()
                if reply.status != 200 or b"data: [DONE]" not in reply.body:
                    errors[target.name] += 1
                    continue
                ttfb[target.name].append((reply.first_body_at - started) * 1000)
                total[target.name].append((done - started) * 1000)
                layers[target.name].add(reply.headers.get("x-prism-edge-cache-layer", "-"))
    finally:
        for conn in conns.values():
            with contextlib.suppress(OSError):
                await conn.close()
    return {name: _summary(ttfb[name], total[name], layers[name], errors[name]) for name in ttfb}


def measure_ttfb(
    targets: Sequence[StreamTarget], body: str, count: int, nonce: str
) -> dict[str, dict[str, Any]]:
    """Per target: p50/p90/p99 time to the first body byte of ``count`` streamed requests."""
    return asyncio.run(_measure(targets, body, count, nonce))
