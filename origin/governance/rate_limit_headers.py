"""What a rate limit verdict tells the client: OpenAI's x-ratelimit-* headers, its reset
durations, and the 429 of a refusal.

Apart from ``origin.governance.rate_limiter`` because it is the reply's format, not the
limiting: plain functions of a script's GCRA reply ``[admitted, limit, remaining,
reset_ms, retry_ms, scope]`` (``origin.governance.rate_limit_scripts``).
"""

from __future__ import annotations

import math

from prism import RateLimitError

__all__ = ["SCOPES", "duration", "rate_limit_error", "request_headers", "token_headers"]

# The reply's scope: which limit binds.
SCOPES = {1: "project", 2: "key"}


def duration(ms: int) -> str:
    """``ms`` as OpenAI writes its reset headers (Go's duration form): 0s, 12ms, 1.5s,
    6m0s, 1h0m0s."""
    if ms < 1000:
        return f"{ms}ms" if ms > 0 else "0s"
    seconds, millis = divmod(ms, 1000)
    minutes, seconds = divmod(seconds, 60)
    text = f"{seconds}.{millis:03d}".rstrip("0") + "s" if millis else f"{seconds}s"
    if not minutes:
        return text
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes}m{text}" if hours else f"{minutes}m{text}"


def request_headers(rate: list[int]) -> dict[str, str]:
    """The x-ratelimit-*-requests headers from the lookup script's reply."""
    return {
        "x-ratelimit-limit-requests": str(rate[1]),
        "x-ratelimit-remaining-requests": str(rate[2]),
        "x-ratelimit-reset-requests": duration(rate[3]),
    }


def token_headers(rate: list[int]) -> dict[str, str]:
    return {
        "x-ratelimit-limit-tokens": str(rate[1]),
        "x-ratelimit-remaining-tokens": str(rate[2]),
        "x-ratelimit-reset-tokens": duration(rate[3]),
    }


def rate_limit_error(
    project: str, key_id: str, kind: str, rate: list[int], headers: dict[str, str], cost: int = 1
) -> RateLimitError:
    """The 429 for a refusal: OpenAI's body (type ``requests`` or ``tokens``, code
    ``rate_limit_exceeded``) and headers (Retry-After, retry-after-ms, x-ratelimit-*)."""
    limit, retry_ms, scope = rate[1], rate[4], SCOPES.get(rate[5], "project")
    who = f"project {project}" if scope == "project" else f"key {key_id}"
    unit = "requests per min (RPM)" if kind == "requests" else "tokens per min (TPM)"
    if cost > limit:  # can never fit: waiting does not help, a smaller request does
        message = (
            f"Request too large for {who} on {unit}: Limit {limit}, Requested {cost} "
            "(the prompt's size plus max_tokens, or the default cap when unset). "
            "Lower max_tokens or shorten the prompt."
        )
    else:
        message = (
            f"Rate limit reached for {who} on {unit}: Limit {limit}, Requested {cost}. "
            f"Please try again in {duration(retry_ms)}."
        )
    headers["retry-after"] = str(max(1, math.ceil(retry_ms / 1000)))
    headers["retry-after-ms"] = str(retry_ms)
    error = RateLimitError(message, code="rate_limit_exceeded", headers=headers)
    error.type = kind  # as OpenAI: "requests" or "tokens"
    return error
