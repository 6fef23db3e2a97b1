"""Forwarding a request the PoP cannot answer to the origin: signed, nearest origin first,
the next one when it does not answer, its answer streamed back untouched.

Telling a slow answer from a dead origin: with another origin to ask, an answer that has
not started after ``origin_probe_after`` has the origin's liveness probed (``GET
/healthz`` on its public port, answered from its event loop, for at most
``origin_probe_timeout``). A 200 means a slow provider: the request keeps waiting, up to
``origin_timeout``. Anything else means the origin is down: it is marked so, and the same
request (the edge holds its body) goes to the next origin; the first attempt is abandoned
(a late answer to it is dropped; the origin's store of it is harmless). The probe rides
on the request's stage timer: a forward that is answered in time arms nothing more. An
attempt whose alarm rings after another request of the isolate found its origin down
fails over without asking again. An avoided origin is asked again in the background
(``Origins.due``, on the request's ``waitUntil``), so its answer brings traffic back and
no request waits to find out.

Retried at the same origin, never passed on: a forward the origin refused as expired (it
read the request late; signed anew, at most twice), and a connection that failed before
the answer was whole (once: a pooled connection the origin had just closed, or one lost
in the middle of a JSON answer, which is read whole before the client gets its head; a
stream is passed through as it comes, and once its head is sent it cannot be asked again). A forward
the origin refuses for any other reason (a signature made with another secret) is the
gateway's fault, not the client's: a 502 ``invalid_forward`` with the origin's reason,
never its 401.
"""

from __future__ import annotations

import asyncio
import json

from prism import KeyIdentity, UpstreamError, UpstreamTimeoutError, sign_forward
from prism import headers as h
from prism.routes import HEALTH_PATH
from prism.trace_context import TRACEPARENT, edge_trace_headers

from .deadlines import DeadlineTimer, Stage
from .origin_marks import PopMarks
from .origins import ORIGIN_DOWN, Origin, Origins
from .platform import EdgeRequest, EdgeResponse, OriginReply, Platform
from .request_log import RequestNote
from .settings import EdgeSettings
from .timings import elapsed_ms

__all__ = ["OriginForwarder"]

# Request headers the origin may need; everything else (cookies, the API key) stays here.
_FORWARDED = ("content-type", "cache-control", "accept", "openai-organization")
# Failing over after a timeout stays under the ~100 s Cloudflare allows a response to
# start; a failover gets at least this much time, else the last failure is the answer.
_ORIGIN_BUDGET = 95.0
_MIN_ATTEMPT = 1.0
_RESIGNS = 2  # forwards refused as expired, signed anew, per origin
_FRESH_CONNECTIONS = 1  # connections failed before a whole JSON answer, asked again, per origin
_SSE = "text/event-stream"  # streamed through as it comes; every other answer read whole first


class _Probe:
    """One attempt's liveness probe, started by its stage's alarm (the slow path only)."""

    __slots__ = ("down", "forwarder", "origin", "platform", "sent", "task")

    def __init__(
        self, forwarder: OriginForwarder, platform: Platform, origin: Origin, sent: float
    ) -> None:
        self.forwarder = forwarder
        self.platform = platform
        self.origin = origin
        self.sent = sent
        self.down = False
        self.task: asyncio.Task[None] | None = None

    def ring(self, stage: Stage) -> None:
        if self.forwarder.origins.failed_since(self.origin, self.sent):
            # Another request of this isolate found it down meanwhile: no need to ask.
            self.down = True
            stage.cut()
            return
        self.task = asyncio.ensure_future(self.run(stage))

    async def run(self, stage: Stage) -> None:
        forwarder = self.forwarder
        if await forwarder.alive(self.platform, self.origin):
            forwarder.origins.answered(self.origin)
        elif stage.running:
            self.down = True
            stage.cut()

    def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()


