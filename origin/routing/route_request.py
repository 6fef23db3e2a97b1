"""One request's way through its route: order, retries, failover, and the hedge race.

Targets are tried one at a time in health order (``RouteRequest``); what a failure means
for the next attempt is ``origin.routing.retry``'s. While an attempt waits for its first byte a
timer (not a task) stands by; only when the hedge delay passes does ``_Hedge`` start
the next target in a task. If the hedge answers first, the request's own task is
cancelled out of the primary call (closing its connection) and takes the hedge's answer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from prism import PrismError

from ..providers.upstream_http import CONTEXT_LENGTH_EXCEEDED
from .health import Admission
from .hedge import hedge_delay
from .operation import Operation
from .retry import CLIENT_ERROR, RATE_LIMITED, SERVER_ERROR, backoff, outcome_of, retry_after
from .targets import Plan, Routed, Target

__all__ = ["Attempts", "RouteRequest"]


class Attempts(Protocol):
    """What a request's way through its route asks of the router (``origin.routing.router``,
    which depends on this module, never the other way round)."""

    clock: Callable[[], float]  # monotonic seconds
    jitter: Callable[[], float]  # in [0, 1): spreads retry backoffs

    async def attempt(
        self, target: Target, body: dict[str, Any], stream: bool, op: Operation
    ) -> Any:
        """One upstream call, recorded; every failure leaves as a ``PrismError``."""
        ...

    def count_hedge(self, target: Target) -> None: ...

    def discard(self, task: asyncio.Task[Any]) -> None:
        """Stop a losing attempt; close what it opened if it won the race too late."""
        ...


class RouteRequest:
    """The attempts made so far for one request, and what comes next."""

    __slots__ = (
        "attempts",
        "began",
        "body",
        "context_tried",
        "hedged",
        "last_error",
        "op",
        "pending",
        "plan",
        "retried",
        "router",
        "stream",
        "tried",
    )

    def __init__(
        self,
        router: Attempts,
        plan: Plan,
        body: dict[str, Any],
        stream: bool,
        op: Operation,
        tried: list[dict[str, Any]] | None = None,
    ) -> None:
        self.router = router
        self.op = op
        self.plan = plan
        self.body = body
        self.stream = stream
        # Healthy targets (and demoted ones due a probe) in route order, then demoted ones.
        self.pending: deque[tuple[Target, float]] = deque(plan.first_tries)
        if len(plan.targets) > 1 and not all(
            t.provider_health.healthy and t.health.healthy for t in plan.targets
        ):
            self._demoted_last(router.clock())
        self.attempts = 0
        self.hedged = False
        self.context_tried = False
        self.retried: list[Target] = []
        self.last_error: PrismError | None = None
        # Each attempt's outcome, for the request log: (provider, model, status, error, ms).
        self.tried = tried
        self.began: dict[Target, float] = {}

    def _demoted_last(self, now: float) -> None:
        skipped = [entry for entry in self.pending if entry[0].admission(now) == Admission.SKIP]
        if skipped:
            ready = [entry for entry in self.pending if entry not in skipped]
            self.pending = deque(ready + skipped)

    async def run(self) -> Routed[Any]:
        router, pending = self.router, self.pending
        pending[0][0].hedges.refill()
        while True:
            if not pending or self.attempts >= self.plan.max_attempts:
                assert self.last_error is not None
                raise self.last_error
            target, delay = pending.popleft()
            if delay > 0:
                await asyncio.sleep(delay)
            probe = self._start(target)
            if self._may_hedge(target, probe):
                answered = await _Hedge(self, target, probe).race()
                if answered is not None:
                    return self._answer(*answered)
                continue
            try:
                value = await router.attempt(target, self.body, self.stream, self.op)
            except PrismError as error:
                self.failed(target, error)
                continue
            return self._answer(target, value)

    # -- the steps -----------------------------------------------------------------------

    def _start(self, target: Target) -> bool:
        """Count the attempt; if the target is demoted, this call is its probe."""
        self.attempts += 1
        if self.tried is not None:
            self.began[target] = self.router.clock()
        probe = False
        for health in (target.provider_health, target.health):
            if not health.healthy:
                health.start_probe(self.router.clock())
                probe = True
        return probe

    def _may_hedge(self, target: Target, probe: bool) -> bool:
        """Whether a hedge may follow ``target``: a next healthy target, budget left."""
        if self.hedged or not self.plan.hedge or not target.spec.hedge:
            return False
        if self.attempts >= self.plan.max_attempts or not self.pending:
            return False
        following, delay = self.pending[0]
        if delay > 0 or following is target:
            return False
        if not (following.provider_health.healthy and following.health.healthy) and (
            following.admission(self.router.clock()) == Admission.SKIP
        ):
            return False
        return probe or target.hedges.available  # a probe may always be hedged

    def _hedge_delay(self, target: Target) -> float:
        fixed = self.plan.hedge_delay or target.spec.hedge_delay
        return hedge_delay(target.health, self.stream, fixed, target.spec.hedge_percentile)

    def failed(self, target: Target, error: PrismError) -> None:
        """Decide what the failure means for the next attempt (or answer with it)."""
        self.last_error = error
        self._note(target, error.status, error.code)
        outcome = outcome_of(error)
        spec = target.spec
        if outcome == CLIENT_ERROR:
            fallback = self.plan.context_fallback
            if error.code == CONTEXT_LENGTH_EXCEEDED and fallback and not self.context_tried:
                self.context_tried = True
                self.pending.appendleft((fallback, 0.0))
                return
            raise error  # the caller's answer: the same request fails the same way elsewhere
        now = self.router.clock()
        if outcome == SERVER_ERROR:
            # One more try on the same provider (unless that failure demoted it).
            if (
                self.retried.count(target) < spec.retries
                and target.admission(now) != Admission.SKIP
            ):
                self.retried.append(target)
                jitter = self.router.jitter()
                self.pending.appendleft((target, backoff(spec.retry_backoff, jitter)))
        elif outcome == RATE_LIMITED:
            # Never make the client wait while another target could answer now.
            others = any(
                t.admission(now) != Admission.SKIP for t, _ in self.pending if t is not target
            )
            seconds = retry_after(error)
            if (
                not others
                and seconds is not None
                and seconds <= spec.max_retry_after
                and target not in self.retried
            ):
                self.retried.append(target)
                self.pending.appendleft((target, seconds))

    def _note(self, target: Target, status: int, code: str | None) -> None:
        tried = self.tried
        if tried is None:
            return
        began = self.began.get(target)
        ms = 0.0 if began is None else round((self.router.clock() - began) * 1000, 3)
        attempt: dict[str, Any] = {"provider": target.name, "model": target.model}
        attempt["status"] = status
        if code is not None:
            attempt["error"] = code
        attempt["ms"] = ms
        tried.append(attempt)

    def _answer(self, target: Target, value: Any) -> Routed[Any]:
        self._note(target, 200, None)
        return Routed(
            value,
            target.name,
            target.label,
            fallback=target is not self.plan.targets[0],
            model=target.model,
            attempts=self.attempts,
            hedged=self.hedged,
        )


class _Hedge:
    """One attempt awaited in the request's own task, with a hedge on a timer."""

    __slots__ = ("hedge", "me", "primary", "primary_done", "probe", "request", "target", "won")

    def __init__(self, request: RouteRequest, primary: Target, probe: bool) -> None:
        self.request = request
        self.primary = primary
        self.probe = probe
        task = asyncio.current_task()
        assert task is not None
        self.me = task
        self.hedge: asyncio.Task[Any] | None = None
        self.target: Target | None = None
        self.primary_done = False
        self.won = False

    async def race(self) -> tuple[Target, Any] | None:
        """The winner and its answer; None when both failed (their failures decided)."""
        request, primary = self.request, self.primary
        router = request.router
        loop = asyncio.get_running_loop()
        timer = loop.call_later(request._hedge_delay(primary), self._start)
        try:
            try:
                value = await router.attempt(primary, request.body, request.stream, request.op)
            except PrismError as error:
                self.primary_done = True
                timer.cancel()
                request.failed(primary, error)  # may answer with it (then the hedge goes)
            except asyncio.CancelledError:
                self.primary_done = True
                if self.won and self.me.uncancel() == 0:  # our own cancel, nothing else
                    return self._take_hedge()
                raise
            else:
                self.primary_done = True
                return primary, value
            if self.hedge is None:
                return None
            try:
                await self.hedge
            except PrismError as error:
                assert self.target is not None
                self.hedge = None
                request.failed(self.target, error)
                return None
            return self._take_hedge()
        finally:
            timer.cancel()
            if self.hedge is not None:
                router.discard(self.hedge)

    def _take_hedge(self) -> tuple[Target, Any]:
        hedge, target = self.hedge, self.target
        assert hedge is not None and target is not None
        self.hedge = None
        return target, hedge.result()

    def _start(self) -> None:
        """The hedge delay passed with no first byte: start the next target beside it."""
        request, primary = self.request, self.primary
        if self.primary_done or not request._may_hedge(primary, self.probe):
            return
        following, _ = request.pending.popleft()
        primary.hedges.take()  # a probe's hedge may run the bucket dry; it refills
        request.hedged = True
        request._start(following)
        router = request.router
        router.count_hedge(following)
        self.target = following
        self.hedge = asyncio.ensure_future(
            router.attempt(following, request.body, request.stream, request.op)
        )
        self.hedge.add_done_callback(self._hedge_done)

    def _hedge_done(self, task: asyncio.Task[Any]) -> None:
        if self.primary_done or task.cancelled() or task.exception() is not None:
            return
        # The hedge answered first: stop the primary where it waits (its connection closes).
        self.won = True
        self.me.cancel()
