"""The request log: each request's record made once, handed to every consumer.

``RequestLog.record`` is the ``Recorder`` the routing table calls once a response has been
sent (``origin.http.asgi``): it makes the record (``origin.requestlog.record``) and its
JSON once, appends that to each sink's buffer (``origin.requestlog.buffer``), and passes
the record to the access log when that is on. ``build_request_log`` wires it from the
settings: the Redis window (``PRISM_REQUEST_LOG``, on by default) on a connection of its
own, so a batch never queues in front of a request's Redis command, and any other sinks
given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from orjson import dumps
from prometheus_client import CollectorRegistry, Counter

from ..connection.redis_client import RedisClient
from ..http.access_log import AccessLog
from ..http.asgi import Route
from ..http.request import Request
from ..http.responses import Reply
from ..settings import Settings
from .buffer import RecordBuffer
from .record import RecordMaker, logged
from .redis_window import RedisWindowSink
from .sink import RecordSink

__all__ = ["RequestLog", "build_request_log"]


class RequestLog:
    __slots__ = ("_maker", "access_log", "buffers")

    def __init__(
        self,
        maker: RecordMaker,
        buffers: Sequence[RecordBuffer],
        access_log: AccessLog | None = None,
    ) -> None:
        self._maker = maker
        self.buffers = tuple(buffers)
        self.access_log = access_log

    def record(
        self,
        request: Request,
        reply: Reply,
        first_byte: float,
        ended: float,
        route: Route | None,
    ) -> None:
        if route is None:  # no route has the path: a 404
            record = self._maker.make(request, reply, first_byte, ended, "")
        else:
            record = self._maker.make(request, reply, first_byte, ended, route.name)
            if not route.recorded:  # a health probe: the access log's only
                if self.access_log is not None:
                    self.access_log.write(record, request)
                return
        buffers = self.buffers
        if buffers:
            # ``logged``, from the request's typed fields; the JSON now, before the flight's
            # list of attempts (in the record) can grow.
            line = (dumps(record), record["ts"], request.project, request.id)
            for buffer in buffers:
                buffer.append(line)
        if self.access_log is not None:
            self.access_log.write(record, request)

    def add(self, records: Sequence[dict[str, Any]]) -> None:
        """Records made elsewhere, whole (the edge's: ``origin.apis.edge_records``)."""
        lines = [logged(record) for record in records] if self.buffers else []
        for buffer in self.buffers:
            for line in lines:
                buffer.append(line)

    def start(self) -> None:
        for buffer in self.buffers:
            buffer.start()

    async def close(self) -> None:
        """What is buffered is written (each sink within its buffer's close timeout)."""
        for buffer in self.buffers:
            await buffer.close()


def build_request_log(
    settings: Settings,
    registry: CollectorRegistry,
    redis: Callable[[], RedisClient],
    sinks: Sequence[RecordSink] = (),
) -> RequestLog | None:
    """The request log the settings ask for (None: neither it nor the access log is on).
    ``redis`` makes the window's own connection; ``sinks`` are written besides it."""
    access_log = AccessLog(settings) if settings.access_log else None
    if not settings.request_log:
        return (
            None if access_log is None else RequestLog(RecordMaker(settings.region), (), access_log)
        )
    written = Counter(
        "prism_request_log_written",
        "Request-log records a sink has stored, by sink.",
        ("sink",),
        registry=registry,
    )
    dropped = Counter(
        "prism_request_log_dropped",
        "Request-log records dropped (a sink's buffer full, or unwritten at shutdown), by sink.",
        ("sink",),
        registry=registry,
    )
    window = RedisWindowSink(redis(), settings.log_window, settings.log_window_age)
    buffers = [
        RecordBuffer(
            sink,
            settings.log_buffer,
            written,
            dropped,
            batch=getattr(sink, "flush_records", 1000),
            interval=getattr(sink, "flush_interval", 1.0),
        )
        for sink in (window, *sinks)
    ]
    return RequestLog(RecordMaker(settings.region), buffers, access_log)
