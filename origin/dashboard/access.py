"""Who may see the dashboard: whoever holds ``PRISM_ADMIN_KEY``.

Two ways to show it, both compared in constant time:

- ``Authorization: Bearer <admin key>`` (scripts, ``prism top``);
- the session cookie the login form sets: ``<expiry>.<HMAC-SHA256(key, expiry)>``, so
  the key itself never sits in the browser, a session ends by itself (12 h), and
  changing the key ends every session. It is ``HttpOnly`` (no script reads it),
  ``SameSite=Strict`` (no other site's page sends it) and scoped to ``/dashboard``.
  It is not ``Secure``: the admin listener speaks plain HTTP on loopback.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Mapping

__all__ = ["COOKIE", "AdminAccess"]

COOKIE = "prism_admin"
SESSION_SECONDS = 12 * 3600


class AdminAccess:
    def __init__(self, key: str, clock: Callable[[], float] = time.time) -> None:
        self._key = key.encode()
        self._bearer = b"Bearer " + self._key
        self._clock = clock

    def key_matches(self, candidate: str) -> bool:
        return hmac.compare_digest(candidate.encode("utf-8", "replace"), self._key)

    def allows(self, headers: Mapping[str, str]) -> bool:
        """The request carries the key (header) or a live session (cookie)."""
        authorization = headers.get("authorization")
        if authorization is not None:
            return hmac.compare_digest(authorization.encode("latin-1", "replace"), self._bearer)
        token = _cookie(headers.get("cookie", ""), COOKIE)
        return token is not None and self._session_valid(token)

    def session_cookie(self) -> str:
        """A ``Set-Cookie`` value opening a session."""
        expires = int(self._clock()) + SESSION_SECONDS
        token = f"{expires}.{self._sign(expires)}"
        return (
            f"{COOKIE}={token}; Path=/dashboard; Max-Age={SESSION_SECONDS}; HttpOnly;"
            " SameSite=Strict"
        )

    def _sign(self, expires: int) -> str:
        message = f"dashboard-session:{expires}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def _session_valid(self, token: str) -> bool:
        expiry, _, signature = token.partition(".")
        if not expiry.isdigit() or len(expiry) > 12:
            return False
        expires = int(expiry)
        wanted = self._sign(expires).encode()
        good = hmac.compare_digest(signature.encode("latin-1", "replace"), wanted)
        return good and expires > self._clock()


def _cookie(header: str, name: str) -> str | None:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None
