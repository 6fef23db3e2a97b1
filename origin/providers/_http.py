"""The HTTP plumbing every provider shares: one pooled client, one error mapping."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import httpx
import orjson

from prism import (
    InvalidRequestError,
    NotFoundError,
    PrismError,
    RateLimitError,
    RequestTooLargeError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)

from .base import ProviderSpec

__all__ = [
    "build_client",
    "malformed",
    "open_stream",
    "parse_body",
    "post",
    "raise_for_upstream",
    "transport_error",
]


def build_client(
    spec: ProviderSpec, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """One keep-alive client per provider, for the life of the app."""
    return httpx.AsyncClient(
        base_url=spec.base_url.rstrip("/"),
        transport=transport,
        timeout=httpx.Timeout(
            connect=spec.connect_timeout,
            read=spec.first_byte_timeout,
            write=spec.first_byte_timeout,
            pool=spec.connect_timeout,
        ),
        limits=httpx.Limits(
            max_connections=spec.max_connections,
            max_keepalive_connections=spec.max_connections,
            keepalive_expiry=60,
        ),
        headers=spec.headers,
    )


def transport_error(spec: ProviderSpec, error: Exception) -> PrismError:
    """A transport failure as the client should see it (never the provider's key)."""
    if isinstance(error, httpx.TimeoutException):
        stage = "connecting to" if isinstance(error, httpx.ConnectTimeout) else "waiting for"
        return UpstreamTimeoutError(f"Timed out {stage} provider '{spec.name}'.")
    if isinstance(error, httpx.ConnectError):
        return UpstreamError(f"Provider '{spec.name}' is unreachable.", code="upstream_unreachable")
    return UpstreamError(f"Provider '{spec.name}' failed: {type(error).__name__}.")


def _provider_message(body: bytes) -> str:
    try:
        data: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])[:500]
    if isinstance(error, str):
        return error[:500]
    return ""


def raise_for_upstream(
    spec: ProviderSpec, status: int, body: bytes, headers: Mapping[str, str]
) -> None:
    """Map a provider's non-200 answer to the gateway's error for the client."""
    if status == 200:
        return
    detail = _provider_message(body)
    suffix = f": {detail}" if detail else "."
    if status == 429:
        retry_after = headers.get("retry-after")
        raise RateLimitError(
            f"Provider '{spec.name}' is rate limiting{suffix}",
            code="upstream_rate_limited",
            headers={"retry-after": retry_after} if retry_after else None,
        )
    if status == 413:
        raise RequestTooLargeError(f"Provider '{spec.name}' says the request is too large{suffix}")
    if status in (400, 422):
        raise InvalidRequestError(f"Provider '{spec.name}' rejected the request{suffix}")
    if status == 404:
        raise NotFoundError(f"Provider '{spec.name}' does not know this model{suffix}")
    if status in (401, 403):
        # The client's key is fine; the gateway's credentials for the provider are not.
        raise UpstreamError(
            f"Provider '{spec.name}' rejected the gateway's credentials.",
            code="upstream_auth_failed",
        )
    if status in (503, 529):  # 529: Anthropic's "overloaded"
        raise UpstreamUnavailableError(f"Provider '{spec.name}' is unavailable{suffix}")
    if status == 504:
        raise UpstreamTimeoutError(f"Provider '{spec.name}' timed out{suffix}")
    raise UpstreamError(f"Provider '{spec.name}' answered HTTP {status}{suffix}")


def malformed(spec: ProviderSpec, what: str) -> UpstreamError:
    return UpstreamError(f"Provider '{spec.name}' sent {what}.", code="upstream_malformed")


def parse_body(spec: ProviderSpec, content: bytes) -> dict[str, Any]:
    """A 200 body as a JSON object, or the 502 the client should see."""
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        raise malformed(spec, "malformed JSON") from None
    if not isinstance(data, dict):
        raise malformed(spec, "an unexpected body")
    return data


async def post(
    client: httpx.AsyncClient,
    spec: ProviderSpec,
    path: str,
    payload: bytes,
    headers: Mapping[str, str],
) -> bytes:
    """POST within the provider's total timeout; the body of a 200, else its PrismError."""
    try:
        async with asyncio.timeout(spec.total_timeout):
            response = await client.post(path, content=payload, headers=headers)
    except TimeoutError:
        raise UpstreamTimeoutError(f"Provider '{spec.name}' took too long.") from None
    except httpx.HTTPError as error:
        raise transport_error(spec, error) from None
    raise_for_upstream(spec, response.status_code, response.content, response.headers)
    return response.content


async def open_stream(
    client: httpx.AsyncClient,
    spec: ProviderSpec,
    path: str,
    payload: bytes,
    headers: Mapping[str, str],
) -> httpx.Response:
    """Start a streamed POST; a non-200 answer is read, closed and raised as a PrismError."""
    request = client.build_request("POST", path, content=payload, headers=headers)
    try:
        response = await client.send(request, stream=True)
    except httpx.HTTPError as error:
        raise transport_error(spec, error) from None
    if response.status_code != 200:
        try:
            content = await response.aread()
        except httpx.HTTPError:
            content = b""
        finally:
            await response.aclose()
        raise_for_upstream(spec, response.status_code, content, response.headers)
    return response
