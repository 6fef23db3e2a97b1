"""The edge's signed hand-off to the origin.

When the edge forwards a miss it has already verified the key and computed the
fingerprint; it says so in one header, HMAC-signed with the forwarding secret
and valid for a few seconds, so the origin trusts it without redoing the work:

    x-prism-forward: v1.{expires}.{project}.{key_id}.{fingerprint}.{signature}
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass

from .errors import AuthenticationError

__all__ = ["FORWARD_TTL_SECONDS", "Forwarded", "sign_forward", "verify_forward"]

FORWARD_TTL_SECONDS = 30


@dataclass(frozen=True, slots=True)
class Forwarded:
    project: str
    key_id: str
    fingerprint: str
    expires: int


def _signature(secret: bytes, message: str) -> str:
    digest = hmac.new(secret, message.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def sign_forward(
    secret: bytes,
    *,
    project: str,
    key_id: str,
    fingerprint: str,
    now: float,
    ttl: int = FORWARD_TTL_SECONDS,
) -> str:
    message = f"v1.{int(now) + ttl}.{project}.{key_id}.{fingerprint}"
    return f"{message}.{_signature(secret, message)}"


def verify_forward(secret: bytes, header: str, now: float) -> Forwarded:
    """The forwarded identity, or ``AuthenticationError`` if forged, malformed or expired."""
    parts = header.split(".")
    if len(parts) != 6 or parts[0] != "v1" or not parts[1].isdigit():
        raise AuthenticationError("Malformed edge forward header.", code="invalid_forward")
    message, signature = header.rpartition(".")[::2]
    if not hmac.compare_digest(_signature(secret, message).encode(), signature.encode()):
        raise AuthenticationError("Invalid edge forward signature.", code="invalid_forward")
    expires = int(parts[1])
    if now > expires:
        raise AuthenticationError("Expired edge forward header.", code="forward_expired")
    return Forwarded(project=parts[2], key_id=parts[3], fingerprint=parts[4], expires=expires)
