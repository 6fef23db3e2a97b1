"""The edge's copy of the revoked key ids: a Workers KV publisher, and the sync that
republishes the Redis set until KV holds a list no older than it.

Apart from ``deploy.key_store`` (the keys in Redis, the source of truth) because this is
the Cloudflare API side: HTTP with retries and backoff, used for revocations and, with
another ``key``, for each project's policy (``deploy.policy_store``). Redis is written
first and alone decides success, so a failed publish is repaired by the next one.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable
from urllib.parse import quote

import httpx

from prism import REVOKED_KEY
from prism.routes import CLOUDFLARE_API_URL

from .key_store import KeyStore

__all__ = ["DEFAULT_KV_API", "KVRevocationPublisher", "sync_revocations"]

DEFAULT_KV_API = CLOUDFLARE_API_URL


class KVRevocationPublisher:
    """Writes the whole revoked-id list to the Workers KV key the edge reads (or, with
    ``key``, any one record: a project's policy is published the same way).

    One ``PUT .../values/prism%3Arevoked`` with the JSON list as the raw body; 429
    and 5xx (and network errors) are retried with exponential backoff, at least as
    long as ``Retry-After`` asks. ``last_error`` says why the last publish failed.
    """

    def __init__(
        self,
        api_url: str,
        account_id: str,
        namespace_id: str,
        api_token: str,
        *,
        key: str = REVOKED_KEY,
        attempts: int = 4,
        backoff: float = 0.2,
        max_delay: float = 10.0,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = (
            f"{api_url.rstrip('/')}/accounts/{account_id}/storage/kv/namespaces/"
            f"{namespace_id}/values/{quote(key, safe='')}"
        )
        self._token = api_token
        self._attempts = max(1, attempts)
        self._backoff = backoff
        self._max_delay = max_delay
        self._timeout = timeout
        self._transport = transport
        self._sleep = sleep
        self.last_error: str | None = None

    def publish(self, ids: Iterable[str]) -> bool:
        """Whether the list landed in KV (after retries)."""
        return self.publish_text(json.dumps(sorted(set(ids)), separators=(",", ":")))

    def publish_text(self, body: str) -> bool:
        """Whether ``body`` landed in KV under this publisher's key (after retries)."""
        self.last_error = None
        if not self._token:
            self.last_error = "CLOUDFLARE_API_TOKEN is not set"
            return False
        headers = {
            "Authorization": f"Bearer {self._token}",
            "Content-Type": "text/plain; charset=utf-8",
        }
        with httpx.Client(timeout=self._timeout, transport=self._transport) as client:
            for attempt in range(self._attempts):
                delay = min(self._max_delay, self._backoff * 2**attempt)
                try:
                    response = client.put(self.url, content=body, headers=headers)
                except httpx.HTTPError as error:
                    self.last_error = f"{type(error).__name__}: {error}"
                else:
                    if response.is_success:
                        return True
                    self.last_error = _describe(response)
                    if response.status_code != 429 and response.status_code < 500:
                        return False  # bad token, namespace or account: retrying cannot help
                    delay = max(delay, self._retry_after(response))
                if attempt + 1 < self._attempts:
                    self._sleep(delay)
        self.last_error = f"{self.last_error} (after {self._attempts} attempts)"
        return False

    def _retry_after(self, response: httpx.Response) -> float:
        try:
            return min(self._max_delay, float(response.headers.get("retry-after", "0")))
        except ValueError:
            return 0.0


def _describe(response: httpx.Response) -> str:
    """``HTTP 403: Authentication error``, from Cloudflare's error envelope when present."""
    message = ""
    with contextlib.suppress(ValueError, KeyError, IndexError, TypeError, AttributeError):
        message = str(response.json()["errors"][0]["message"])
    return f"HTTP {response.status_code}" + (f": {message[:200]}" if message else "")


def sync_revocations(store: KeyStore, publisher: KVRevocationPublisher, rounds: int = 3) -> bool:
    """Publish the Redis set to KV until KV holds a list no older than Redis.

    Two concurrent revokes could otherwise finish with the older snapshot written
    last. The set only grows, so re-reading after the write and publishing again
    when it grew guarantees the final KV value contains every id that was in Redis
    before any of the writers finished.
    """
    ids = store.revoked_ids()
    for _ in range(max(1, rounds)):
        if not publisher.publish(ids):
            return False
        latest = store.revoked_ids()
        if latest == ids:
            return True
        ids = latest
    return True  # still growing: the newest writer's own re-check covers the rest
