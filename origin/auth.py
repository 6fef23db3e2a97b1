"""Who is calling: a signed forward from the edge, or an API key checked here."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from prism import KeyRing, bearer_token, verify_forward
from prism import headers as h

__all__ = ["Caller", "authenticate"]


@dataclass(frozen=True, slots=True)
class Caller:
    project: str
    key_id: str
    fingerprint: str | None  # computed and signed by the edge; None when called directly


def authenticate(headers: Mapping[str, str], key_ring: KeyRing, forward_secret: bytes) -> Caller:
    forwarded = headers.get(h.FORWARD)
    if forwarded is not None:
        # Only the edge can sign this; a bad or expired one is refused, never ignored.
        found = verify_forward(forward_secret, forwarded, time.time())
        return Caller(found.project, found.key_id, found.fingerprint or None)
    identity = key_ring.verify(bearer_token(headers.get("authorization")))
    return Caller(identity.project, identity.key_id, None)
