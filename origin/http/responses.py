"""What the origin answers with: ``Reply``, and the one place an error becomes a reply."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable

import orjson

from prism import PrismError, error_json
from prism import headers as h

__all__ = ["RawHeaders", "Reply", "error_reply", "json_reply"]

_JSON = "application/json"


# Headers already in wire form, sent after a reply's ``headers``.
RawHeaders = list[tuple[bytes, bytes]]


class Reply:
    """A route's answer. A plain class, not a dataclass: compiled, its ``__init__`` is
    native code, where a dataclass's is generated Python, run on every request."""

    __slots__ = ("body", "headers", "raw_headers", "status", "stream")

    def __init__(
        self,
        status: int,
        headers: dict[str, str],
        body: bytes = b"",
        stream: AsyncIterator[bytes] | None = None,  # sent chunk by chunk when set
        # The x-ratelimit-*-requests headers of an admitted request
        # (``origin.governance.rate_limiter``): encoded once per limit rather than per
        # request, and read by nothing but the client.
        raw_headers: RawHeaders | None = None,
    ) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.stream = stream
        self.raw_headers = raw_headers


def error_reply(
    error: PrismError,
    request_id: str,
    stages: Iterable[tuple[str, float]] = (),
    render: Callable[[PrismError], bytes] | None = None,
) -> Reply:
    """An OpenAI-style error (or the route's own format, ``render``) with the contract's
    headers: the request id, the layer (nothing is cached from an error) and the stages
    that ran before it, if any."""
    headers = {"content-type": _JSON, **error.headers}
    headers[h.REQUEST_ID] = request_id
    headers[h.CACHE_LAYER] = "bypass"
    timing = h.server_timing(stages)
    if timing:
        headers[h.SERVER_TIMING] = timing
    return Reply(error.status, headers, (render or error_json)(error))


def json_reply(data: object, headers: dict[str, str] | None = None) -> Reply:
    return Reply(200, {"content-type": _JSON, **(headers or {})}, orjson.dumps(data))
