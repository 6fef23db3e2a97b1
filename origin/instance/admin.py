"""The instance's admin listener when it runs several workers: one view of all of them.

Each worker serves its admin routes on a private loopback listener of its own
(``origin.instance.supervisor``); the supervisor serves the public admin port with this
app, which asks every worker at once and answers for the instance:

- ``/metrics``: every worker's merged (``origin.instance.merge``), plus the supervisor's
  own ``prism_origin_workers`` and ``prism_origin_worker_restarts_total``; ``prism top``
  reads it, so it shows the whole instance;
- ``/healthz``: 200 only if every worker answered healthy, each worker's answer inside;
  503 otherwise (a worker starting, hung or down);
- ``/dashboard`` and its routes: passed to one worker (the first that answers). The day's
  spend per project comes from Redis and is every origin's; the request and provider
  charts are read from that worker's own registry and health gates, so they show its
  share of the traffic (about 1/N), not the instance's. ``/metrics`` has the totals.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx
import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..dashboard.pages import STATIC
from ..http.asgi import Route, Routes, read_body
from ..http.request import Request
from ..http.responses import Reply
from .merge import merge_health, merge_metrics

__all__ = ["WorkerView", "instance_admin"]

_TIMEOUT = 2.0  # a worker that takes longer to say how it is counts as not answering
_MAX_FORM = 4096
_DROPPED = frozenset({"content-length", "transfer-encoding", "connection", "date", "server"})


@dataclass(frozen=True, slots=True)
class WorkerView:
    """A worker as the supervisor sees it now: its index, pid and private admin port
    (None until the worker has told it)."""

    index: int
    pid: int | None
    admin_port: int | None


class _Fleet:
    def __init__(self, workers: Callable[[], Sequence[WorkerView]], restarts: Callable[[], int]):
        self.workers = workers
        self.restarts = restarts
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:  # made in the admin server's loop, on first use
            logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per worker asked
            self._client = httpx.AsyncClient(timeout=_TIMEOUT, trust_env=False)
        return self._client

    async def ask(self, worker: WorkerView, path: str) -> httpx.Response | None:
        if worker.admin_port is None:
            return None
        try:
            return await self.client.get(f"http://127.0.0.1:{worker.admin_port}{path}")
        except httpx.HTTPError:
            return None

    async def ask_all(self, path: str) -> list[tuple[WorkerView, httpx.Response | None]]:
        workers = list(self.workers())
        answers = await asyncio.gather(*(self.ask(worker, path) for worker in workers))
        return list(zip(workers, answers, strict=True))

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()


def instance_admin(
    workers: Callable[[], Sequence[WorkerView]], restarts: Callable[[], int]
) -> Routes:
    """The admin app over the workers ``workers()`` lists (called per request, from the
    admin server's thread); ``restarts()``: workers restarted since the start."""
    fleet = _Fleet(workers, restarts)

    async def metrics(request: Request) -> Reply:
        answers = await fleet.ask_all("/metrics")
        texts = [a.text for _, a in answers if a is not None and a.status_code == 200]
        alive = GaugeMetricFamily(
            "prism_origin_workers", "Worker processes whose /metrics is in this answer."
        )
        alive.add_metric([], len(texts))
        restarted = CounterMetricFamily(
            "prism_origin_worker_restarts", "Workers that died and were started again."
        )
        restarted.add_metric([], fleet.restarts())
        extra: list[Metric] = [alive, restarted]
        body = merge_metrics(texts, extra)
        return Reply(200, {"content-type": "text/plain; version=0.0.4"}, body)

    async def health(request: Request) -> Reply:
        answers = await fleet.ask_all("/healthz")
        views = []
        for worker, answer in answers:
            identity = {"index": worker.index, "pid": worker.pid, "admin_port": worker.admin_port}
            body = None
            if answer is not None and answer.status_code == 200:
                try:
                    body = orjson.loads(answer.content)
                except orjson.JSONDecodeError:
                    body = None
            views.append((identity, body if isinstance(body, dict) else None))
        healthy, merged = merge_health(views, len(answers))
        return Reply(
            200 if healthy else 503, {"content-type": "application/json"}, orjson.dumps(merged)
        )

    async def dashboard(request: Request) -> Reply:
        body = b""
        if request.method == "POST":
            body = await read_body(
                request.receive, _MAX_FORM, request.headers.get("content-length")
            )
        sent = {
            name: value
            for name, value in request.headers.items()
            if name in ("authorization", "cookie", "content-type", "accept")
        }
        for worker in fleet.workers():
            if worker.admin_port is None:
                continue
            url = f"http://127.0.0.1:{worker.admin_port}{request.path}"
            try:
                answer = await fleet.client.request(request.method, url, headers=sent, content=body)
            except httpx.HTTPError:
                continue  # the next worker shows the same page
            raw = [
                (name.encode("latin-1"), value.encode("latin-1"))
                for name, value in answer.headers.multi_items()
                if name.lower() not in _DROPPED
            ]
            return Reply(answer.status_code, {}, answer.content, raw_headers=raw)
        return Reply(503, {"content-type": "text/plain"}, b"no worker answered\n")

    board = ["/dashboard", "/dashboard/data", "/dashboard/latest"]
    routes = [Route(path, dashboard) for path in board]
    routes.append(Route("/dashboard/login", dashboard, frozenset({"POST"})))
    routes += [
        Route(f"/dashboard/static/{path.name}", dashboard)
        for path in sorted(STATIC.iterdir())
        if path.is_file()
    ]

    async def closing() -> None:
        await fleet.close()

    return Routes(
        [Route("/healthz", health), Route("/metrics", metrics), *routes],
        on_shutdown=closing,
    )
