"""The edge's signed hand-off to the origin.

When the edge forwards a miss it has already verified the key and computed the
fingerprint; it says so in one header, HMAC-signed with the forwarding secret
and valid for a few seconds, so the origin trusts it without redoing the work:

    x-prism-forward: v2.{expires}.{project}.{key_id}.{fingerprint}.{signature}

The signature also covers the request's method and path, which the header does
not carry: the origin supplies the ones it received, so a captured header is
worth nothing on another route or method. The body is bound by the fingerprint:
the origin derives it from the body it received and refuses a mismatch
(``ForwardRejected`` with reason ``body``), so a replay cannot carry another body.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass

from . import headers as h
from .errors import AuthenticationError

__all__ = [
    "FORWARD_TTL_SECONDS",
    "ForwardRejected",
    "Forwarded",
    "body_digest",
    "sign_forward",
    "verify_forward",
]

# What the edge needs between signing and the origin reading the headers (one
# subrequest), plus clock skew; the header is useless to a replay after that.
FORWARD_TTL_SECONDS = 5
_VERSION = "v2"


class ForwardRejected(AuthenticationError):
    """A forward header the origin refuses; ``reason`` labels the rejection metric:
    ``malformed``, ``signature`` (forged, or replayed on another method or path),
    ``expired`` or ``body`` (replayed with another body)."""

    default_code = "invalid_forward"

    def __init__(self, message: str, reason: str, code: str | None = None) -> None:
        # The reason travels with the 401: the edge re-signs an expired forward and retries.
        super().__init__(message, code=code, headers={h.FORWARD_REJECTED: reason})
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Forwarded:
    project: str
    key_id: str
    fingerprint: str
    expires: int


def body_digest(body: bytes) -> str:
    """What a forward that is not an API request (the edge's request records) signs in
    the fingerprint's place: the body's SHA-256, so the origin can check the bytes."""
    return hashlib.sha256(body).hexdigest()


def _signature(secret: bytes, message: str, method: str, path: str) -> str:
    signed = f"{message}\n{method}\n{path}".encode()
    digest = hmac.new(secret, signed, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def sign_forward(
    secret: bytes,
    *,
    method: str,
    path: str,
    project: str,
    key_id: str,
    fingerprint: str,
    now: float,
    ttl: int = FORWARD_TTL_SECONDS,
) -> str:
    message = f"{_VERSION}.{int(now) + ttl}.{project}.{key_id}.{fingerprint}"
    return f"{message}.{_signature(secret, message, method, path)}"


def verify_forward(secret: bytes, header: str, *, method: str, path: str, now: float) -> Forwarded:
    """The forwarded identity, or ``ForwardRejected`` if forged, malformed, expired, or
    signed for another method or path."""
    parts = header.split(".")
    if (
        not header.isascii()
        or len(parts) != 6
        or parts[0] != _VERSION
        or not (parts[1].isdigit() and len(parts[1]) <= 12)
    ):
        raise ForwardRejected("Malformed edge forward header.", "malformed")
    message, signature = header.rpartition(".")[::2]
    expected = _signature(secret, message, method, path)
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        raise ForwardRejected("Invalid edge forward signature.", "signature")
    expires = int(parts[1])
    if now > expires:
        raise ForwardRejected("Expired edge forward header.", "expired", code="forward_expired")
    return Forwarded(project=parts[2], key_id=parts[3], fingerprint=parts[4], expires=expires)
