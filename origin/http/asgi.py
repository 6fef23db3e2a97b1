"""The origin's one request model: plain ASGI, a table of exact paths, ``Reply`` values.

Every route is a handler ``async (Request) -> Reply``. ``Routes`` finds it by exact
path and method (the API has a handful of fixed paths: a dict lookup is the whole
router), gives each request an id and a stage timer, turns any error into a reply
through the one renderer (``responses.error_reply``) and sends the reply. There is no
framework between uvicorn and the chat handler: on a Redis hit a framework's
middleware, regex routing and request objects would cost a large share of the CPU.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from starlette.types import Receive, Scope, Send

from prism import (
    InvalidRequestError,
    MethodNotAllowedError,
    NotFoundError,
    PrismError,
    RequestTooLargeError,
)
from prism import headers as h

from ..metrics import Metrics
from .request import Request, StageTimer
from .responses import RawHeaders, Reply, error_reply

if TYPE_CHECKING:
    from .loop_watch import LoopWatch
    from .telemetry import Telemetry

__all__ = [
    "CancelOnce",
    "Handler",
    "Recorder",
    "Route",
    "Routes",
    "disconnected",
    "read_body",
    "request_headers",
    "send_reply",
]

log = logging.getLogger("prism.origin")


Handler = Callable[[Request], Awaitable[Reply]]


class Recorder(Protocol):
    """What sees each request once its response has been sent (``origin.requestlog``:
    the request log, and the access log as one of its consumers)."""

    def record(
        self,
        request: Request,
        reply: Reply,
        first_byte: float,
        ended: float,
        route: Route | None,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class Route:
    path: str  # ending in "/": every path under it that no other route names
    handler: Handler
    methods: frozenset[str] = frozenset({"GET"})
    name: str = ""  # the metrics label; "" = not counted
    error_body: Callable[[PrismError], bytes] | None = None  # None: OpenAI's error format
    # False: its requests stay out of the request log's sinks (a load balancer's health
    # probes would crowd out the requests, the edge's record batches double them); the
    # access log still prints them.
    recorded: bool = True


class Routes:
    """An ASGI app over a fixed set of routes.

    ``metrics`` counts and times the replies of named routes; ``on_startup`` and
    ``on_shutdown`` run in the ASGI lifespan. With ``admin``, connections to the listener
    on ``admin_port`` (``origin.http.server.listen`` binds it) get the admin table instead:
    one check per request, no extra layer on the hot path. ``telemetry`` and
    ``recorder``, when configured, see each request once its response is sent.
    """

    def __init__(
        self,
        routes: Iterable[Route],
        *,
        metrics: Metrics | None = None,
        on_startup: Callable[[], Awaitable[None]] | None = None,
        on_shutdown: Callable[[], Awaitable[None]] | None = None,
        admin: Routes | None = None,
        admin_port: int | None = None,
        telemetry: Telemetry | None = None,
        recorder: Recorder | None = None,
        loop_watch: LoopWatch | None = None,
        reads_query: bool = False,
    ) -> None:
        self._routes = {route.path: route for route in routes}
        # Looked at only when no route names the path exactly.
        self._subtrees = [r for r in self._routes.values() if r.path.endswith("/")]
        self._metrics = metrics
        self._on_startup = on_startup
        self._on_shutdown = on_shutdown
        self.admin = admin
        self.admin_port = admin_port  # None: the admin table is not served
        # None costs one check per request.
        self.telemetry = telemetry
        self.recorder = recorder
        # Started with the lifespan; while the loop lags, new requests get a fast 503.
        self.loop_watch = loop_watch
        # Its handlers read the query string (``Request.query``); off, no request pays for it.
        self.reads_query = reads_query
        # Request ids need to be unique, not secret: a random prefix and a counter.
        self._id_prefix = secrets.token_hex(4)
        self._ids = itertools.count(1)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self._lifespan(receive, send)
            return
        server = scope.get("server")  # this connection's local (host, port)
        if server is not None and server[1] == self.admin_port and self.admin is not None:
            await self.admin(scope, receive, send)
            return
        headers = request_headers(scope)
        request = Request(
            scope["method"],
            scope["path"],
            headers,
            receive,
            headers.get(h.REQUEST_ID) or f"{self._id_prefix}{next(self._ids):08x}",
            StageTimer(),
        )
        if self.reads_query:  # the admin table's; the API's routes take no query
            request.query = scope.get("query_string", b"")
        telemetry = self.telemetry
        span = telemetry.start(request) if telemetry is not None else None
        route = self._routes.get(request.path)
        watch = self.loop_watch
        try:
            if watch is not None and watch.lagging:
                raise watch.refusal()
            if route is None:
                route = self._under(request.path)
                if route is None:
                    raise NotFoundError(f"Unknown route {request.method} {request.path}.")
            if request.method not in route.methods:
                raise MethodNotAllowedError(
                    f"Method {request.method} is not allowed here.",
                    headers={"allow": ", ".join(sorted(route.methods))},
                )
            reply = await route.handler(request)
        except PrismError as error:
            request.error = error.code
            render = route.error_body if route is not None else None
            reply = error_reply(error, request.id, request.timer.stages, render)
        except Exception:  # a bug must still answer in the API's format, and be logged
            log.exception(
                "unhandled error on %s %s (request %s)", request.method, request.path, request.id
            )
            failed = PrismError("The gateway failed unexpectedly.")
            render = route.error_body if route is not None else None
            request.error = failed.code
            reply = error_reply(failed, request.id, request.timer.stages, render)
        reply.headers.setdefault(h.REQUEST_ID, request.id)
        if self._metrics is not None and route is not None and route.name:
            layer = reply.headers.get(h.CACHE_LAYER, "bypass")
            elapsed = time.perf_counter() - request.timer.started
            self._metrics.record_request(route.name, reply.status, layer, elapsed)
        recorder = self.recorder
        if telemetry is None and recorder is None:
            await send_reply(reply, receive, send)
            return
        first_byte = time.perf_counter()  # the response starts now (a stream: its first bytes)
        try:
            await send_reply(reply, receive, send)
        finally:
            ended = time.perf_counter()
            try:
                if telemetry is not None:
                    telemetry.finish(request, reply, span, first_byte, ended)
                if recorder is not None:
                    recorder.record(request, reply, first_byte, ended, route)
            except Exception:  # the answer is out: what failed to record it is only logged
                log.exception("recording request %s failed", request.id)

    def _under(self, path: str) -> Route | None:
        """The route (ending in "/") whose subtree holds ``path``: looked for only when no
        route names the path exactly."""
        return next((r for r in self._subtrees if path.startswith(r.path)), None)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        await receive()  # lifespan.startup
        try:
            if self._on_startup is not None:
                await self._on_startup()
        except Exception as error:
            log.exception("start-up failed")
            await send({"type": "lifespan.startup.failed", "message": repr(error)})
            return
        if self.loop_watch is not None:
            self.loop_watch.start()
        await send({"type": "lifespan.startup.complete"})
        await receive()  # lifespan.shutdown
        if self.loop_watch is not None:
            self.loop_watch.close()
        if self._on_shutdown is not None:
            await self._on_shutdown()
        await send({"type": "lifespan.shutdown.complete"})


# A header name's str, made once: requests send the same few names, and a name looked up
# here costs less than decoding it and hashing the new str. Bounded, as clients choose names.
_HEADER_NAMES: dict[bytes, str] = {}
_HEADER_NAMES_BOUND = 512


def request_headers(scope: Scope) -> dict[str, str]:
    """Header names are lower-case in ASGI; repeated ones keep the last value."""
    headers: dict[str, str] = {}
    names = _HEADER_NAMES
    for name, value in scope["headers"]:
        text = names.get(name)
        if text is None:
            text = name.decode("latin-1")
            if len(names) < _HEADER_NAMES_BOUND:
                names[name] = text
        headers[text] = value.decode("latin-1")
    return headers


async def read_body(receive: Receive, limit: int, declared: str | None) -> bytes:
    """The whole body, at most ``limit`` bytes. How long it may take to arrive is bounded
    by the server (``origin.http.server``), which answers a stalled upload with 408."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestTooLargeError(f"Request body is {declared} bytes; the limit is {limit}.")
    message = await receive()
    if message["type"] == "http.request" and not message.get("more_body", False):
        body: bytes = message.get("body", b"")  # the whole body in one message: most requests
        if len(body) > limit:
            raise RequestTooLargeError(f"Request body exceeds the limit of {limit} bytes.")
        return body
    chunks: list[bytes] = []
    size = 0
    while True:
        if message["type"] == "http.disconnect":
            # Never parse half a body; nobody is left to read the answer anyway.
            raise InvalidRequestError(
                "The connection closed before the whole body arrived.", code="incomplete_body"
            )
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RequestTooLargeError(f"Request body exceeds the limit of {limit} bytes.")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
        message = await receive()
    return b"".join(chunks)


