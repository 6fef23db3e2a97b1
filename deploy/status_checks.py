"""What `prism status` checks, and how it names what it finds.

Each check is one row: a part (origin, edge, path, redis), its state and a reason a
person can act on. ``code`` is the same reason for scripts: ``certificate_untrusted``,
``unreachable``, ``forward_secret_mismatch``, ``key_invalid``, ``key_revoked``,
``origin_unreachable``... The ``path`` check is the one that matters most: a request
with a valid key through the edge must come back from the origin, which proves the key
secret, the forwarding secret and the edge's ORIGIN_URL all agree.
"""

from __future__ import annotations

import ssl
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

import httpx
import redis

from prism.routes import MODELS_PATH

__all__ = [
    "Check",
    "State",
    "check_edge",
    "check_origin",
    "check_path",
    "check_redis",
    "path_verdict",
    "redact_url",
]

State = Literal["ok", "degraded", "down"]


@dataclass(frozen=True, slots=True)
class Check:
    part: str
    url: str
    state: State
    ms: float
    detail: str
    code: str | None = None  # why, for scripts; None when ok

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def redact_url(url: str) -> str:
    """``url`` without its credentials (never print a password)."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rsplit('@', 1)[-1]}" if sep else url.rsplit("@", 1)[-1]


def _untrusted_certificate(error: BaseException) -> bool:
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return "CERTIFICATE_VERIFY_FAILED" in str(error)


def _failure(part: str, error: httpx.HTTPError) -> tuple[str, str]:
    """(code, detail) for a request that got no answer."""
    if _untrusted_certificate(error):
        return (
            "certificate_untrusted",
            f"the {part}'s certificate is not trusted (self-signed?); "
            "use --insecure to check anyway",
        )
    if isinstance(error, httpx.TimeoutException):
        return "timeout", f"the {part} did not answer in time"
    if isinstance(error, httpx.ConnectError):
        return "unreachable", f"cannot connect to the {part}: {error or type(error).__name__}"
    return "unreachable", f"no answer from the {part}: {type(error).__name__}"


def _error(response: httpx.Response) -> tuple[str | None, str]:
    """The OpenAI-style error's (code, message), where the body is one."""
    try:
        body = response.json()
    except ValueError:
        return None, ""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return None, ""
    code = error.get("code")
    return (str(code) if code else None), str(error.get("message") or "")


def _get(
    client: httpx.Client, part: str, url: str, headers: dict[str, str] | None = None
) -> tuple[httpx.Response | None, float, Check | None]:
    """The response and its time, or the check that says why there was none."""
    started = time.perf_counter()
    try:
        response = client.get(url, headers=headers)
    except httpx.HTTPError as error:
        code, detail = _failure(part, error)
        return None, 0.0, Check(part, url, "down", 0.0, detail, code)
    return response, (time.perf_counter() - started) * 1000, None


def check_origin(
    client: httpx.Client, origin_url: str, admin_url: str | None, *, insecure: bool = False
) -> Check:
    """The public /healthz says the origin is alive; the admin one whether it reaches Redis."""
    base = origin_url.rstrip("/")
    response, ms, failed = _get(client, "origin", base + "/healthz")
    if failed is not None:
        return Check("origin", origin_url, "down", 0.0, failed.detail, failed.code)
    assert response is not None
    if response.status_code != 200:
        detail = f"/healthz answered HTTP {response.status_code}"
        return Check("origin", origin_url, "down", ms, detail, "http")
    if admin_url:
        admin_health = admin_url.rstrip("/") + "/healthz"
        admin, _, failed = _get(client, "origin's admin listener", admin_health)
        if failed is not None:
            return Check("origin", origin_url, "degraded", ms, failed.detail, failed.code)
        assert admin is not None
        body: Any = admin.json() if "json" in admin.headers.get("content-type", "") else None
        if isinstance(body, dict) and body.get("status") == "degraded":
            return Check(
                "origin", origin_url, "degraded", ms, "the origin cannot reach Redis", "redis_down"
            )
    detail = "HTTP 200" + (" (certificate not verified: --insecure)" if insecure else "")
    return Check("origin", origin_url, "ok", ms, detail)


