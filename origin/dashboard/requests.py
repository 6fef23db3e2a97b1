"""The Requests page's data: the request-log window as JSON, behind the admin key.

- ``GET /dashboard/requests?project=&key=&model=&layer=&status=&since=&until=&limit=&before=``:
  ``{"records": [...newest first...], "next": cursor | null}``; ``limit`` 50 by default,
  200 at most; ``since``/``until`` as `prism logs` takes them (``10m``, ISO); ``before``
  the ``next`` of the page before; without ``project``, every project with a window.
- ``GET /dashboard/requests/{id}``: ``{"record": {...}}``, or 404 ``record_not_found``.

Records are served as the window holds them: bodies only where the project's policy
logged them, redacted when they were written. A bad filter is a 400 naming its ``param``.
"""

from __future__ import annotations

import time
from urllib.parse import parse_qs, unquote

from prism import InvalidRequestError, NotFoundError, UpstreamUnavailableError

from ..connection.redis_client import RedisClientError
from ..http.request import Request
from ..http.responses import Reply, json_reply
from ..requestlog.record_filter import FilterError, RecordFilter, parse_time
from ..requestlog.window_reader import Cursor, WindowReader

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "RequestsData"]

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
PREFIX = "/dashboard/requests/"
_NO_STORE = {"cache-control": "no-store"}
_MAX_VALUE = 200  # characters of a filter's value: ids and names are far shorter


class RequestsData:
    def __init__(self, reader: WindowReader) -> None:
        self._reader = reader

    async def list(self, request: Request) -> Reply:
        query = _query(request.query)
        try:
            where = RecordFilter(
                key=query.get("key"),
                model=query.get("model"),
                layer=query.get("layer"),
                status=query.get("status"),
                since=_time(query, "since"),
                until=_time(query, "until"),
            )
            before = query.get("before")
            cursor = None if before is None else Cursor.parse(before)
        except FilterError as error:
            raise InvalidRequestError(f"{error.param}: {error}", param=error.param) from None
        limit = _limit(query.get("limit"))
        try:
            project = query.get("project")
            names = [project] if project is not None else await self._reader.projects()
            page = await self._reader.page(names, where, limit, cursor)
        except RedisClientError as error:
            raise _unavailable() from error
        body = {"records": page.records, "next": None if page.next is None else str(page.next)}
        return json_reply(body, _NO_STORE)

    async def one(self, request: Request) -> Reply:
        request_id = unquote(request.path[len(PREFIX) :])
        if not request_id or len(request_id) > _MAX_VALUE:
            raise NotFoundError("No request id in the path.", code="record_not_found")
        try:
            record = await self._reader.find(request_id)
        except RedisClientError as error:
            raise _unavailable() from error
        if record is None:
            raise NotFoundError(
                f"No record of request {request_id!r}: the window keeps the last"
                " PRISM_LOG_WINDOW requests per project, PRISM_LOG_WINDOW_AGE at most.",
                code="record_not_found",
            )
        return json_reply({"record": record}, _NO_STORE)


def _query(raw: bytes) -> dict[str, str]:
    """The query's parameters, the first of each name; empty ones (a form's blank
    fields) are left out."""
    try:
        parsed = parse_qs(raw.decode("utf-8", "replace"), max_num_fields=20)
    except ValueError:  # more parameters than this API has
        raise InvalidRequestError("Too many query parameters.") from None
    found: dict[str, str] = {}
    for name, values in parsed.items():
        value = values[0].strip()
        if len(value) > _MAX_VALUE:
            raise InvalidRequestError(f"{name}: longer than {_MAX_VALUE} characters", param=name)
        if value:
            found[name] = value
    return found


def _time(query: dict[str, str], name: str) -> float | None:
    text = query.get(name)
    return None if text is None else parse_time(text, time.time(), name)


def _limit(text: str | None) -> int:
    if text is None:
        return DEFAULT_LIMIT
    if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise InvalidRequestError(
            f"limit: {text[:20]!r} is not a number from 1 to {MAX_LIMIT}", param="limit"
        )
    return int(text)


def _unavailable() -> UpstreamUnavailableError:
    return UpstreamUnavailableError(
        "The request log's window is in Redis, which did not answer; try again.",
        code="redis_unavailable",
    )