class OriginForwarder:
    """One per isolate: the forward secret, the origins (which are down), the timer."""

    def __init__(self, settings: EdgeSettings, origins: Origins, stages: DeadlineTimer) -> None:
        self._secret = settings.forward_secret
        self._timeout = settings.origin_timeout
        self._budget = max(settings.origin_timeout, _ORIGIN_BUDGET)
        self._kv_timeout = settings.kv_timeout
        self._trace = settings.trace
        self._probe_after = settings.origin_probe_after or None
        self.probe_timeout = settings.origin_probe_timeout
        self.origins = origins
        # Shared with the PoP's other isolates only when there is a choice of origin.
        self._marks = PopMarks(origins) if len(origins.origins) > 1 else None
        self._stages = stages

    async def forward(
        self,
        method: str,
        path: str,
        request: EdgeRequest,
        platform: Platform,
        identity: KeyIdentity,
        fp: str,
        body: bytes | None,
        note: RequestNote,
    ) -> EdgeResponse:
        """``method path`` at the origin (the route's own spelling, no query: the API
        routes take none), signed for exactly that method, path and fingerprint."""
        timings = note.timings
        headers = {name: request.headers[name] for name in _FORWARDED if name in request.headers}
        # The id the client is told (given or made here): the origin's record is found by it.
        headers[h.REQUEST_ID] = note.id
        started = platform.now()
        if self._trace:
            # The edge's span in the request's trace: the client's traceparent continued (or
            # a new trace), and its stages so far for the origin to rebuild it from.
            headers.update(edge_trace_headers(request.headers.get(TRACEPARENT), started, timings))
        elif TRACEPARENT in request.headers:  # the origin's spans join the client's trace
            headers[TRACEPARENT] = request.headers[TRACEPARENT]
        marks = self._marks
        if marks is not None and marks.stale(started):
            try:
                async with self._stages.within(self._kv_timeout):
                    await marks.read(platform, started)
            except Exception as error:  # this isolate's own marks still hold
                platform.log_error(f"prism edge: origin marks unread: {error!r}")
        # Nearest origin first; the next one when it does not answer (see edge/origins.py).
        origins = self.origins
        plan = origins.plan(platform.location, started)
        if origins.down_until:  # a dict's truth: no call when all is well
            for avoided in origins.due(started):
                platform.wait_until(self._recheck(platform, avoided))
        deadline = started + self._budget
        try:
            for attempt, origin in enumerate(plan, 1):
                tried = platform.now()
                last = attempt == len(plan)
                answer = await self._ask(
                    origin, method, path, headers, body, platform, identity, fp, deadline, last
                )
                if not isinstance(answer, UpstreamError):
                    reply = answer
                    if reply.status not in ORIGIN_DOWN or not _origin_down(reply):
                        origins.answered(origin)
                        break
                    if last:  # every origin is down: the last one's reply is passed on as it is
                        origins.failed(origin, platform.now())
                        break
                    answer = UpstreamError("The Prism origin is down.", code="origin_unreachable")
                origins.failed(origin, platform.now())
                if origin.region:
                    timings.append(
                        (f'origin-error;desc="{origin.region}"', elapsed_ms(tried, platform.now()))
                    )
                if last or deadline - platform.now() < _MIN_ATTEMPT:
                    raise answer
        finally:
            if marks is not None:
                marks.share(platform, platform.now())
        timings.append(
            (
                f'origin;desc="{origin.region}"' if origin.region else "origin",
                elapsed_ms(tried, platform.now()),
            )
        )
        out = reply.headers()
        out.pop("content-length", None)  # the runtime sets it for what it actually sends
        out.pop(h.ENTRY_EXPIRES, None)  # for this edge only (read from the reply itself)
        out.setdefault(h.CACHE_LAYER, "bypass")
        if origin.region:
            out[h.ORIGIN_REGION] = origin.region
        # A semantic hit names the entry that answered (another question's), as the origin said.
        if fp and out[h.CACHE_LAYER] != "semantic":
            out[h.CACHE_KEY] = fp[: h.CACHE_KEY_PREFIX_LEN]
        return EdgeResponse(reply.status, out, passthrough=reply)

    async def alive(self, platform: Platform, origin: Origin) -> bool:
        """Whether ``origin`` answers its liveness probe within the probe timeout."""
        try:
            async with asyncio.timeout(self.probe_timeout):
                reply = await platform.fetch_origin("GET", origin.url + HEALTH_PATH, {}, None)
            return reply.status == 200
        except Exception:  # refused, reset, or no answer in time
            return False

    async def _recheck(self, platform: Platform, origin: Origin) -> None:
        """An avoided origin asked again, after the response: back if it answers."""
        if await self.alive(platform, origin):
            self.origins.answered(origin)
        else:
            self.origins.failed(origin, platform.now())
        if self._marks is not None:
            await self._marks.publish(platform, platform.now())

    async def _ask(
        self,
        origin: Origin,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes | None,
        platform: Platform,
        identity: KeyIdentity,
        fp: str,
        deadline: float,
        last: bool,
    ) -> OriginReply | UpstreamError:
        """One origin's answer (whatever its status), or why there is none; asked again
        for what was no fault of the origin's answer (see the module's docstring)."""
        resigns, fresh = _RESIGNS, _FRESH_CONNECTIONS
        # The last origin is waited for: there is nobody else to ask.
        probe_after = None if last else self._probe_after
        while True:
            tried = platform.now()
            # Signed per attempt: the header lives a few seconds, a failover may come later.
            headers[h.FORWARD] = sign_forward(
                self._secret,
                method=method,
                path=path,
                project=identity.project,
                key_id=identity.key_id,
                fingerprint=fp,
                now=tried,
            )
            wait = min(self._timeout, deadline - tried)
            if probe_after is None:
                probe, stage = None, self._stages.within(wait)
            else:
                probe = _Probe(self, platform, origin, tried)
                stage = self._stages.within(wait, probe_after, probe.ring)
            try:
                async with stage:
                    reply = await platform.fetch_origin(method, origin.url + path, headers, body)
                    if _SSE not in (reply.header("content-type") or ""):
                        await reply.settle()
            except TimeoutError:
                if probe is not None and probe.down:
                    return UpstreamError(
                        "The Prism origin did not answer its liveness probe.", code="origin_down"
                    )
                return UpstreamTimeoutError(
                    f"The Prism origin did not start its answer in time ({wait:g} s).",
                    code="origin_timeout",
                )
            except Exception:
                if fresh and deadline - platform.now() >= _MIN_ATTEMPT:
                    fresh -= 1
                    continue
                return UpstreamError(
                    "The Prism origin is unreachable from this edge.", code="origin_unreachable"
                )
            finally:
                if probe is not None:
                    probe.stop()
            if (
                reply.status == 401
                and resigns
                and reply.header(h.FORWARD_REJECTED) == "expired"
                and deadline - platform.now() >= _MIN_ATTEMPT
            ):
                resigns -= 1
                await reply.text()  # read, so its connection is free for the next one
                continue
            if reply.status == 401 and reply.header(h.FORWARD_REJECTED) is not None:
                # The origin refused this edge's signing, not the client's key: a gateway
                # fault that keeps the origin's reason, never a 401 an SDK takes for a bad key.
                return UpstreamError(
                    f"The Prism origin refused this edge's forward: {await _reason(reply)}",
                    code="invalid_forward",
                )
            return reply


async def _reason(reply: OriginReply) -> str:
    """The message of an OpenAI-style error body (its status when there is none)."""
    try:
        error = json.loads(await reply.text())["error"]
        return str(error["message"])
    except Exception:  # any body at all: the refusal stands, only its words are lost
        return f"HTTP {reply.status}"


def _origin_down(reply: OriginReply) -> bool:
    """A 502/503/504 that says the origin could not serve: from what stands in front of it
    (no Prism contract header: a load balancer with no healthy target), or the origin's
    own refusal while its event loop lags. Any other answer of the origin is final."""
    return reply.header(h.CACHE_LAYER) is None or reply.header(h.ORIGIN_BUSY) is not None
