"""The HTTP plumbing every provider shares: one pooled client, one error mapping."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
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
    "CONTEXT_LENGTH_EXCEEDED",
    "ConnectorFactory",
    "ErrorMapper",
    "UpstreamHTTP",
    "malformed",
    "parse_body",
    "raise_for_upstream",
    "redact",
    "transport_error",
]

# Makes the connection pool: the seam where tests count or swap connections.
ConnectorFactory = Callable[[ProviderSpec], aiohttp.BaseConnector]
# Raises the gateway's error for a provider's non-200 answer (status, body, headers): the
# default reads OpenAI's and Anthropic's error bodies; a kind with its own passes another.
ErrorMapper = Callable[[ProviderSpec, int, bytes, Mapping[str, str]], None]


def _default_connector(spec: ProviderSpec) -> aiohttp.BaseConnector:
    return aiohttp.TCPConnector(limit=spec.max_connections, keepalive_timeout=60, ttl_dns_cache=300)


class UpstreamHTTP:
    """One keep-alive connection pool per provider, for the life of the app.

    aiohttp rather than httpx on this path: its client costs a fraction of httpx's CPU
    per call, and httpcore's pool scheduling grows with concurrency. (The session is
    made on first use: it must belong to the running event loop.)
    """

    def __init__(
        self,
        spec: ProviderSpec,
        connector: ConnectorFactory | None = None,
        trace_configs: Sequence[aiohttp.TraceConfig] = (),
    ) -> None:
        self.spec = spec
        self._base = spec.base_url.rstrip("/")
        self._connector = connector or _default_connector
        self._session: aiohttp.ClientSession | None = None
        # aiohttp request hooks (tracing adds ``traceparent`` so).
        self._trace_configs = list(trace_configs) or None
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            connect=spec.connect_timeout,
            # Between reads: the time to the first byte and the longest silence mid-stream.
            sock_read=spec.first_byte_timeout,
        )

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=self._connector(self.spec),
                timeout=self._timeout,
                headers=self.spec.headers,
                cookie_jar=aiohttp.DummyCookieJar(),  # an API client keeps no cookies
                raise_for_status=False,
                trace_configs=self._trace_configs,
            )
        return self._session

    async def post(
        self,
        path: str,
        payload: bytes,
        headers: Mapping[str, str],
        errors: ErrorMapper | None = None,
    ) -> bytes:
        """POST within the provider's total timeout; the body of a 200, else its PrismError."""
        spec = self.spec
        try:
            async with asyncio.timeout(spec.total_timeout):
                async with self._get_session().post(
                    self._base + path, data=payload, headers=headers
                ) as response:
                    content = await response.read()
                    status, response_headers = response.status, response.headers
        except (aiohttp.ClientError, TimeoutError) as error:
            raise transport_error(spec, error) from None
        if status != 200:
            (errors or raise_for_upstream)(spec, status, content, response_headers)
        return content

    async def get(
        self,
        path: str,
        headers: Mapping[str, str],
        params: Mapping[str, str] | None = None,
        method: str = "GET",
    ) -> bytes:
        """GET (or ``method``, without a body) within the provider's total timeout; the body
        of a 200, else its PrismError (what is not a model call: the provider's model list,
        a stored response)."""
        spec = self.spec
        try:
            async with asyncio.timeout(spec.total_timeout):
                async with self._get_session().request(
                    method, self._base + path, headers=headers, params=params
                ) as response:
                    content = await response.read()
                    status, response_headers = response.status, response.headers
        except (aiohttp.ClientError, TimeoutError) as error:
            raise transport_error(spec, error) from None
        raise_for_upstream(spec, status, content, response_headers)
        return content

    async def open_stream(
        self,
        path: str,
        payload: bytes,
        headers: Mapping[str, str],
        errors: ErrorMapper | None = None,
    ) -> aiohttp.ClientResponse:
        """Start a streamed POST; a non-200 answer is read, released and raised."""
        try:
            response = await self._get_session().post(
                self._base + path, data=payload, headers=headers
            )
        except (aiohttp.ClientError, TimeoutError) as error:
            raise transport_error(self.spec, error) from None
        if response.status != 200:
            try:
                content = await response.read()
            except (aiohttp.ClientError, TimeoutError):
                content = b""
            finally:
                response.release()
            (errors or raise_for_upstream)(self.spec, response.status, content, response.headers)
        return response

    async def chunks(self, response: aiohttp.ClientResponse) -> AsyncGenerator[bytes, None]:
        """A streamed body's chunks as the provider flushed them, within the provider's
        total timeout; a broken or stalled stream raises the client's ``PrismError``.
        The response goes back to the pool when read to the end, else it is closed."""
        spec = self.spec
        loop = asyncio.get_running_loop()
        deadline = loop.time() + spec.total_timeout
        try:
            async for chunk in response.content.iter_any():
                if loop.time() > deadline:
                    raise UpstreamTimeoutError(f"Provider '{spec.name}' stream took too long.")
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as error:
            raise transport_error(spec, error) from None
        finally:
            response.release()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def redact(spec: ProviderSpec, message: str, limit: int = 500) -> str:
    """A provider's message as the client may see it: the gateway's key for that provider
    removed (before cutting, so no prefix of it survives), at most ``limit`` characters."""
    if spec.api_key and spec.api_key in message:
        message = message.replace(spec.api_key, "[redacted]")
    return message[:limit]


