"""Replicates new cache entries to Workers KV through the REST bulk endpoint.

One REST call per entry would exhaust Cloudflare's API limit (1,200 calls per
5 minutes) at four new entries a second, so entries are queued and sent in
batches (up to 10,000 pairs a call), flushed by size or by interval. The queue
is bounded; a full queue drops (and counts) instead of blocking a request.
Failed calls are retried with exponential backoff and full jitter, honouring
429 ``Retry-After``; a batch that keeps failing is dropped and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import orjson

from prism import MIN_TTL

from ..background import cancel_and_wait
from ..metrics import Metrics
from ..settings import KVSettings

if TYPE_CHECKING:
    from ..http.telemetry import Telemetry

__all__ = ["KVWriter"]

log = logging.getLogger("prism.origin.kv")

_BACKOFF_BASE = 0.25
_BACKOFF_CAP = 30.0


@dataclass(frozen=True, slots=True)
class _Entry:
    key: str
    value: str
    ttl: int
    origin: Any = None  # the submitting request's span context, when tracing


class KVWriter:
    def __init__(
        self,
        settings: KVSettings,
        client: httpx.AsyncClient,
        metrics: Metrics,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._settings = settings
        self._client = client
        self._metrics = metrics
        self._queue: asyncio.Queue[_Entry] = asyncio.Queue(maxsize=settings.max_queue)
        self._task: asyncio.Task[None] | None = None
        self._headers = {"content-type": "application/json"}
        if settings.api_token:
            self._headers["authorization"] = f"Bearer {settings.api_token}"
        self.telemetry = telemetry  # None: no tracing

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def submit(self, key: str, value: bytes, ttl: int, entry: bool = True) -> bool:
        """Queue one entry; never waits. False (and counted) when the queue is full.
        ``entry=False``: not a cache entry (the model list), not counted as submitted."""
        if entry:
            self._metrics.kv_submitted.inc()
        try:
            origin = self.telemetry.current() if self.telemetry is not None else None
            self._queue.put_nowait(_Entry(key, value.decode(), max(MIN_TTL, ttl), origin))
        except asyncio.QueueFull:
            self._metrics.kv_dropped.labels("queue_full").inc()
            return False
        self._metrics.kv_queue.set(self._queue.qsize())
        return True

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="prism-kv-writer")

    async def stop(self, drain_timeout: float = 5.0) -> None:
        """Flush what is queued (within ``drain_timeout``), then stop."""
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(drain_timeout):
                await self._queue.join()
        await cancel_and_wait(self._task)
        self._task = None

    async def _next_batch(self) -> list[_Entry]:
        batch = [await self._queue.get()]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.flush_interval
        while len(batch) < self._settings.max_batch:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except TimeoutError:
                break
            # Take whatever else is already waiting without another timer.
            while len(batch) < self._settings.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
        return batch

    async def _run(self) -> None:
        while True:
            batch = await self._next_batch()
            self._metrics.kv_in_flight.set(len(batch))
            try:
                if self.telemetry is None:
                    await self._send(batch)
                else:  # one span per bulk call, linked to the requests it carries
                    await self.telemetry.kv_write(self._send, batch, [e.origin for e in batch])
            except Exception:  # the writer must outlive any single failure
                log.exception("KV batch failed unexpectedly")
                self._metrics.kv_dropped.labels("error").inc(len(batch))
            finally:
                for _ in batch:
                    self._queue.task_done()
                self._metrics.kv_in_flight.set(0)
                self._metrics.kv_queue.set(self._queue.qsize())

    async def _send(self, batch: list[_Entry]) -> None:
        payload = orjson.dumps(
            [{"key": e.key, "value": e.value, "expiration_ttl": e.ttl} for e in batch]
        )
        for attempt in range(self._settings.max_attempts):
            delay = min(_BACKOFF_CAP, _BACKOFF_BASE * 2**attempt) * random.random()
            self._metrics.kv_calls.inc()
            try:
                response = await self._client.put(
                    self._settings.bulk_url, content=payload, headers=self._headers
                )
            except httpx.HTTPError as error:
                log.warning("KV bulk write failed: %s", type(error).__name__)
            else:
                if response.status_code == 200:
                    failed = _unsuccessful(response)
                    self._metrics.kv_sent.inc(len(batch) - failed)
                    if failed:
                        self._metrics.kv_dropped.labels("unsuccessful").inc(failed)
                    return
                if response.status_code == 429 or response.status_code >= 500:
                    delay = max(delay, _retry_after(response))
                    log.warning("KV bulk write got HTTP %s; retrying", response.status_code)
                else:  # 4xx other than 429: retrying will not help
                    log.error("KV bulk write rejected: HTTP %s", response.status_code)
                    self._metrics.kv_dropped.labels("rejected").inc(len(batch))
                    return
            if attempt + 1 < self._settings.max_attempts:
                self._metrics.kv_retried.inc()
                await asyncio.sleep(delay)
        self._metrics.kv_dropped.labels("retries_exhausted").inc(len(batch))


def _retry_after(response: httpx.Response) -> float:
    try:
        return min(_BACKOFF_CAP, float(response.headers.get("retry-after", "0")))
    except ValueError:
        return 0.0


def _unsuccessful(response: httpx.Response) -> int:
    try:
        result = orjson.loads(response.content).get("result") or {}
        return len(result.get("unsuccessful_keys") or ())
    except (orjson.JSONDecodeError, AttributeError):
        return 0