def check_edge(client: httpx.Client, edge_url: str) -> Check:
    """A keyless request must be refused by the edge itself: it is up and checking keys,
    at no cost to the origin."""
    response, ms, failed = _get(client, "edge", edge_url.rstrip("/") + MODELS_PATH)
    if failed is not None:
        return Check("edge", edge_url, "down", 0.0, failed.detail, failed.code)
    assert response is not None
    if response.status_code != 401:
        return Check(
            "edge",
            edge_url,
            "down",
            ms,
            f"a keyless request got HTTP {response.status_code}, not the edge's 401",
            "http",
        )
    return Check("edge", edge_url, "ok", ms, "HTTP 401 to a keyless request, as it should")


# An error through the edge -> (code, what it means); anything else is told as it came.
_VERDICTS: dict[str, tuple[str, str]] = {
    "forward_expired": (
        "forward_expired",
        "the origin finds the edge's signed forward expired: their clocks disagree",
    ),
    "key_revoked": ("key_revoked", "the key is revoked"),
    "invalid_api_key": (
        "key_invalid",
        "the key is refused: a wrong key, or the edge's PRISM_KEY_SECRET is not the one it "
        "was minted with",
    ),
    "key_version_retired": ("key_invalid", "the key's version is retired at the edge"),
    "missing_api_key": ("key_invalid", "no key was sent"),
    "origin_unreachable": (
        "origin_unreachable",
        "the edge cannot reach the origin: check the edge's ORIGIN_URL and that the origin is up",
    ),
    "origin_timeout": ("origin_timeout", "the origin did not answer the edge in time"),
}


def path_verdict(status: int, code: str | None, message: str) -> tuple[State, str | None, str]:
    """(state, code, detail) for the answer to a keyed request through the edge."""
    if status == 200:
        return "ok", None, "a request with the key reached the origin through the edge"
    if code == "invalid_forward":
        if "signature" in message.lower():
            return (
                "down",
                "forward_secret_mismatch",
                "edge and origin disagree on PRISM_FORWARD_SECRET: "
                "the origin refuses the edge's signature",
            )
        return (
            "down",
            "forward_rejected",
            f"the origin refuses the edge's forward header ({message}): "
            "are edge and origin the same release?",
        )
    if code in _VERDICTS:
        named, detail = _VERDICTS[code]
        return "down", named, detail
    said = f": {message}" if message else ""
    return "down", code or "http", f"HTTP {status}{said}"


def check_path(client: httpx.Client, edge_url: str, key: str) -> Check:
    """GET /v1/models with ``key`` through the edge: the origin answers it (key, revocation
    and policy checked there too), so a 200 proves the whole path."""
    url = edge_url.rstrip("/") + MODELS_PATH
    response, ms, failed = _get(client, "edge", url, {"authorization": f"Bearer {key}"})
    if failed is not None:
        return Check("path", url, "down", 0.0, failed.detail, failed.code)
    assert response is not None
    state, code, detail = path_verdict(response.status_code, *_error(response))
    return Check("path", url, state, ms, detail, code)


def check_redis(url: str, source: str) -> Check:
    """PING the Redis at ``url``; ``source`` says where that URL came from."""
    shown = f"{redact_url(url)} ({source})"
    started = time.perf_counter()
    try:
        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    except ValueError as error:
        return Check("redis", shown, "down", 0.0, f"not a Redis URL: {error}", "bad_url")
    try:
        client.ping()
    except (redis.RedisError, OSError) as error:
        return Check("redis", shown, "down", 0.0, f"no PONG: {type(error).__name__}", "unreachable")
    finally:
        client.close()
    return Check("redis", shown, "ok", (time.perf_counter() - started) * 1000, "PONG")
