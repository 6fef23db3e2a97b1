"""One provider call shared by every identical request in flight (request coalescing).

``FlightTable.subscribe(key, call)`` joins the flight running for ``key`` or starts
one. Each client holds a ``Subscription`` while it needs the answer::

    async with table.subscribe(key, call) as subscription:
        answer = await subscription.answer(client_gone)      # a JSON client
    ...
    if await subscription.started(client_gone):             # a streaming client
        return subscription.follow(include_usage)           # closing it is the leave

The flight runs in its own task and records what arrives (stream events as they
come, then the answer or the error), so 200 identical misses make one provider
call, every client follows it live at its own pace, and a late joiner gets the
events so far, then the live ones.

Across processes (``leases``: ``origin.routing.flight_lease``), a flight leads the key's
shared call or follows another process's, so identical misses on every worker and
instance sharing the Redis make one provider call too.

Lifecycle: running -> ended (answer or error, every waiter woken at once) ->
forgotten by the table. An answer that is stored stays joinable until its Redis
write has landed, so an identical request that missed Redis just before never
starts a second call; an error is forgotten at once, so the next request starts
afresh. When the last subscriber leaves a running flight, the call is cancelled:
an abandoned generation is not paid for.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

from ..providers.base import UpstreamCompletion
from .flight_lease import FlightLeases
from .shared_call import Call, Flight, FlightRouter
from .subscription import Subscription

__all__ = ["FlightTable", "Store"]

log = logging.getLogger("prism.origin")

# Caches a complete answer: (fingerprint, answer, model, ttl, fallback, semantic) -> the
# pending Redis write, if one was started (the flight stays joinable until it has landed).
Store = Callable[[str, UpstreamCompletion, str, int, bool, Any], "asyncio.Future[Any] | None"]


class FlightTable:
    """The flights running now, by key; identical concurrent requests share one."""

    def __init__(
        self,
        router: FlightRouter,
        store: Store,
        on_join: Callable[[], None] | None = None,
        leases: FlightLeases | None = None,
    ) -> None:
        self._router = router
        self._store = store
        self._on_join = on_join
        self._leases = leases  # None: identical calls are shared within this process only
        self._flights: dict[str, Flight] = {}

    def __len__(self) -> int:
        """Flights still joinable (running, or answered with their store pending)."""
        return len(self._flights)

    def __contains__(self, key: str | None) -> bool:
        """A flight for ``key`` is joinable now."""
        return key is not None and key in self._flights

    def subscribe(self, key: str | None, call: Call) -> Subscription:
        """Join the flight for ``key``, or start one for ``call``; ``key=None`` never joins."""
        if key is not None:
            flight = self._flights.get(key)
            if flight is not None:
                if self._on_join is not None:
                    self._on_join()
                return Subscription(flight)
        flight = Flight(key, call, self._router, self._ended, self._forget, self._leases)
        subscription = Subscription(flight)  # joined before the call's task can run
        if key is not None:
            self._flights[key] = flight
        return subscription

    def _forget(self, flight: Flight) -> None:
        key = flight.key
        if key is not None and self._flights.get(key) is flight:
            del self._flights[key]

    def _ended(self, flight: Flight) -> None:
        call, result = flight.call, flight.result
        if flight.remote:
            # Another process's call answered: it pays, and it stores the answer.
            self._forget(flight)
            if self._on_join is not None:
                self._on_join()
            if call.on_end is not None:
                try:
                    call.on_end.joined()
                except Exception:
                    log.exception("accounting for request %s failed", call.request_id)
            return
        if call.on_end is not None:
            try:
                call.on_end(result, *flight.served_by)
            except Exception:
                log.exception("accounting for request %s failed", call.request_id)
        if call.on_answer is not None and result is not None:
            try:
                call.on_answer(result, flight.served_by[0])
            except Exception:
                log.exception("noting the answer to request %s failed", call.request_id)
        pending = None
        if result is not None and call.storage is not None:
            fingerprint, ttl, semantic = call.storage
            try:
                pending = self._store(
                    fingerprint, result, call.model, ttl, flight.fallback, semantic
                )
            except Exception:
                log.exception("storing the answer for request %s failed", call.request_id)
        if pending is None or pending.done():
            self._forget(flight)
        else:
            # Joinable until the entry is in Redis: a request that missed it just before
            # joins here instead of starting a second provider call.
            pending.add_done_callback(functools.partial(self._stored, flight))

    def _stored(self, flight: Flight, write: asyncio.Future[Any]) -> None:
        self._forget(flight)
