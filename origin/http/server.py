"""How the origin is served: uvicorn on httptools, two listeners, and a read deadline.

uvicorn stays by measurement (``deploy/bench/server_ab.py``, docs/benchmarks.md): granian
runs 0-10 % fewer instructions per hit in user space but hands every request between its
Rust threads and the loop's, and spends more CPU per request in all.

- ``listen`` binds the public listener and the admin one (loopback by default) and
  tells the app which port is the admin's.
- ``server_options`` are uvicorn's settings for the origin, used by
  ``prism origin serve`` and by the tests alike.
- uvicorn bounds the idle time between keep-alive requests but not how long a
  request may take to arrive: a client that sends half its headers, or stops in
  the middle of its body, would hold a connection (and a worker's memory) for as
  long as it likes. ``DeadlineProtocol`` refuses a request still arriving after
  ``read_timeout`` seconds (or a connection silent for as long) with a 408 in the
  API's format, and closes. Malformed framing that the HTTP
  parser refuses (``Content-Length: -1``, a bad chunk size, ...) gets a 400 in the
  API's format instead of uvicorn's plain text. At a graceful shutdown, a connection
  whose request has not arrived yet is given a moment for it (``SHUTDOWN_GRACE``)
  rather than reset.
- ``freeze_heap`` takes what start-up built (modules, classes, settings: most of the
  heap) out of the garbage collector's reach, so a full collection under load
  walks only what requests made since (milliseconds, not the hundreds of
  milliseconds that stalled every request in flight). It also lets the young
  generation grow to ``YOUNG_GENERATION`` objects before a collection: at the
  default (700) the objects of a few dozen requests in flight alone pass the
  mark, and the collector walked them every few misses (about 5 % of a miss's
  instructions), to free almost nothing: they die by reference count.
- ``NameCheckMemo``: uvicorn checks the name of every header of every response with a
  regex search, some 2,500 instructions each (a Redis hit sends seven to ten headers: a
  twentieth of its cost). The origin sends a dozen distinct names; a name that passed
  once passes again, so ``server_options`` puts a memo of the passed ones in front of
  that search. Values are still checked every time.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import re
import secrets
import socket
from http import HTTPStatus
from typing import Any

import uvicorn
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from prism import InvalidRequestError, PrismError, RequestTimeoutError

from ..settings import Settings
from .responses import error_reply

__all__ = [
    "SHUTDOWN_GRACE",
    "YOUNG_GENERATION",
    "DeadlineProtocol",
    "NameCheckMemo",
    "bind",
    "freeze_heap",
    "listen",
    "server_options",
    "uvicorn_config",
]


class DeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on reading each request.

    No work per request: one timer per connection ticks every ``read_timeout / 2`` and
    looks at what uvicorn is doing. A request (its headers, or the body the app is
    waiting for) still arriving at two ticks in a row has taken at least half the
    timeout and is refused; so is a connection that has sent nothing for as long.
    A request is therefore never cut before ``read_timeout / 2`` and always by
    ``read_timeout``.
    """

    read_timeout = 30.0  # set per server by ``server_options``
    _timer: asyncio.TimerHandle | None = None
    _reading: object = None  # what was being read at the last tick (None: nothing)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._reading = self  # nothing received yet: that counts as reading too
        self._timer = self.loop.call_later(self.read_timeout / 2, self._tick)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def shutdown(self) -> None:
        """At a graceful shutdown, uvicorn closes every connection with no request in
        progress: one just accepted whose request is still on its way (a SIGHUP's rolling
        restart under load) would be reset with its request sent. Such a connection gets
        ``SHUTDOWN_GRACE`` seconds for its request to arrive, and then that request's
        answer is its last; one idle between keep-alive requests is closed as before."""
        if self._now_reading() is None or self.transport.is_closing():
            super().shutdown()  # idle between requests, or a request under way
            return
        self._watch_last(self.loop.time() + SHUTDOWN_GRACE)

    def _watch_last(self, until: float) -> None:
        cycle = self.cycle
        if self.transport.is_closing():
            return
        if cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False  # it arrived: uvicorn closes once it is answered
            return
        if cycle is not None or self.loop.time() >= until:
            self.transport.close()  # answered already, or nothing came in time
            return
        self.loop.call_later(0.05, self._watch_last, until)

    def send_400_response(self, msg: str) -> None:
        self._refuse(InvalidRequestError(f"Malformed HTTP request: {msg}", code="bad_framing"))

    def _now_reading(self) -> object:
        """What identifies the request being read now, or None between requests."""
        if self.scope is None:  # connected, nothing received yet
            return self
        if "method" not in self.scope:  # the headers are still arriving
            return self.scope
        cycle = self.cycle
        if cycle is not None and cycle.more_body:
            return cycle  # the body is still arriving (perhaps already answered)
        return None

    def _tick(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        reading = self._now_reading()
        if reading is not None and reading is self._reading:
            self._expired(reading)
            return
        self._reading = reading
        self._timer = self.loop.call_later(self.read_timeout / 2, self._tick)

    def _expired(self, reading: object) -> None:
        if reading is self.cycle and self.cycle.response_started:
            # The app answered (or is answering) without the whole body: just end it.
            self.transport.close()
            return
        self._refuse(
            RequestTimeoutError(
                f"The request did not arrive within {self.read_timeout:g} seconds.",
            )
        )

    def _refuse(self, error: PrismError) -> None:
        """Answer ``error`` on the socket itself (no app involved) and close."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app, if waiting for the body, sees a disconnect
        reply = error_reply(error, secrets.token_hex(8))
        head = [f"HTTP/1.1 {reply.status} {HTTPStatus(reply.status).phrase}"]
        head += [f"{name}: {value}" for name, value in reply.headers.items()]
        head += [f"content-length: {len(reply.body)}", "connection: close", "", ""]
        self.transport.write("\r\n".join(head).encode("latin-1") + reply.body)
        self.transport.close()


def listen(host: str, port: int, admin_host: str, admin_port: int) -> list[socket.socket]:
    """Bind the public and the admin listener (port 0: any free port), in that order; the
    app made for them (``Routes``' ``admin_port``) serves its admin routes on the admin
    one only."""
    public = bind(host, port)
    try:
        admin = bind(admin_host, admin_port)
    except OSError:
        public.close()
        raise
    if admin.getsockname()[1] == public.getsockname()[1]:
        public.close()
        admin.close()
        raise OSError(f"the admin port must differ from the public port ({port})")
    return [public, admin]


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on ``host:port`` (0: any free port), inheritable."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise OSError(
            f"port {port} on {host} is in use or unavailable ({error.strerror})"
        ) from None
    sock.set_inheritable(True)
    return sock


SHUTDOWN_GRACE = 1.0  # seconds a connection with no request yet may still send one

YOUNG_GENERATION = 10_000  # tracked objects made (net of freed) between young collections


def freeze_heap() -> None:
    """Exempt every object alive now from garbage collection, once start-up is done.

    They live as long as the process anyway; left in the oldest generation, each full
    collection would walk them all again (some 80,000 objects), stalling the event loop.
    """
    gc.collect()  # start-up's garbage is freed, not frozen
    gc.freeze()
    gc.set_threshold(YOUNG_GENERATION, *gc.get_threshold()[1:])


class _PassedNames(dict[bytes, None]):
    __slots__ = ("_pattern",)

    def __init__(self, pattern: re.Pattern[bytes]) -> None:
        super().__init__()
        self._pattern = pattern

    def __missing__(self, name: bytes) -> re.Match[bytes] | None:
        found = self._pattern.search(name)
        if found is None and len(self) < _MAX_NAMES:  # only names that passed are kept
            self[name] = None
        return found


_MAX_NAMES = 256  # the origin sends a dozen; more come only from providers' errors


class NameCheckMemo:
    """Stands in for uvicorn's header-name pattern, of which it only calls ``search``:
    the same answer, from a dict for a name that passed before (a C call, no regex)."""

    __slots__ = ("pattern", "search")

    def __init__(self, pattern: re.Pattern[bytes]) -> None:
        self.pattern = pattern
        self.search = _PassedNames(pattern).__getitem__

    @classmethod
    def install(cls) -> None:
        """In front of uvicorn's check, once per process (left alone if uvicorn's
        internals are not as expected: only slower, never wrong)."""
        current = getattr(httptools_impl, "HEADER_RE", None)
        if isinstance(current, re.Pattern):
            httptools_impl.HEADER_RE = cls(current)  # type: ignore[assignment]  # duck-typed


def server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn.Config keyword arguments for the origin (besides the app and logging);
    also puts ``NameCheckMemo`` in front of uvicorn's header-name check."""
    NameCheckMemo.install()
    protocol = type(
        "DeadlineProtocol", (DeadlineProtocol,), {"read_timeout": settings.read_timeout}
    )
    return {
        "http": protocol,
        "server_header": False,
        "proxy_headers": False,  # the origin reads no client address: skip that middleware
        # Said, not guessed: a compiled app's __call__ is no coroutine function to uvicorn.
        "interface": "asgi3",
    }


def uvicorn_config(app: Any, settings: Settings, log_level: str) -> uvicorn.Config:
    """The origin's uvicorn config, loaded (its modules imported: ``freeze_heap`` after
    it freezes them too); one process or each worker of many alike."""
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        **server_options(settings),
    )
    config.load()
    return config
