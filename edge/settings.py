"""The edge's frozen settings, read once per isolate from the Worker's ``env`` bindings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from prism import KeyRing, Limits, parse_key_secrets

__all__ = ["EdgeSettings"]


@dataclass(frozen=True, slots=True)
class EdgeSettings:
    key_ring: KeyRing = field(repr=False)
    forward_secret: bytes = field(repr=False)
    origin_url: str
    kv_timeout: float = 0.5  # a slow KV read falls through to the origin
    body_timeout: float = 10.0  # a request body that takes longer is a 408
    revocation_ttl: float = 60.0  # how stale the revocation set may be per isolate
    policy_ttl: float = 60.0  # how stale a project's policy may be per isolate
    limits: Limits = field(default_factory=Limits)

    @classmethod
    def from_env(cls, get: Callable[[str], str | None]) -> EdgeSettings:
        """``get`` reads one binding (a Worker var or secret) by name, None when unset."""
        secret = get("PRISM_KEY_SECRET") or ""
        forward = get("PRISM_FORWARD_SECRET") or ""
        origin = get("ORIGIN_URL") or ""
        missing = [
            name
            for name, value in (
                ("PRISM_KEY_SECRET", secret),
                ("PRISM_FORWARD_SECRET", forward),
                ("ORIGIN_URL", origin),
            )
            if not value
        ]
        if missing:
            raise ValueError(f"edge is missing bindings: {', '.join(missing)}")
        kv_timeout_ms = get("PRISM_KV_TIMEOUT_MS")
        body_timeout_ms = get("PRISM_BODY_TIMEOUT_MS")
        max_body = get("PRISM_MAX_BODY_BYTES")
        revocation_ttl = get("PRISM_REVOCATION_TTL_SECONDS")
        policy_ttl = get("PRISM_POLICY_TTL_SECONDS")
        return cls(
            key_ring=parse_key_secrets(secret),
            forward_secret=forward.encode(),
            origin_url=origin.rstrip("/"),
            kv_timeout=float(kv_timeout_ms) / 1000 if kv_timeout_ms else 0.5,
            body_timeout=float(body_timeout_ms) / 1000 if body_timeout_ms else 10.0,
            revocation_ttl=float(revocation_ttl) if revocation_ttl else 60.0,
            policy_ttl=float(policy_ttl) if policy_ttl else 60.0,
            limits=Limits(max_body_bytes=int(max_body)) if max_body else Limits(),
        )
