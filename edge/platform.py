"""What the edge handler needs from its runtime: the seam between logic and Workers APIs.

The Workers adapter (``edge.workers``) implements it over the ``js`` FFI; the
handler never imports ``js``, so it stays importable and testable anywhere.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from .origins import Location

__all__ = ["EdgeRequest", "EdgeResponse", "OriginReply", "Platform"]


@dataclass(frozen=True, slots=True)
class EdgeRequest:
    method: str
    path: str
    query: str
    headers: Mapping[str, str]  # lower-case names


@dataclass(slots=True)
class EdgeResponse:
    status: int
    headers: dict[str, str]
    body: bytes | str | None = None
    # An origin response whose body the runtime streams through untouched.
    passthrough: OriginReply | None = None


class OriginReply(Protocol):
    status: int

    def header(self, name: str) -> str | None: ...

    def headers(self) -> dict[str, str]: ...

    async def text(self) -> str: ...

    async def settle(self) -> None:
        """Read the whole body now, before the client is answered (a JSON answer): a
        connection lost in the middle of it fails here, where the request can still be
        asked again, not after the client has the head. A stream is never settled."""
        ...


class Platform(Protocol):
    async def read_body(self, limit: int, length: int | None) -> bytes:
        """The request body's bytes; stops reading once it has more than ``limit`` (the
        caller refuses those). ``length`` is the declared Content-Length, if any."""
        ...

    async def kv_get(self, key: str) -> str | None: ...

    async def kv_put(self, key: str, value: str, ttl: int) -> None: ...

    async def pop_cache_get(self, key: str) -> str | None:
        """A value of this PoP's cache (shared by its isolates, not replicated)."""
        ...

    async def pop_cache_put(self, key: str, value: str, ttl: int) -> None: ...

    async def fetch_origin(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> OriginReply: ...

    def wait_until(self, work: Coroutine[Any, Any, Any]) -> None: ...

    def location(self) -> Location:
        """Where the request comes from (``request.cf``); asked only to choose among
        several origins."""
        ...

    def now(self) -> float: ...

    def log_error(self, message: str) -> None:
        """One line where the operator looks (``wrangler tail`` in Workers)."""
        ...
