"""W3C trace context across the edge and the origin (docs/architecture.md "Observability").

The edge runs no tracing SDK. On a forward it starts its own span in name only: a fresh
span id, in the client's trace when the client sent a valid ``traceparent`` (a new trace
otherwise), sent to the origin as the ``traceparent`` the origin's spans hang under.
What that span did before the forward travels beside it: ``x-prism-edge-span`` (when it
started, and the client's span it continues) and ``x-prism-edge-timing`` (its stages, in
Server-Timing's format). An origin that exports traces turns these into the edge's span
with exactly that id, so the trace reads client → edge → origin → provider.

Standard library only (this runs in Pyodide too); nothing here is secret or trusted:
the values only shape telemetry, never an answer.
"""

from __future__ import annotations

import re
import secrets
from typing import NamedTuple

__all__ = [
    "EDGE_SPAN",
    "EDGE_TIMING",
    "TRACEPARENT",
    "EdgeSpan",
    "TraceParent",
    "edge_trace_headers",
    "parse_edge_span",
    "parse_stages",
    "parse_traceparent",
]

TRACEPARENT = "traceparent"
EDGE_SPAN = "x-prism-edge-span"  # start=<unix ms>[;parent=<client's span id>]
EDGE_TIMING = "x-prism-edge-timing"  # the edge's stages so far: "auth;dur=0.12, kv;dur=3.40"

# version 00: 32 hex trace id, 16 hex span id, 2 hex flags (later versions may add fields).
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_NO_TRACE, _NO_SPAN = "0" * 32, "0" * 16
_STAGE = re.compile(r"\s*([A-Za-z0-9_.-]+)[^,]*?;\s*dur=([0-9.]+)")


class TraceParent(NamedTuple):
    trace_id: str  # 32 lower-case hex digits
    span_id: str  # 16
    flags: str  # 2 ("01": sampled)

    def header(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"


class EdgeSpan(NamedTuple):
    """The edge's span as the origin rebuilds it."""

    start_ms: float  # unix milliseconds
    parent_span_id: str | None  # the client's span, when the client sent a traceparent
    stages: list[tuple[str, float]]  # (name, milliseconds), in order from the start


def parse_traceparent(value: str | None) -> TraceParent | None:
    """A valid ``traceparent`` (W3C Trace Context level 1), else None."""
    if not value or len(value) > 512:
        return None
    match = _TRACEPARENT.fullmatch(value.strip())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == _NO_TRACE:
        return None
    if span_id == _NO_SPAN:
        return None
    return TraceParent(trace_id, span_id, flags)


def edge_trace_headers(
    client_traceparent: str | None, now: float, stages: list[tuple[str, float]]
) -> dict[str, str]:
    """The headers the edge adds to a forward: its span's ``traceparent`` and what the
    origin needs to rebuild that span. ``now`` is the forward's time (unix seconds);
    the span started the stages' total before it (the Workers clock moves only with
    I/O, which the stages cover)."""
    client = parse_traceparent(client_traceparent)
    span_id = secrets.token_hex(8)
    if client is None:
        parent = TraceParent(secrets.token_hex(16), span_id, "01")
    else:
        parent = TraceParent(client.trace_id, span_id, client.flags)
    start_ms = now * 1000 - sum(ms for _, ms in stages)
    span = f"start={start_ms:.3f}"
    if client is not None:
        span += f";parent={client.span_id}"
    headers = {TRACEPARENT: parent.header(), EDGE_SPAN: span}
    if stages:
        headers[EDGE_TIMING] = ", ".join(f"{name};dur={ms:.2f}" for name, ms in stages)
    return headers


def parse_edge_span(span: str | None, timing: str | None) -> EdgeSpan | None:
    """The edge's span from its two headers; None when ``span`` is missing or malformed."""
    if not span or len(span) > 256:
        return None
    fields = dict(part.strip().partition("=")[::2] for part in span.split(";"))
    try:
        start_ms = float(fields.get("start", ""))
    except ValueError:
        return None
    if not start_ms > 0:
        return None
    parent = fields.get("parent")
    if parent is not None and (len(parent) != 16 or not _is_hex(parent) or parent == _NO_SPAN):
        parent = None
    return EdgeSpan(start_ms, parent, parse_stages(timing))


def parse_stages(timing: str | None, limit: int = 32) -> list[tuple[str, float]]:
    """``name;dur=ms`` pairs from a Server-Timing value (at most ``limit``; others skipped)."""
    if not timing or len(timing) > 4096:
        return []
    stages: list[tuple[str, float]] = []
    for part in timing.split(",")[:limit]:
        match = _STAGE.match(part)
        if match is not None:
            try:
                stages.append((match.group(1), float(match.group(2))))
            except ValueError:
                continue
    return stages


def _is_hex(value: str) -> bool:
    return all(c in "0123456789abcdef" for c in value)
