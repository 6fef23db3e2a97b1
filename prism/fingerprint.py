"""The cache fingerprint: SHA-256 over canonical JSON of what changes the output.

Canonical JSON: sorted keys, fixed separators, ASCII escapes (so any unicode
spelling of a string agrees, lone surrogates included) and numbers already
normalized by ``parse_chat_request`` (``1``, ``1.0`` and ``1e0`` agree).

In the fingerprint: the format version, the project id (tenants never share
an entry), the API path, the model and every body field except the ones
below. Unknown fields are *in*: a new provider parameter can only cause a
miss, never a wrong answer.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Protocol

__all__ = [
    "EXCLUDED_FIELDS",
    "FINGERPRINT_VERSION",
    "ParsedBody",
    "canonical_document",
    "fingerprint",
]

FINGERPRINT_VERSION = 1

# Fields that do not change what the model says.
EXCLUDED_FIELDS = frozenset(
    {
        "stream",
        "stream_options",
        "user",
        "metadata",
        "store",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
    }
)


class ParsedBody(Protocol):
    """A parsed request of any API (chat, embeddings, messages): its JSON body as sent."""

    @property
    def body(self) -> dict[str, Any]: ...


# Built once (json.dumps with options builds a new encoder per call). ASCII escapes make
# every unicode spelling agree, lone surrogates included.
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
)


def canonical_document(project: str, path: str, request: ParsedBody) -> dict[str, Any]:
    """The exact document that is hashed: what ``prism fingerprint --explain`` shows."""
    return {
        "v": FINGERPRINT_VERSION,
        "project": project,
        "path": path,
        "request": {k: v for k, v in request.body.items() if k not in EXCLUDED_FIELDS},
    }


def fingerprint(project: str, path: str, request: ParsedBody) -> str:
    """64 hex chars identifying the cached answer to ``request`` for ``project``."""
    canonical = _CANONICAL.encode(canonical_document(project, path, request))
    return hashlib.sha256(canonical.encode()).hexdigest()