def _raw_headers(reply: Reply, length: int | None) -> RawHeaders:
    raw = [
        (name.encode("latin-1"), value.encode("latin-1")) for name, value in reply.headers.items()
    ]
    if reply.raw_headers is not None:
        raw += reply.raw_headers
    if length is not None:
        raw.append((b"content-length", str(length).encode()))
    return raw


async def send_reply(reply: Reply, receive: Receive, send: Send) -> None:
    if reply.stream is None:
        await send(
            {
                "type": "http.response.start",
                "status": reply.status,
                "headers": _raw_headers(reply, len(reply.body)),
            }
        )
        await send({"type": "http.response.body", "body": reply.body})
        return
    await send(
        {
            "type": "http.response.start",
            "status": reply.status,
            "headers": _raw_headers(reply, None),
        }
    )
    # Stream in this task while one watcher waits for the client to go away: then this
    # task is cancelled out of the stream at once (closing it releases the upstream call),
    # not at the next chunk. (A task of its own for the stream, and ``asyncio.wait`` over
    # the two, cost a good share of a streamed miss.)
    me = asyncio.current_task()
    assert me is not None
    gone = CancelOnce(me)
    watching = asyncio.ensure_future(disconnected(receive))
    watching.add_done_callback(gone)
    chunks = reply.stream
    try:
        try:
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            gone.armed = False  # from here on, the client leaving changes nothing
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
    except asyncio.CancelledError:
        if gone.fired and me.uncancel() == 0:  # the client left: nothing else to do
            return
        raise
    finally:
        gone.armed = False
        watching.cancel()


class CancelOnce:
    """A done-callback that cancels ``task`` once, and only while ``armed``: the client
    watcher's (a client gone ends the stream it was sent) and the flight's (its answer
    wakes a waiter out of ``receive``). ``fired`` tells the task's own cancel from others."""

    __slots__ = ("armed", "fired", "task")

    def __init__(self, task: asyncio.Task[Any], armed: bool = True) -> None:
        self.task = task
        self.armed = armed
        self.fired = False

    def __call__(self, done: object) -> None:
        if isinstance(done, asyncio.Future) and done.done() and not done.cancelled():
            done.exception()  # retrieved: a failed receive() means gone too
        if self.armed:
            self.armed = False
            self.fired = True
            self.task.cancel()


async def disconnected(receive: Receive) -> None:
    """Returns when the client has closed the connection (once the body has been read)."""
    while (await receive())["type"] != "http.disconnect":
        pass
