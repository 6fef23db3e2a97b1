"""The records of the requests an isolate answers itself, sent to the origin in batches.

A KV hit, a refused key, a denied model, a bad body, an origin that could not be reached:
the origin never sees these, so the edge tells it, or its request log, usage and
dashboards would miss the PoP's answers. On the request's path a record costs a tuple
appended to a list (``EdgeRequestLog.add``); it is made into JSON and sent after the
response (``waitUntil``): one batch at a time per isolate, each ``GATHER`` seconds after
the last, carrying whatever queued meanwhile, so a busy isolate sends two batches a second
and a quiet one sends each record within ``GATHER``. A batch is signed like a forward
(``prism.sign_forward``, with the body's SHA-256 in the fingerprint's place) to the first
origin that takes it. One that no origin takes stays queued for the next send; beyond
``MAX_RECORDS`` queued, the oldest are dropped and the next batch says how many, so the
origin counts them.

Requests forwarded to the origin are logged there, not here; a path that is no route of
the gateway's (a scanner, a health check) is answered and not recorded.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from prism import PrismError, body_digest, sign_forward
from prism import headers as h
from prism.routes import REQUEST_LOG_PATH

from .origins import Origins
from .platform import EdgeResponse, Platform
from .timings import Timings

__all__ = ["FIELDS", "MAX_RECORDS", "SEND_TIMEOUT", "EdgeRequestLog", "RequestNote"]

MAX_RECORDS = 1000  # queued per isolate while no origin takes them; then the oldest go
# How long one origin may take to take a batch (within the ~30 s a Worker's waitUntil
# work may run): a stalled origin costs one attempt, then the next origin is asked.
SEND_TIMEOUT = 5.0
# A send waits this long first, so what the isolate answers meanwhile rides in the same batch:
# sent at once, every KV hit at concurrency 1 was followed by a batch of its own, a second
# request for the isolate and the origin, and the hit's p50 rose by a third.
GATHER = 0.5
# Batches one wake-up sends at most (a waitUntil may run ~30 s after its response): beyond,
# the next request's send takes over.
_SENDS_PER_WAKE = 8
_REFUSED = frozenset({401, 402, 403, 429})  # refused before an answer was looked for


class RequestNote:
    """What a request's route learned for its record, set as it goes (nothing is built
    until the record is sent)."""

    __slots__ = ("fingerprint", "id", "key_id", "model", "project", "stream", "timings", "usage")

    def __init__(self, request_id: str, timings: Timings) -> None:
        self.id = request_id
        self.timings = timings  # the handler's Server-Timing stages, complete once answered
        self.project = ""
        self.key_id = ""
        self.model = ""
        self.stream = False
        self.fingerprint = ""
        self.usage: dict[str, Any] | None = None  # a KV hit: its entry's usage


# One record as it is sent: a row in FIELDS' order (a list of lists encodes a few times
# faster than dicts; the origin names the fields). ``stages`` is the response's own
# Server-Timing header, made anyway, so no stage is encoded twice.
FIELDS = (
    "ts_ms", "id", "method", "path", "status", "layer", "error", "project", "key", "model",
    "stream", "fingerprint", "usage", "stages",
)  # fmt: skip
_Row = tuple[int, str, str, str, int, str, str, str, str, str, bool, str, Any, str]


class EdgeRequestLog:
    """One per isolate."""

    def __init__(self, forward_secret: bytes, origins: Origins) -> None:
        self._secret = forward_secret
        self._origins = origins
        self._queued: list[_Row] = []
        self._sending = False
        self._dropped = 0  # records dropped since the last batch an origin took
        self._pop: str | None = None  # the PoP's code: one per isolate, read once

    @property
    def queued(self) -> int:
        return len(self._queued)

    def add(
        self,
        note: RequestNote,
        method: str,
        path: str,
        response: EdgeResponse,
        error: PrismError | None,
        timing: str,
        now: float,
    ) -> None:
        """Keep the record of a request this isolate answered itself (``timing``: its
        Server-Timing header)."""
        status = response.status
        layer = "refused" if status in _REFUSED else response.headers.get(h.CACHE_LAYER, "bypass")
        self._queued.append(
            (
                int(now * 1000), note.id, method, path, status, layer,
                "" if error is None else error.code, note.project, note.key_id, note.model,
                note.stream, note.fingerprint, note.usage, timing,
            )
        )  # fmt: skip
        if len(self._queued) > MAX_RECORDS:
            del self._queued[0]
            self._dropped += 1

    def send_soon(self, platform: Platform) -> None:
        """After the response: send what is queued, unless a batch is already out (what
        queues meanwhile goes with the next one)."""
        if self._queued and not self._sending:
            self._sending = True
            platform.wait_until(self._send(platform))

    async def _send(self, platform: Platform) -> None:
        try:
            for _ in range(_SENDS_PER_WAKE):
                await asyncio.sleep(GATHER)
                if not self._queued:
                    return
                batch, self._queued = self._queued, []
                dropped = self._dropped
                if not await self._deliver(platform, batch, dropped):
                    # Kept for the next send, ahead of what came meanwhile, within the bound.
                    kept = (batch + self._queued)[-MAX_RECORDS:]
                    self._dropped += len(batch) + len(self._queued) - len(kept)
                    self._queued = kept
                    return
                self._dropped -= dropped
        finally:
            self._sending = False

    async def _deliver(self, platform: Platform, batch: list[_Row], dropped: int) -> bool:
        if self._pop is None:
            self._pop = platform.location().colo
        body = json.dumps(
            {"fields": FIELDS, "records": batch, "pop": self._pop, "dropped": dropped},
            separators=(",", ":"),
        ).encode()
        digest = body_digest(body)
        for origin in self._origins.plan(platform.location, platform.now()):
            signed = sign_forward(
                self._secret,
                method="POST",
                path=REQUEST_LOG_PATH,
                project="edge",
                key_id="-",
                fingerprint=digest,
                now=platform.now(),
            )
            headers = {"content-type": "application/json", h.FORWARD: signed}
            try:
                async with asyncio.timeout(SEND_TIMEOUT):  # one timer per batch, not request
                    reply = await platform.fetch_origin(
                        "POST", origin.url + REQUEST_LOG_PATH, headers, body
                    )
                    await reply.settle()
            except Exception:  # unreachable or stalled: the next origin, else kept for later
                continue
            if reply.status == 204:
                return True
        return False
