"""Plain ASGI for the hot route: no framework between uvicorn and the chat handler.

Starlette serves everything else; ``/v1/chat/completions`` skips its middleware,
routing and request/response objects (about a fifth of a Redis hit's CPU).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from prism import RequestTooLargeError

__all__ = ["Reply", "read_body", "request_headers", "send_reply"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclass(slots=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    body: bytes = b""
    stream: AsyncIterator[bytes] | None = None  # sent chunk by chunk when set


def request_headers(scope: Scope) -> dict[str, str]:
    """Header names are lower-case in ASGI; repeated ones keep the last value."""
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}


async def read_body(receive: Receive, limit: int, declared: str | None) -> bytes:
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestTooLargeError(f"Request body is {declared} bytes; the limit is {limit}.")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RequestTooLargeError(f"Request body exceeds the limit of {limit} bytes.")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _raw_headers(headers: Mapping[str, str], length: int | None) -> list[tuple[bytes, bytes]]:
    raw = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
    if length is not None:
        raw.append((b"content-length", str(length).encode()))
    return raw


async def send_reply(reply: Reply, receive: Receive, send: Send) -> None:
    if reply.stream is None:
        await send(
            {
                "type": "http.response.start",
                "status": reply.status,
                "headers": _raw_headers(reply.headers, len(reply.body)),
            }
        )
        await send({"type": "http.response.body", "body": reply.body})
        return
    await send(
        {
            "type": "http.response.start",
            "status": reply.status,
            "headers": _raw_headers(reply.headers, None),
        }
    )
    # Stream while watching for the client to go away: then the stream is cancelled at
    # once (its finally releases the upstream call), not at the next chunk.
    streaming = asyncio.ensure_future(_pump(reply.stream, send))
    watching = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait((streaming, watching), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (streaming, watching):
            task.cancel()
        for task in (streaming, watching):
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if streaming.done() and not streaming.cancelled() and streaming.exception() is not None:
        raise streaming.exception()  # type: ignore[misc]


async def _pump(chunks: AsyncIterator[bytes], send: Send) -> None:
    try:
        async for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
