"""API keys that verify with zero lookups.

A key is ``sk-prism-v{version}.{project}.{key_id}.{signature}``: the signature is
HMAC-SHA256 (base64url, unpadded) over ``v{version}.{project}.{key_id}`` with the
secret of that version. The edge and the origin hold the secrets, so a forged,
mistyped or random key is rejected by a constant-time compare and no I/O.
Two or more secret versions may be live at once, which is how secrets rotate.
Keys are stored nowhere in plaintext: use ``key_hash`` for storage.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from .errors import AuthenticationError

__all__ = [
    "REVOKED_KEY",
    "KeyIdentity",
    "KeyRing",
    "bearer_token",
    "key_hash",
    "parse_key_secrets",
    "valid_project_id",
]

# Revoked key ids: a Redis set at the origin, a JSON list in Workers KV for the edge.
REVOKED_KEY = "prism:revoked"

_PREFIX = "sk-prism-v"
_PROJECT_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}\Z")
_KEY_ID_RE = re.compile(r"[A-Za-z0-9]{8,32}\Z")
_SIG_LEN = 43  # base64url of 32 bytes, unpadded
_MAX_KEY_LEN = 200


def valid_project_id(project: str) -> bool:
    return bool(_PROJECT_RE.match(project))


def bearer_token(authorization: str | None) -> str:
    """The key in an ``Authorization: Bearer <key>`` header value; "" for anything else.

    Only ASCII spaces and tabs are trimmed: Unicode whitespace is not a header separator,
    and the edge and the origin decode non-ASCII header bytes differently (a key with it
    is invalid in both, rather than valid in one).
    """
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip(" \t") if scheme.lower() == "bearer" else ""


def key_hash(key: str) -> str:
    """What may be stored for a key: its SHA-256, never the key itself."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class KeyIdentity:
    """Who a verified key belongs to."""

    project: str
    key_id: str
    version: int


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


class KeyRing:
    """The live signing secrets by version; mints with the newest, verifies with any."""

    __slots__ = ("_secrets", "_verified", "current")

    # Keys already verified, so a busy key costs a dict lookup instead of an HMAC. Only
    # successes are kept (a flood of bad keys cannot evict good ones into recomputation
    # cost, nor grow this), and the size is bounded.
    _MEMO_SIZE: Final = 4096  # Final: a class constant where mypyc compiles this module

    def __init__(self, secrets_by_version: Mapping[int, bytes]) -> None:
        if not secrets_by_version:
            raise ValueError("a key ring needs at least one secret")
        for version, secret in secrets_by_version.items():
            if not 1 <= version <= 999:
                raise ValueError(f"key version must be 1..999, got {version}")
            if len(secret) < 16:
                raise ValueError("a key secret must be at least 16 bytes")
        self._secrets = dict(secrets_by_version)
        self._verified: dict[str, KeyIdentity] = {}
        self.current = max(self._secrets)

    @property
    def versions(self) -> tuple[int, ...]:
        return tuple(sorted(self._secrets))

    def _sign(self, version: int, project: str, key_id: str) -> str:
        message = f"v{version}.{project}.{key_id}".encode()
        return _b64(hmac.new(self._secrets[version], message, hashlib.sha256).digest())

    def mint(self, project: str, key_id: str | None = None, version: int | None = None) -> str:
        """A new key for ``project``, signed with the newest (or the given) secret."""
        if not valid_project_id(project):
            raise ValueError(
                "project id must be 1-63 chars of a-z, 0-9, '-' or '_', starting alphanumeric"
            )
        key_id = key_id or secrets.token_hex(8)
        if not _KEY_ID_RE.match(key_id):
            raise ValueError("key id must be 8-32 alphanumeric characters")
        version = self.current if version is None else version
        if version not in self._secrets:
            raise ValueError(f"no secret for key version {version}")
        return f"{_PREFIX}{version}.{project}.{key_id}.{self._sign(version, project, key_id)}"

    def verify(self, key: str) -> KeyIdentity:
        """The key's identity, or ``AuthenticationError`` saying why not (never the key)."""
        known = self._verified.get(key)
        if known is not None:
            return known
        identity = self._verify(key)
        if len(self._verified) >= self._MEMO_SIZE:
            self._verified.clear()  # crude but bounded; refills with the hot keys at once
        self._verified[key] = identity
        return identity

    def _verify(self, key: str) -> KeyIdentity:
        if not key:
            raise AuthenticationError(
                "Missing API key. Pass it as 'Authorization: Bearer <key>'.", code="missing_api_key"
            )
        # ASCII only, so a key has one spelling: str.isdigit() and int() also accept
        # superscript, Arabic-Indic and fullwidth digits (int("\u0661") == 1).
        if len(key) > _MAX_KEY_LEN or not key.isascii() or not key.startswith(_PREFIX):
            raise AuthenticationError("Invalid API key format.", code="invalid_api_key")
        parts = key[len(_PREFIX) :].split(".")
        if len(parts) != 4:
            raise AuthenticationError("Invalid API key format.", code="invalid_api_key")
        version_text, project, key_id, signature = parts
        if not (version_text.isdigit() and len(version_text) <= 3 and version_text[0] != "0"):
            raise AuthenticationError("Invalid API key format.", code="invalid_api_key")
        version = int(version_text)
        if (
            len(signature) != _SIG_LEN
            or not _PROJECT_RE.match(project)
            or not _KEY_ID_RE.match(key_id)
        ):
            raise AuthenticationError("Invalid API key format.", code="invalid_api_key")
        if version not in self._secrets:
            raise AuthenticationError("API key version is retired.", code="key_version_retired")
        expected = self._sign(version, project, key_id)
        if not hmac.compare_digest(expected.encode(), signature.encode()):
            raise AuthenticationError("Invalid API key signature.", code="invalid_api_key")
        return KeyIdentity(project=project, key_id=key_id, version=version)


def parse_key_secrets(text: str) -> KeyRing:
    """Read ``PRISM_KEY_SECRET``: a single secret (version 1), or ``2:new,1:old`` for rotation."""
    text = text.strip()
    if not text:
        raise ValueError("PRISM_KEY_SECRET is empty")
    entries: dict[int, bytes] = {}
    items = [item.strip() for item in text.split(",")]
    for item in items:
        head, sep, tail = item.partition(":")
        if sep and head.isascii() and head.isdigit():
            entries[int(head)] = tail.encode()
        elif len(items) == 1:
            entries[1] = item.encode()
        else:
            raise ValueError("rotating secrets are written 'VERSION:SECRET,VERSION:SECRET'")
    return KeyRing(entries)
