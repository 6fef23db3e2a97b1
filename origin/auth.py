"""Who is calling: a signed forward from the edge, or an API key checked here."""

from __future__ import annotations

import time
from collections.abc import Mapping

from prism import ForwardRejected, KeyRing, bearer_token, verify_forward
from prism import headers as h

from .metrics import Metrics

__all__ = ["Caller", "authenticate", "check_forwarded_body"]


class Caller:
    """Who is asking. A plain class: made on every request, and compiled its ``__init__``
    is native code (a NamedTuple's ``__new__`` is generated Python)."""

    __slots__ = ("fingerprint", "forwarded", "key_id", "project")

    def __init__(
        self,
        project: str,
        key_id: str,
        fingerprint: str | None,  # computed and signed by the edge; None when called directly
        forwarded: bool = False,  # vouched for by the edge's signed header
    ) -> None:
        self.project = project
        self.key_id = key_id
        self.fingerprint = fingerprint
        self.forwarded = forwarded


def authenticate(
    headers: Mapping[str, str],
    key_ring: KeyRing,
    forward_secret: bytes,
    method: str,
    path: str,
    metrics: Metrics | None = None,
    key_header: str | None = None,
) -> Caller:
    """The caller of ``method path``. A forward header binds both: one signed for another
    route or method is refused like a forged one. ``key_header`` (``x-api-key`` on the
    Anthropic route) may carry the key instead of ``Authorization: Bearer``."""
    forwarded = headers.get(h.FORWARD)
    if forwarded is not None:
        # Only the edge can sign this; a bad or expired one is refused, never ignored.
        try:
            found = verify_forward(
                forward_secret, forwarded, method=method, path=path, now=time.time()
            )
        except ForwardRejected as rejected:
            if metrics is not None:
                metrics.count_forward_rejected(rejected.reason)
            raise
        return Caller(found.project, found.key_id, found.fingerprint or None, forwarded=True)
    token = bearer_token(headers.get("authorization"))
    if not token and key_header is not None:
        token = headers.get(key_header, "").strip(" \t")
    identity = key_ring.verify(token)
    return Caller(identity.project, identity.key_id, None)


def check_forwarded_body(caller: Caller, fingerprint: str, metrics: Metrics | None) -> None:
    """A forwarded request's body must be the one the edge fingerprinted: the fingerprint
    the origin derives anyway must equal the signed one, so a captured header replayed
    with another body (to poison the tenant's entry under it) is refused."""
    if caller.forwarded and caller.fingerprint != fingerprint:
        if metrics is not None:
            metrics.count_forward_rejected("body")
        raise ForwardRejected("Edge forward header does not match the request body.", "body")
