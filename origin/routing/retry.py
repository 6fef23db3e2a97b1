"""What a failed upstream attempt means for the next one: retry, fail over, or answer.

- ``client_error`` (400, 404, 413, 422…): the caller's answer; never retried anywhere.
- ``rate_limited`` (429): fail over at once when a healthy target remains; else wait
  a short ``Retry-After`` (≤ the provider's ``max_retry_after``) and try again.
- ``server_error`` (500/502/503, a reset connection): one more try on the same provider
  after a jittered backoff, then fail over.
- ``timeout``, ``unreachable``, ``malformed``, ``auth``, ``adapter``: fail over at once
  (a timeout has cost its wait already; a refused connection or a bad key will repeat).
"""

from __future__ import annotations

from prism import (
    PrismError,
    RateLimitError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)

__all__ = [
    "ADAPTER_ERROR",
    "CLIENT_ERROR",
    "RATE_LIMITED",
    "SERVER_ERROR",
    "backoff",
    "outcome_of",
    "retry_after",
]

CLIENT_ERROR = "client_error"
RATE_LIMITED = "rate_limited"
SERVER_ERROR = "server_error"
ADAPTER_ERROR = "adapter_error"  # the provider adapter itself failed (a bug)

_BY_CODE = {
    "upstream_unreachable": "unreachable",
    "upstream_malformed": "malformed",
    "upstream_truncated": "malformed",
    "upstream_auth_failed": "auth",
}


def outcome_of(error: PrismError) -> str:
    """The attempt's outcome, as counted in ``prism_provider_attempts_total``."""
    if isinstance(error, RateLimitError):
        return RATE_LIMITED
    if isinstance(error, UpstreamTimeoutError):
        return "timeout"
    if isinstance(error, UpstreamUnavailableError):
        return SERVER_ERROR
    if isinstance(error, UpstreamError):
        # bad_gateway: an HTTP 500/502 (or other 5xx), or the connection reset under it.
        return _BY_CODE.get(error.code, SERVER_ERROR)
    if error.status < 500:
        return CLIENT_ERROR
    return ADAPTER_ERROR


def retry_after(error: PrismError) -> float | None:
    """A 429's wait in seconds: its ``retry-after-ms`` (OpenAI's and Azure's exact wait),
    else its ``Retry-After`` (the delta-seconds form), if it gave one."""
    headers = error.headers
    millis = headers.get("retry-after-ms")
    if millis is not None:
        seconds = _number(millis)
        if seconds is not None:
            return seconds / 1000
    value = headers.get("retry-after")
    return None if value is None else _number(value)


def _number(value: str) -> float | None:
    try:
        number = float(value)
    except ValueError:
        return None  # an HTTP date: not worth parsing to then refuse as too long
    return number if number >= 0 else None


def backoff(base: float, jitter: float) -> float:
    """``base`` seconds spread by ``jitter`` in [0, 1): 0.5x to 1.5x, so the retries
    of many requests that failed together do not arrive together."""
    return base * (0.5 + jitter)
