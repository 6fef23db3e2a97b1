"""What every kind that translates a provider's stream into OpenAI's shares: a chunk as
SSE bytes, the provider's SSE events as JSON objects, the error for a stream that ended
before its last event, and reading the rest of a finished body so its connection is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import aiohttp
import orjson

from prism import PrismError, UpstreamError
from prism.sse import SSEDecoder

from .base import ProviderSpec
from .upstream_http import malformed

__all__ = ["finish_body", "json_events", "sse_chunk", "truncated"]

_FINISH_SECONDS = 0.5  # how long to wait for the body's end after the last event


def sse_chunk(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def truncated(spec: ProviderSpec) -> UpstreamError:
    return UpstreamError(
        f"Provider '{spec.name}' ended the stream before it was complete.",
        code="upstream_truncated",
    )


async def json_events(
    spec: ProviderSpec, body: AsyncIterator[bytes]
) -> AsyncGenerator[tuple[bytes, dict[str, Any]], None]:
    """Each SSE event's data and the JSON object it holds; anything else is malformed."""
    decoder = SSEDecoder()
    async for raw in body:
        for data in decoder.feed(raw):
            try:
                event = orjson.loads(data)
            except orjson.JSONDecodeError:
                raise malformed(spec, "a malformed stream event") from None
            if not isinstance(event, dict):
                raise malformed(spec, "a malformed stream event")
            yield data, event


async def finish_body(body: AsyncIterator[bytes]) -> None:
    """Read what follows the last event (the end of the chunked body), briefly.

    A response closed before its end takes its connection with it; read to the end, the
    connection goes back to the pool and the next stream skips a TCP+TLS setup. The
    answer is complete already, so a failure here costs only that connection.
    """
    with contextlib.suppress(PrismError, TimeoutError, aiohttp.ClientError):
        async with asyncio.timeout(_FINISH_SECONDS):
            async for _ in body:
                pass
