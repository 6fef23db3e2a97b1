"""Chooses the target for a model, retries, hedges and fails over until the first byte.

For each request the route's targets are ordered by health (``origin.health``): healthy
ones in the route's order, demoted ones last (one request a second probes a demoted
target in its own place). The first is called; what a failure means for the next call
is ``origin.retry``'s; a target slow to its first byte gets a hedge (``origin.hedge``).
A stream counts as answered at its first body bytes (``origin.first_byte``). Every
path is bounded: at most ``max_attempts`` upstream calls, each within its provider's
timeouts, and waits only for a short backoff or ``Retry-After``.

The hot path with no faults calls one target and creates no task unless a hedge is
possible (another healthy target and a hedge token), and then only the primary's.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from prism import NotFoundError, PrismError, UpstreamError

from .first_byte import StartedEvents, first_token_timeout, open_started
from .health import Admission, Health, HealthPolicy, ProviderHealth, State
from .hedge import HedgeBudget, hedge_delay
from .metrics import Metrics
from .providers._http import CONTEXT_LENGTH_EXCEEDED
from .providers.base import ChatProvider, ProviderSpec, UpstreamCompletion, UpstreamStream
from .providers.config import ProviderConfig
from .retry import CLIENT_ERROR, RATE_LIMITED, SERVER_ERROR, backoff, classify, retry_after

__all__ = ["Routed", "Router"]

log = logging.getLogger("prism.origin")

T = TypeVar("T")

_STATE_GAUGE = {State.HEALTHY: 0, State.PROBING: 1, State.DEMOTED: 2}
_TARGETS_PER_PROVIDER = 256  # upstream models tracked per provider ("*" routes pass names on)
_PLANS = 1024  # resolved public model names remembered


@dataclass(frozen=True, slots=True)
class Routed(Generic[T]):
    """What a target answered, and which target it was."""

    value: T
    provider: str  # the provider's name in the configuration
    label: str  # what ``x-prism-provider`` says
    fallback: bool = False  # not the route's first target: stored only briefly
    model: str = ""  # the upstream model that answered
    attempts: int = 1  # upstream calls made for this answer (retries and hedges included)
    hedged: bool = False  # a hedge was started


class _Target:
    """One provider:model pair: its health, its hedge budget, its labelled counters."""

    __slots__ = ("counters", "health", "hedges", "label", "model", "name", "provider", "spec")

    def __init__(self, provider: ChatProvider, model: str, health: Health) -> None:
        self.provider = provider
        self.spec: ProviderSpec = provider.spec
        self.name = provider.spec.name
        self.label = provider.spec.label or provider.spec.name
        self.model = model
        self.health = health
        self.hedges = HedgeBudget()
        self.counters: dict[str, Any] = {}

    def admission(self, provider_health: Health, now: float) -> Admission:
        first, second = provider_health.admission(now), self.health.admission(now)
        return first if first.value >= second.value else second


@dataclass(frozen=True, slots=True)
class _Plan:
    targets: tuple[_Target, ...]
    context_fallback: _Target | None
    hedge: bool
    hedge_delay: float | None
    max_attempts: int


class Router:
    def __init__(
        self,
        config: ProviderConfig,
        providers: Mapping[str, ChatProvider],
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
        policy: HealthPolicy | None = None,
    ) -> None:
        self._config = config
        self._providers = providers
        self._metrics = metrics
        self._clock = clock
        self._jitter = jitter
        self._policy = policy or HealthPolicy()
        self.health: dict[str, ProviderHealth] = {
            name: ProviderHealth(name, self._policy, self._state_changed, clock)
            for name in providers
        }
        for name in providers:
            metrics.provider_state.labels(name).set(0)
        self._targets: dict[tuple[str, str], _Target] = {}
        self._plans: dict[str, _Plan] = {}
        self._seconds: dict[tuple[str, bool], Any] = {}
        self._losers: set[asyncio.Task[Any]] = set()

    # -- the public interface (the flight's) ---------------------------------------------

    async def complete(self, body: dict[str, Any], model: str) -> Routed[UpstreamCompletion]:
        """A complete answer from the model's first working target."""
        return cast(Routed[UpstreamCompletion], await _Request(self, model, body, False).run())

    async def stream(self, body: dict[str, Any], model: str) -> Routed[UpstreamStream]:
        """A stream whose first bytes have arrived; failover happens only before them."""
        return cast(Routed[UpstreamStream], await _Request(self, model, body, True).run())

    def stream_failed(self, routed: Routed[UpstreamStream], error: PrismError) -> None:
        """A stream that broke after it started (cut, malformed, unfinished) counts against
        its target like a failed call (once, however many times it is reported)."""
        events = routed.value.events
        if isinstance(events, StartedEvents):
            events.report(error)
        else:
            self.health[routed.provider].record(self._clock(), False, error=_detail(error))

    def snapshot(self) -> dict[str, dict[str, object]]:
        """Per provider: state, reason, error rate, first-byte percentiles, and its targets."""
        return {name: health.snapshot() for name, health in self.health.items()}

    # -- routes and targets --------------------------------------------------------------

    def _plan(self, model: str) -> _Plan:
        plan = self._plans.get(model)
        if plan is not None:
            return plan
        route = self._config.route(model)
        if route is None or not route.targets:
            raise NotFoundError(
                f"The model '{model}' is not served by this gateway.",
                param="model",
                code="model_not_found",
            )
        context = route.context_fallback
        plan = _Plan(
            targets=tuple(self._target(t.provider, t.model or model) for t in route.targets),
            context_fallback=None
            if context is None
            else self._target(context.provider, context.model or model),
            hedge=route.hedge,
            hedge_delay=route.hedge_delay,
            max_attempts=route.max_attempts,
        )
        if len(self._plans) >= _PLANS:
            self._plans.clear()
        self._plans[model] = plan
        return plan

    def _target(self, provider: str, model: str) -> _Target:
        target = self._targets.get((provider, model))
        if target is None:
            owner = self.health[provider]
            if len(owner.targets) >= _TARGETS_PER_PROVIDER:
                oldest = next(iter(owner.targets))
                del owner.targets[oldest]
                self._targets.pop((provider, oldest), None)
            health = Health(f"{provider}:{model}", self._policy, self._state_changed, self._clock)
            owner.targets[model] = health
            target = self._targets[(provider, model)] = _Target(
                self._providers[provider], model, health
            )
        return target

    # -- one attempt ---------------------------------------------------------------------

    async def _attempt(self, target: _Target, body: dict[str, Any], stream: bool) -> Any:
        """One upstream call, recorded; every failure leaves as a ``PrismError``."""
        started = self._clock()
        try:
            if stream:
                async with asyncio.timeout(target.spec.first_token_limit):
                    value: Any = await open_started(
                        target.provider, body, target.model, lambda e: self._broken(target, e)
                    )
            else:
                value = await target.provider.complete(body, target.model)
        except PrismError as error:
            self._record(target, started, stream, error)
            raise
        except TimeoutError:  # the first-token limit (providers map their own timeouts)
            timed_out = first_token_timeout(target.provider)
            self._record(target, started, stream, timed_out)
            raise timed_out from None
        except asyncio.CancelledError:
            self._count(target, "cancelled")  # a hedge that lost, or the client left
            raise
        except Exception:
            # A bug in an adapter must not escape as-is (least of all from a hedge task).
            log.exception("provider '%s' failed unexpectedly", target.name)
            failed = UpstreamError(
                f"Provider '{target.name}' failed unexpectedly.", code="upstream_adapter_error"
            )
            self._record(target, started, stream, failed)
            raise failed from None
        self._record(target, started, stream, None)
        return value

    def _record(
        self, target: _Target, started: float, stream: bool, error: PrismError | None
    ) -> None:
        now = self._clock()
        seconds = now - started
        if error is None:
            outcome, ok, detail = "ok", True, None
        else:
            outcome = classify(error)
            ok = outcome == CLIENT_ERROR  # the provider answered; the request was wrong
            detail = None if ok else _detail(error)
        first_byte = seconds if error is None else None
        target.health.record(now, ok, first_byte, stream, detail)
        self.health[target.name].record(now, ok, first_byte, stream, detail)
        key = (target.name, ok)
        histogram = self._seconds.get(key)
        if histogram is None:
            histogram = self._seconds[key] = self._metrics.provider_seconds.labels(
                target.name, "ok" if ok else "error"
            )
        histogram.observe(seconds)
        self._count(target, outcome)

    def _count(self, target: _Target, outcome: str) -> None:
        counter = target.counters.get(outcome)
        if counter is None:
            counter = target.counters[outcome] = self._metrics.provider_attempts.labels(
                target.name, outcome
            )
        counter.inc()

    def _broken(self, target: _Target, error: PrismError) -> None:
        """A stream that failed after its first bytes: no retry (the client has bytes)."""
        now, detail = self._clock(), _detail(error)
        target.health.record(now, False, error=detail)
        self.health[target.name].record(now, False, error=detail)
        self._metrics.provider_stream_failures.labels(target.name).inc()

    def _discard(self, task: asyncio.Task[Any]) -> None:
        """Stop a losing attempt now; close what it opened if it won the race too late."""
        task.cancel()
        self._losers.add(task)
        task.add_done_callback(self._reap)

    def _reap(self, task: asyncio.Task[Any]) -> None:
        self._losers.discard(task)
        if task.cancelled() or task.exception() is not None:
            return
        value = task.result()
        if isinstance(value, UpstreamStream):
            closing = asyncio.ensure_future(value.aclose())
            self._losers.add(closing)
            closing.add_done_callback(self._losers.discard)

    def _state_changed(self, health: Health, old: State, new: State) -> None:
        if isinstance(health, ProviderHealth):
            self._metrics.provider_state.labels(health.name).set(_STATE_GAUGE[new])
        if new is State.DEMOTED and old is State.HEALTHY:
            log.warning("provider target %s demoted: %s", health.name, health.reason)
        elif new is State.HEALTHY:
            log.warning("provider target %s recovered", health.name)


