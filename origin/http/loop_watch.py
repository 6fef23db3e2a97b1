"""The event loop watching itself: how late it runs, and a sick origin saying so.

A timer ticks every ``TICK`` seconds on the loop; how late each tick runs is the loop's
lag (``prism_origin_event_loop_lag_seconds``). Two ticks in a row later than the limit
(``PRISM_LOOP_LAG_LIMIT``) mean the loop is overloaded or keeps blocking: from then until
a tick runs on time, new requests on the public listener get a fast 503 with
``Retry-After`` and ``x-prism-origin-busy`` (the edge asks another origin), while the
requests in flight finish. One long stall (a process stopped and resumed, a pause of
the collector) is one late tick: what arrives after it is served.

A loop that does not run at all answers nothing, ``/healthz`` included: that is what
the edge's probe and the load balancer's health check see. Each tick also pings the
supervisor's watchdog when there is one (systemd's, ``origin.http.watchdog``): a loop
blocked past ``WatchdogSec`` gets the process restarted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prism import UpstreamUnavailableError
from prism import headers as h

from ..metrics import Metrics

__all__ = ["TICK", "LoopWatch"]

TICK = 0.1  # seconds between ticks: the lag is known to a tenth of a second
_LATE_TICKS = 2  # ticks in a row past the limit before new requests are refused


class LoopWatch:
    """Started in the app's lifespan (on its loop), closed at shutdown. ``lagging`` is a
    plain attribute, read once per request."""

    __slots__ = ("_due", "_handle", "_late", "_limit", "_metrics", "lag", "lagging", "on_tick")

    def __init__(
        self,
        limit: float,
        metrics: Metrics | None = None,
        on_tick: Callable[[], None] | None = None,
    ) -> None:
        self._limit = limit  # 0: never refuse (the lag is still measured)
        self._metrics = metrics
        self.on_tick = on_tick  # e.g. the watchdog's ping
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._late = 0
        self.lag = 0.0
        self.lagging = False

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._due = loop.time() + TICK
        self._handle = loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self.lag = lag = max(0.0, now - self._due)
        if self._limit and lag > self._limit:
            self._late += 1
            self.lagging = self._late >= _LATE_TICKS
        else:
            self._late = 0
            self.lagging = False
        if self._metrics is not None:
            self._metrics.loop_lag.set(lag)
        if self.on_tick is not None:
            self.on_tick()
        self._due = now + TICK
        self._handle = loop.call_at(self._due, self._tick)

    def refusal(self) -> UpstreamUnavailableError:
        """What a new request is told while the loop lags (counted)."""
        if self._metrics is not None:
            self._metrics.loop_lag_refused.inc()
        return UpstreamUnavailableError(
            f"This origin is overloaded (its event loop runs {self.lag:.1f} s late); "
            "retry shortly.",
            code="origin_overloaded",
            headers={"retry-after": "1", h.ORIGIN_BUSY: f"{self.lag * 1000:.0f}"},
        )

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
