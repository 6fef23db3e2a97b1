"""The errors of the key and policy stores, and the one boundary where Redis's become them.

``KeyStoreError`` and its kinds are what ``deploy.key_store`` and ``deploy.policy_store``
raise and the CLI prints; ``translated`` wraps each Redis call of either store;
``redact_url`` names the Redis a message is about without its password. Apart from the
key store because both stores (and the commands that report their failures) share them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import redis

__all__ = [
    "KeyStoreError",
    "StoreUnavailableError",
    "UnknownKeyError",
    "redact_url",
    "translated",
]


# ----------------------------------------------------------------------------- errors
#
# KeyStoreError                 a one-line message a user can act on
# ├── UnknownKeyError           no such key id (or key) in the project
# └── StoreUnavailableError     Redis could not be reached


class KeyStoreError(Exception):
    """A key-management failure, said in one line (never containing a key)."""


class UnknownKeyError(KeyStoreError):
    pass


class StoreUnavailableError(KeyStoreError):
    pass


@contextlib.contextmanager
def translated(location: str) -> Iterator[None]:
    """Redis errors become KeyStoreErrors here, the one boundary that knows about them."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as error:
        raise StoreUnavailableError(f"cannot reach Redis at {location}: {error}") from None
    except redis.RedisError as error:
        raise KeyStoreError(f"Redis at {location} failed: {error}") from None


def redact_url(url: str) -> str:
    """``url`` without its password (Upstash URLs carry one), for messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
