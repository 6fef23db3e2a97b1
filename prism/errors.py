"""The one exception tree, shared by edge and origin, and its OpenAI-style rendering.

PrismError                       500 server_error
├── InvalidRequestError          400 invalid_request_error
│   ├── RequestTimeoutError      408 invalid_request_error
│   └── RequestTooLargeError     413 invalid_request_error
├── AuthenticationError          401 authentication_error
├── PermissionDeniedError        403 permission_error
├── NotFoundError                404 not_found_error
├── MethodNotAllowedError        405 invalid_request_error
├── RateLimitError               429 rate_limit_error
└── UpstreamError                502 upstream_error
    ├── UpstreamUnavailableError 503 upstream_error
    └── UpstreamTimeoutError     504 timeout_error
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "AuthenticationError",
    "InvalidRequestError",
    "MethodNotAllowedError",
    "NotFoundError",
    "PermissionDeniedError",
    "PrismError",
    "RateLimitError",
    "RequestTimeoutError",
    "RequestTooLargeError",
    "UpstreamError",
    "UpstreamTimeoutError",
    "UpstreamUnavailableError",
    "error_body",
    "error_json",
]


class PrismError(Exception):
    """Base of every error a client can see. Carries its HTTP status and OpenAI error fields."""

    status: int = 500
    type: str = "server_error"
    default_code: str = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code or self.default_code
        # Extra response headers, e.g. Retry-After on a 429.
        self.headers = headers or {}


class InvalidRequestError(PrismError):
    status = 400
    type = "invalid_request_error"
    default_code = "invalid_request"


class RequestTimeoutError(InvalidRequestError):
    """The client did not send its request (the body) in time."""

    status = 408
    default_code = "request_timeout"


class RequestTooLargeError(InvalidRequestError):
    status = 413
    default_code = "request_too_large"


class AuthenticationError(PrismError):
    status = 401
    type = "authentication_error"
    default_code = "invalid_api_key"


class PermissionDeniedError(PrismError):
    """A valid key asked for something its project's policy does not allow."""

    status = 403
    type = "permission_error"
    default_code = "model_not_allowed"


class NotFoundError(PrismError):
    status = 404
    type = "not_found_error"
    default_code = "not_found"


class MethodNotAllowedError(PrismError):
    status = 405
    type = "invalid_request_error"
    default_code = "method_not_allowed"


class RateLimitError(PrismError):
    status = 429
    type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class UpstreamError(PrismError):
    status = 502
    type = "upstream_error"
    default_code = "bad_gateway"


class UpstreamUnavailableError(UpstreamError):
    status = 503
    default_code = "upstream_unavailable"


class UpstreamTimeoutError(UpstreamError):
    status = 504
    type = "timeout_error"
    default_code = "upstream_timeout"


_ENCODER = json.JSONEncoder(separators=(",", ":"))


def error_body(error: PrismError) -> dict[str, Any]:
    """The OpenAI-style error object for ``error``."""
    return {
        "error": {
            "message": error.message,
            "type": error.type,
            "param": error.param,
            "code": error.code,
        }
    }


def error_json(error: PrismError) -> bytes:
    return _ENCODER.encode(error_body(error)).encode()
