"""The edge's frozen settings, read once per isolate from the Worker's ``env`` bindings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from prism import KeyRing, Limits, parse_key_secrets

from .origins import DEFAULT_AVOID_SECONDS, DEFAULT_RECHECK_SECONDS, Origin, parse_origins

__all__ = ["EdgeSettings"]


@dataclass(frozen=True, slots=True)
class EdgeSettings:
    key_ring: KeyRing = field(repr=False)
    forward_secret: bytes = field(repr=False)
    # PRISM_ORIGINS (else ORIGIN_URL as the only one), never empty: see edge/origins.py.
    origins: tuple[Origin, ...]
    origin_avoid: float = DEFAULT_AVOID_SECONDS  # a failed origin is tried last this long
    # While it is avoided, its /healthz is asked in the background this often (after a
    # response, on a request's waitUntil): an answer ends the avoidance, no request waits.
    origin_recheck: float = DEFAULT_RECHECK_SECONDS
    kv_timeout: float = 0.5  # a slow KV read falls through to the origin
    body_timeout: float = 10.0  # a request body that takes longer is a 408
    # The origin's first byte (a whole answer, for a JSON miss) may take this long; then 504.
    # Under the 100 s Cloudflare allows a response to start, and over the providers' own
    # first-byte limit (60 s), so the origin's own answer (a 504 it chose) comes first.
    origin_timeout: float = 90.0
    # With another origin to ask: an answer not started after this long has the origin's
    # liveness probed (GET /healthz, for at most origin_probe_timeout); no answer to it,
    # and the request goes to the next origin. 0: no probe (wait origin_timeout).
    origin_probe_after: float = 2.0
    origin_probe_timeout: float = 1.0
    revocation_ttl: float = 60.0  # how stale the revocation set may be per isolate
    policy_ttl: float = 60.0  # how stale a project's policy may be per isolate
    models_ttl: float = 60.0  # how stale the published model list may be per isolate
    limits: Limits = field(default_factory=Limits)
    # PRISM_TRACE=on (when the origin exports traces): the edge starts its own span on each
    # forward. Off, a client's traceparent is passed on as it came, at no cost.
    trace: bool = False
    # PRISM_REQUEST_LOG=off: the isolate keeps no records of what it answers itself (KV
    # hits, refusals) and sends none to the origin (edge/request_log.py).
    request_log: bool = True

    @classmethod
    def from_env(cls, get: Callable[[str], str | None]) -> EdgeSettings:
        """``get`` reads one binding (a Worker var or secret) by name, None when unset."""
        secret = get("PRISM_KEY_SECRET") or ""
        forward = get("PRISM_FORWARD_SECRET") or ""
        origins = parse_origins(
            get("PRISM_ORIGINS"), get("ORIGIN_URL"), get("PRISM_ORIGIN_REGIONS")
        )
        missing = [
            name
            for name, value in (
                ("PRISM_KEY_SECRET", secret),
                ("PRISM_FORWARD_SECRET", forward),
                ("ORIGIN_URL (or PRISM_ORIGINS)", origins),
            )
            if not value
        ]
        if missing:
            raise ValueError(f"edge is missing bindings: {', '.join(missing)}")
        # Only the bindings that are set: the dataclass holds every default, once.
        optional: dict[str, object] = {}
        for name, binding, scale in (
            ("kv_timeout", "PRISM_KV_TIMEOUT_MS", 1000),
            ("body_timeout", "PRISM_BODY_TIMEOUT_MS", 1000),
            ("origin_timeout", "PRISM_ORIGIN_TIMEOUT_MS", 1000),
            ("origin_probe_after", "PRISM_ORIGIN_PROBE_AFTER_MS", 1000),
            ("origin_probe_timeout", "PRISM_ORIGIN_PROBE_TIMEOUT_MS", 1000),
            ("revocation_ttl", "PRISM_REVOCATION_TTL_SECONDS", 1),
            ("policy_ttl", "PRISM_POLICY_TTL_SECONDS", 1),
            ("models_ttl", "PRISM_MODELS_TTL_SECONDS", 1),
            ("origin_avoid", "PRISM_ORIGIN_AVOID_SECONDS", 1),
            ("origin_recheck", "PRISM_ORIGIN_RECHECK_SECONDS", 1),
        ):
            value = get(binding)
            if value:
                optional[name] = float(value) / scale
        trace = (get("PRISM_TRACE") or "off").strip().lower()
        if trace not in ("on", "off"):
            raise ValueError(f"PRISM_TRACE must be on or off, not {trace[:20]!r}")
        if trace == "on":
            optional["trace"] = True
        request_log = (get("PRISM_REQUEST_LOG") or "on").strip().lower()
        if request_log not in ("on", "off"):
            raise ValueError(f"PRISM_REQUEST_LOG must be on or off, not {request_log[:20]!r}")
        if request_log == "off":
            optional["request_log"] = False
        max_body = get("PRISM_MAX_BODY_BYTES")
        if max_body:
            optional["limits"] = Limits(max_body_bytes=int(max_body))
        return cls(
            key_ring=parse_key_secrets(secret),
            forward_secret=forward.encode(),
            origins=origins,
            **optional,  # type: ignore[arg-type]
        )
