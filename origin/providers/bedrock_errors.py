"""Bedrock's errors in the gateway's terms: one mapping for an HTTP error answer and for an
exception event inside a ConverseStream.

An AWS JSON error names its type in the ``x-amzn-ErrorType`` header
(``ThrottlingException:http://internal.amazon.com/…``; else ``__type`` in the body) and
says why in the body's ``message``; an event stream names it in ``:exception-type``
(``throttlingException``). Throttling is the client's 429; a model not ready, a service
unavailable or an internal error is retryable (503 / 502); a validation error is the
caller's 400 with Bedrock's message; refused credentials are the gateway's problem, never
the client's 401.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from prism import (
    InvalidRequestError,
    NotFoundError,
    PrismError,
    RateLimitError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)

from .base import ProviderSpec
from .upstream_http import CONTEXT_LENGTH_EXCEEDED, redact

__all__ = ["bedrock_error", "error_of_event", "raise_for_bedrock"]

# Bedrock says "Input is too long for requested model" (and the models' own words).
_CONTEXT_LENGTH = re.compile(
    r"too long|context.length|context.window|too many (?:input )?tokens", re.IGNORECASE
)
# The gateway's credentials or signature refused: an operator's problem.
_AUTH_TYPES = frozenset(
    {
        "AccessDeniedException",
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "IncompleteSignatureException",
        "MissingAuthenticationTokenException",
        "ExpiredTokenException",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
    }
)
_UNAVAILABLE_TYPES = frozenset({"ModelNotReadyException", "ServiceUnavailableException"})
_RATE_LIMITED = frozenset({"ThrottlingException", "ServiceQuotaExceededException"})
# The types whose meaning wins over their status.
_KNOWN = (
    _AUTH_TYPES
    | _UNAVAILABLE_TYPES
    | _RATE_LIMITED
    | {
        "ModelTimeoutException",
        "ResourceNotFoundException",
        "ValidationException",
        "InternalServerException",
        "ModelErrorException",
        "ModelStreamErrorException",
    }
)


def bedrock_error(spec: ProviderSpec, kind: str, message: str, status: int | None) -> PrismError:
    """The gateway's error for a Bedrock error of type ``kind`` (``status``: its HTTP
    status, None inside a stream). The type decides; the status only when it is unknown
    (ModelNotReadyException comes as a 429, and is no rate limit)."""
    name = spec.name
    text = redact(spec, message)
    suffix = f": {text}" if text else "."
    if kind in _UNAVAILABLE_TYPES or (kind not in _KNOWN and status == 503):
        return UpstreamUnavailableError(f"Provider '{name}' is unavailable{suffix}")
    if kind in _RATE_LIMITED or (kind not in _KNOWN and status == 429):
        return RateLimitError(
            f"Provider '{name}' is rate limiting{suffix}", code="upstream_rate_limited"
        )
    if kind in _AUTH_TYPES or (kind not in _KNOWN and status in (401, 403)):
        # Bedrock's message names the account and role: the operator's to read in AWS.
        return UpstreamError(
            f"Provider '{name}' refused the gateway's AWS credentials ({kind or status}): "
            "check the origin's credentials and its bedrock:InvokeModel permission on the model.",
            code="upstream_auth_failed",
        )
    if kind == "ModelTimeoutException" or (kind not in _KNOWN and status in (408, 504)):
        return UpstreamTimeoutError(f"Provider '{name}' timed out{suffix}")
    if kind == "ResourceNotFoundException" or (kind not in _KNOWN and status == 404):
        return NotFoundError(f"Provider '{name}' does not know this model{suffix}")
    if kind == "ValidationException" or (
        kind not in _KNOWN and status is not None and 400 <= status < 500
    ):
        code = CONTEXT_LENGTH_EXCEEDED if _CONTEXT_LENGTH.search(text) else None
        return InvalidRequestError(f"Provider '{name}' rejected the request{suffix}", code=code)
    # InternalServerException, ModelErrorException, ModelStreamErrorException, the unknown
    return UpstreamError(f"Provider '{name}' failed ({kind or status}){suffix}")


def _error_type(headers: Mapping[str, str], body: Any) -> str:
    kind = headers.get("x-amzn-errortype") or ""
    if not kind and isinstance(body, dict):
        kind = str(body.get("__type") or body.get("code") or "")
    return kind.split(":", 1)[0].rsplit("#", 1)[-1]


def _message(body: Any) -> str:
    if not isinstance(body, dict):
        return ""
    message = body.get("message", body.get("Message"))
    return message if isinstance(message, str) else ""


def raise_for_bedrock(
    spec: ProviderSpec, status: int, body: bytes, headers: Mapping[str, str]
) -> None:
    """Raise the gateway's error for a non-200 Bedrock answer (an ``ErrorMapper``)."""
    if status == 200:
        return
    try:
        data: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    raise bedrock_error(spec, _error_type(headers, data), _message(data), status)


def error_of_event(spec: ProviderSpec, headers: Mapping[str, Any], payload: bytes) -> PrismError:
    """The error an ``exception`` (or ``error``) message of an event stream reports."""
    if headers.get(":message-type") == "error":
        kind = str(headers.get(":error-code") or "")
        return bedrock_error(spec, kind, str(headers.get(":error-message") or ""), None)
    kind = str(headers.get(":exception-type") or "")
    try:
        data: Any = orjson.loads(payload)
    except orjson.JSONDecodeError:
        data = None
    # Events name their type in lowerCamelCase: throttlingException.
    return bedrock_error(spec, kind[:1].upper() + kind[1:], _message(data), None)