def _detail(error: PrismError) -> str:
    return f"{error.status} {error.code}"


class _Request:
    """One request's way through its route: the attempts so far and what comes next."""

    __slots__ = (
        "attempts",
        "body",
        "context_tried",
        "hedged",
        "last_error",
        "pending",
        "plan",
        "retried",
        "router",
        "stream",
    )

    def __init__(self, router: Router, model: str, body: dict[str, Any], stream: bool) -> None:
        self.router = router
        self.plan = plan = router._plan(model)
        self.body = body
        self.stream = stream
        now = router._clock()
        # Healthy targets (and demoted ones due a probe) in route order, then demoted ones.
        ready: list[tuple[_Target, float]] = []
        last: list[tuple[_Target, float]] = []
        for target in plan.targets:
            admission = target.admission(router.health[target.name], now)
            (last if admission is Admission.SKIP else ready).append((target, 0.0))
        self.pending: deque[tuple[_Target, float]] = deque(ready)
        self.pending.extend(last)
        self.attempts = 0
        self.hedged = False
        self.context_tried = False
        self.retried: list[_Target] = []
        self.last_error: PrismError | None = None

    async def run(self) -> Routed[Any]:
        router, pending = self.router, self.pending
        pending[0][0].hedges.refill()
        racing: dict[asyncio.Task[Any], _Target] = {}
        loop = asyncio.get_running_loop()
        hedge_at = 0.0
        try:
            while True:
                if not racing:
                    if not pending or self.attempts >= self.plan.max_attempts:
                        assert self.last_error is not None
                        raise self.last_error
                    target, delay = pending.popleft()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    probe = self._start(target)
                    call = router._attempt(target, self.body, self.stream)
                    if not self._may_hedge(target, probe):
                        try:
                            value = await call
                        except PrismError as error:
                            self._failed(target, error)
                            continue
                        return self._answer(target, value)
                    racing[asyncio.ensure_future(call)] = target
                    hedge_at = loop.time() + self._hedge_delay(target)
                timeout = None
                if len(racing) == 1 and not self.hedged:
                    timeout = max(0.0, hedge_at - loop.time())
                done, _ = await asyncio.wait(
                    racing, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    self._hedge(racing)
                    continue
                # A success among them wins, whatever else finished in the same step.
                for task in sorted(done, key=lambda t: t.exception() is not None):
                    target = racing.pop(task)
                    failure = task.exception()
                    if failure is None:
                        return self._answer(target, task.result())
                    assert isinstance(failure, PrismError)
                    self._failed(target, failure)
        finally:
            for task in racing:
                router._discard(task)

    # -- the steps -----------------------------------------------------------------------

    def _start(self, target: _Target) -> bool:
        """Count the attempt; if the target is demoted, this call is its probe."""
        self.attempts += 1
        now = self.router._clock()
        probe = False
        for health in (self.router.health[target.name], target.health):
            if health.state is not State.HEALTHY:
                health.start_probe(now)
                probe = True
        return probe

    def _may_hedge(self, target: _Target, probe: bool) -> bool:
        """Whether a hedge may follow ``target``: a next healthy target, budget left."""
        if self.hedged or not self.plan.hedge or not target.spec.hedge:
            return False
        if self.attempts >= self.plan.max_attempts or not self.pending:
            return False
        following, delay = self.pending[0]
        if delay > 0 or following is target:
            return False
        router = self.router
        admission = following.admission(router.health[following.name], router._clock())
        if admission is Admission.SKIP:
            return False
        return probe or target.hedges.available

    def _hedge_delay(self, target: _Target) -> float:
        fixed = self.plan.hedge_delay or target.spec.hedge_delay
        return hedge_delay(target.health, self.stream, fixed, target.spec.hedge_percentile)

    def _hedge(self, racing: dict[asyncio.Task[Any], _Target]) -> None:
        """The racing target is slow to its first byte: start the next one beside it."""
        (slow,) = racing.values()
        following, _ = self.pending.popleft()
        slow.hedges.take()  # a probe's hedge may run the bucket dry; it refills
        self.hedged = True
        self._start(following)
        self.router._metrics.provider_hedges.labels(following.name).inc()
        racing[asyncio.ensure_future(self.router._attempt(following, self.body, self.stream))] = (
            following
        )

    def _failed(self, target: _Target, error: PrismError) -> None:
        """Decide what the failure means for the next attempt (or answer with it)."""
        self.last_error = error
        outcome = classify(error)
        spec = target.spec
        if outcome == CLIENT_ERROR:
            fallback = self.plan.context_fallback
            if error.code == CONTEXT_LENGTH_EXCEEDED and fallback and not self.context_tried:
                self.context_tried = True
                self.pending.appendleft((fallback, 0.0))
                return
            raise error  # the caller's answer: the same request fails the same way elsewhere
        router = self.router
        now = router._clock()
        if outcome == SERVER_ERROR:
            # One more try on the same provider (unless that failure demoted it).
            if self.retried.count(target) < spec.retries and (
                target.admission(router.health[target.name], now) is not Admission.SKIP
            ):
                self.retried.append(target)
                self.pending.appendleft((target, backoff(spec.retry_backoff, router._jitter())))
        elif outcome == RATE_LIMITED:
            # Never make the client wait while another target could answer now.
            others = any(
                t.admission(router.health[t.name], now) is not Admission.SKIP
                for t, _ in self.pending
                if t is not target
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

    def _answer(self, target: _Target, value: Any) -> Routed[Any]:
        return Routed(
            value,
            target.name,
            target.label,
            fallback=target is not self.plan.targets[0],
            model=target.model,
            attempts=self.attempts,
            hedged=self.hedged,
        )