def transport_error(spec: ProviderSpec, error: BaseException) -> PrismError:
    """A transport failure as the client should see it (never the provider's key)."""
    if isinstance(error, aiohttp.ClientConnectorError):
        return UpstreamError(f"Provider '{spec.name}' is unreachable.", code="upstream_unreachable")
    if isinstance(error, TimeoutError):  # aiohttp's timeouts are TimeoutErrors too
        stage = (
            "connecting to" if isinstance(error, aiohttp.ConnectionTimeoutError) else "waiting for"
        )
        return UpstreamTimeoutError(f"Timed out {stage} provider '{spec.name}'.")
    return UpstreamError(f"Provider '{spec.name}' failed: {type(error).__name__}.")


@dataclass(frozen=True, slots=True)
class _ProviderError:
    """What a provider's error body says, in OpenAI's terms (Anthropic's too)."""

    message: str = ""
    type: str | None = None
    code: str | None = None
    param: str | None = None


_NO_DETAIL = _ProviderError()
# Providers that give no code (Anthropic, many OpenAI-compatible servers) still say it.
_CONTEXT_LENGTH = re.compile(
    r"context.length|context.window|prompt is too long|exceeds? (?:the )?context|"
    r"maximum context|too many tokens",
    re.IGNORECASE,
)
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
# The error types Anthropic shares with OpenAI (its other types are not passed on).
_OPENAI_TYPES = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "rate_limit_error",
    }
)


def _text(value: Any, limit: int = 100) -> str | None:
    return value[:limit] if isinstance(value, str) and value else None


def _provider_error(spec: ProviderSpec, body: bytes) -> _ProviderError:
    """OpenAI's ``{"error": {message, type, code, param}}`` or Anthropic's
    ``{"type": "error", "error": {type, message}}``, with the gateway's key scrubbed."""
    try:
        data: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return _NO_DETAIL
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, str):
        error = {"message": error}
    if not isinstance(error, dict):
        return _NO_DETAIL
    message = redact(spec, str(error.get("message") or ""))
    code = _text(error.get("code"))
    if code is None and _CONTEXT_LENGTH.search(message):
        code = CONTEXT_LENGTH_EXCEEDED
    kind = _text(error.get("type"))
    if data.get("type") == "error" and kind not in _OPENAI_TYPES:
        # Anthropic's own types (request_too_large, api_error…): ours say it in OpenAI's terms.
        kind = None
    return _ProviderError(message, kind, code, _text(error.get("param")))


def _callers_error(error: PrismError, detail: _ProviderError) -> PrismError:
    """The provider's own type, code and param on a 4xx that is the caller's answer."""
    if detail.type is not None:
        error.type = detail.type
    return error


def raise_for_upstream(
    spec: ProviderSpec, status: int, body: bytes, headers: Mapping[str, str]
) -> None:
    """Map a provider's non-200 answer to the gateway's error for the client.

    A 4xx that is about the request (400, 404, 413, 422, …) keeps the provider's
    ``type``, ``code`` and ``param`` (``context_length_exceeded``,
    ``content_policy_violation``…): it is the caller's answer, never retried.
    """
    if status == 200:
        return
    detail = _provider_error(spec, body)
    suffix = f": {detail.message}" if detail.message else "."
    code, param = detail.code, detail.param
    if status == 429:
        raise RateLimitError(
            f"Provider '{spec.name}' is rate limiting{suffix}",
            code="upstream_rate_limited",
            headers=_retry_headers(headers) or None,
        )
    if status in (401, 403):
        # The client's key is fine; the gateway's credentials for the provider are not.
        raise UpstreamError(
            f"Provider '{spec.name}' rejected the gateway's credentials.",
            code="upstream_auth_failed",
        )
    if status == 408:
        raise UpstreamTimeoutError(f"Provider '{spec.name}' timed out{suffix}")
    if status == 413:
        raise _callers_error(
            RequestTooLargeError(
                f"Provider '{spec.name}' says the request is too large{suffix}",
                code=code,
                param=param,
            ),
            detail,
        )
    if status == 404:
        raise _callers_error(
            NotFoundError(
                f"Provider '{spec.name}' does not know this model{suffix}", code=code, param=param
            ),
            detail,
        )
    if 400 <= status < 500:
        raise _callers_error(
            InvalidRequestError(
                f"Provider '{spec.name}' rejected the request{suffix}", code=code, param=param
            ),
            detail,
        )
    if status in (503, 529):  # 529: Anthropic's "overloaded"
        raise UpstreamUnavailableError(f"Provider '{spec.name}' is unavailable{suffix}")
    if status == 504:
        raise UpstreamTimeoutError(f"Provider '{spec.name}' timed out{suffix}")
    raise UpstreamError(f"Provider '{spec.name}' answered HTTP {status}{suffix}")


def _retry_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """A 429's ``retry-after`` and ``retry-after-ms`` (OpenAI and Azure send both; the
    milliseconds are the exact wait), passed on; seconds made from the milliseconds when
    only those came, so every client can read one."""
    found = {}
    seconds, millis = headers.get("retry-after"), headers.get("retry-after-ms")
    if millis:
        found["retry-after-ms"] = millis
        if not seconds and millis.isdigit():
            seconds = str(-(-int(millis) // 1000))
    if seconds:
        found["retry-after"] = seconds
    return found


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
