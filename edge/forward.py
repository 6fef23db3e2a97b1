"""Forwarding a request the PoP cannot answer to the origin: signed, nearest origin first,
the next one when it does not answer, its answer streamed back untouched."""

from __future__ import annotations

from prism import KeyIdentity, UpstreamError, UpstreamTimeoutError, sign_forward
from prism import headers as h
from prism.trace_context import TRACEPARENT, edge_trace_headers

from .deadlines import DeadlineTimer
from .origins import ORIGIN_DOWN, Origins
from .platform import EdgeRequest, EdgeResponse, Platform
from .settings import EdgeSettings
from .timings import Timings, elapsed_ms

__all__ = ["OriginForwarder"]

# Request headers the origin may need; everything else (cookies, the API key) stays here.
_FORWARDED = ("content-type", "cache-control", "accept", "openai-organization")
# Failing over after a timeout stays under the ~100 s Cloudflare allows a response to
# start; a failover gets at least this much time, else the last failure is the answer.
_ORIGIN_BUDGET = 95.0
_MIN_ATTEMPT = 1.0


class OriginForwarder:
    """One per isolate: the forward secret, the origins (which to avoid), the timer."""

    def __init__(self, settings: EdgeSettings, origins: Origins, stages: DeadlineTimer) -> None:
        self._secret = settings.forward_secret
        self._timeout = settings.origin_timeout
        self._budget = max(settings.origin_timeout, _ORIGIN_BUDGET)
        self._trace = settings.trace
        self._origins = origins
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
        timings: Timings,
    ) -> EdgeResponse:
        """``method path`` at the origin (the route's own spelling, no query: the API
        routes take none), signed for exactly that method, path and fingerprint."""
        headers = {name: request.headers[name] for name in _FORWARDED if name in request.headers}
        if h.REQUEST_ID in request.headers:
            headers[h.REQUEST_ID] = request.headers[h.REQUEST_ID]
        started = platform.now()
        if self._trace:
            # The edge's span in the request's trace: the client's traceparent continued (or
            # a new trace), and its stages so far for the origin to rebuild it from.
            headers.update(edge_trace_headers(request.headers.get(TRACEPARENT), started, timings))
        elif TRACEPARENT in request.headers:  # the origin's spans join the client's trace
            headers[TRACEPARENT] = request.headers[TRACEPARENT]
        # Nearest origin first; the next one when it does not answer (see edge/origins.py).
        origins = self._origins
        plan = origins.plan(platform.location, started)
        deadline = started + self._budget
        for attempt, origin in enumerate(plan, 1):
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
            last = attempt == len(plan)
            wait = min(self._timeout, deadline - tried)
            try:
                async with self._stages.within(wait):
                    reply = await platform.fetch_origin(method, origin.url + path, headers, body)
            except TimeoutError:
                failure: UpstreamError = UpstreamTimeoutError(
                    f"The Prism origin did not start its answer in time ({wait:g} s).",
                    code="origin_timeout",
                )
            except Exception:
                failure = UpstreamError(
                    "The Prism origin is unreachable from this edge.", code="origin_unreachable"
                )
            else:
                # Any answer but a 502/503/504 without the origin's own headers (which never
                # reached Prism: a proxy in front of it says the origin is down) is final.
                if reply.status not in ORIGIN_DOWN or reply.header(h.CACHE_LAYER) is not None:
                    origins.answered(origin)
                    break
                if last:  # every origin is down: the last one's reply is passed on as it is
                    origins.failed(origin, platform.now())
                    break
                failure = UpstreamError("The Prism origin is down.", code="origin_unreachable")
            origins.failed(origin, platform.now())
            if origin.region:
                timings.append(
                    (f'origin-error;desc="{origin.region}"', elapsed_ms(tried, platform.now()))
                )
            if last or deadline - platform.now() < _MIN_ATTEMPT:
                raise failure
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
