"""Every error the origin answers with is rendered here, and only here."""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from prism import (
    MethodNotAllowedError,
    NotFoundError,
    PrismError,
    error_json,
)
from prism import headers as h

__all__ = ["error_headers", "error_response", "exception_handlers"]

log = logging.getLogger("prism.origin")


def error_headers(error: PrismError, request_id: str | None) -> dict[str, str]:
    """The headers of every error answer, for Starlette routes and the plain-ASGI chat alike."""
    headers = {"content-type": "application/json", **error.headers}
    if request_id:
        headers[h.REQUEST_ID] = request_id
    return headers


def error_response(error: PrismError, request_id: str | None = None) -> Response:
    return Response(error_json(error), error.status, error_headers(error, request_id))


async def _prism_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, PrismError)
    return error_response(exc, request.headers.get(h.REQUEST_ID))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        error: PrismError = MethodNotAllowedError(f"Method {request.method} is not allowed here.")
    elif exc.status_code == 404:
        error = NotFoundError(f"Unknown route {request.method} {request.url.path}.")
    else:
        error = PrismError(str(exc.detail))
        error.status = exc.status_code
    return error_response(error, request.headers.get(h.REQUEST_ID))


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(
        PrismError("The gateway failed unexpectedly."), request.headers.get(h.REQUEST_ID)
    )


exception_handlers = {
    PrismError: _prism_error,
    HTTPException: _http_error,
    Exception: _unexpected,
}
