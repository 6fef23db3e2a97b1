"""Chooses the target for a model, retries, hedges and fails over until the first byte.

For each request the route's targets are ordered by health (``origin.routing.health``): healthy
ones in the route's order, demoted ones last (one request a second probes a demoted
target in its own place). The first is called; what a failure means for the next call
is ``origin.routing.retry``'s; a target slow to its first byte gets a hedge
(``origin.routing.hedge``).
A stream counts as answered at its first body bytes (``origin.routing.first_byte``). Every
path is bounded: at most ``max_attempts`` upstream calls, each within its provider's
timeouts, and waits only for a short backoff or ``Retry-After``.

A chat stream broken after that may be continued by another target (``resume_plan``,
``resume``: ``origin.routing.resume``).

The hot path with no faults calls one target in the caller's own task: a hedge is a
timer until its delay passes (``origin.routing.route_request``), and health recording is O(1).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from prism import NotFoundError, PrismError

from ..metrics import Metrics
from ..providers.base import ChatProvider, UpstreamCompletion, UpstreamStream
from ..providers.config import ProviderConfig
from ..providers.upstream_http import redact
from .first_byte import StartedEvents, first_token_timeout, open_started
from .health import Health, HealthPolicy, ProviderHealth, State
from .operation import Operation
from .resume import can_continue
from .retry import CLIENT_ERROR, outcome_of
from .route_request import RouteRequest
from .stall_watch import StallWatch
from .targets import Plan, Routed, Target

if TYPE_CHECKING:
    from ..http.telemetry import Telemetry

__all__ = ["Routed", "Router"]

log = logging.getLogger("prism.origin")

_STATE_GAUGE = {State.HEALTHY: 0, State.PROBING: 1, State.DEMOTED: 2}
_TARGETS_PER_PROVIDER = 256  # upstream models tracked per provider ("*" routes pass names on)
_PLANS = 1024  # resolved public model names remembered


class Router:
    """The flight's one way to the providers: ``complete``, ``stream``, ``stream_failed``."""

    def __init__(
        self,
        config: ProviderConfig,
        providers: Mapping[str, ChatProvider],
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
        policy: HealthPolicy | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._config = config
        self._providers = providers
        self._metrics = metrics
        self.clock = clock
        self.jitter = jitter
        self._policy = policy or HealthPolicy()
        self.health: dict[str, ProviderHealth] = {
            name: ProviderHealth(name, self._policy, self._state_changed, clock)
            for name in providers
        }
        for name in providers:
            metrics.provider_state.labels(name).set(0)
        self._targets: dict[tuple[str, str], Target] = {}
        self._plans: dict[str, Plan] = {}
        self._seconds: dict[tuple[str, bool], Any] = {}
        self._losers: set[asyncio.Task[Any]] = set()
        self.stalls = StallWatch()  # every open stream, for a silence past its pace
        self.telemetry = telemetry  # None: no tracing

    # -- the public interface (the flight's) ---------------------------------------------

    async def complete(
        self,
        body: dict[str, Any],
        model: str,
        op: Operation,
        tried: list[dict[str, Any]] | None = None,
    ) -> Routed[UpstreamCompletion]:
        """A complete answer from the model's first working target (``op``: the API's call;
        ``tried``: where each attempt's outcome is noted)."""
        request = RouteRequest(self, self._plan(model), body, False, op, tried)
        return cast("Routed[UpstreamCompletion]", await request.run())  # no runtime generic

    async def stream(
        self,
        body: dict[str, Any],
        model: str,
        op: Operation,
        tried: list[dict[str, Any]] | None = None,
    ) -> Routed[UpstreamStream]:
        """A stream whose first bytes have arrived; failover happens only before them."""
        request = RouteRequest(self, self._plan(model), body, True, op, tried)
        return cast("Routed[UpstreamStream]", await request.run())

    def stream_failed(self, routed: Routed[UpstreamStream], error: PrismError) -> None:
        """A stream that broke after it started (cut, malformed, unfinished) counts against
        its target like a failed call (once, however many times it is reported)."""
        events = routed.value.events
        assert isinstance(events, StartedEvents)  # every stream the router hands out
        events.report(error)

    def stream_finished(self, routed: Routed[UpstreamStream]) -> None:
        """The consumer has the whole answer: a failure while the rest of the body is read
        (to free the connection) no longer counts against the target."""
        events = routed.value.events
        assert isinstance(events, StartedEvents)
        events.finish()

    # -- resuming a broken stream (``origin.routing.resume``) -------------------------

    def resume_plan(self, model: str, broken: Routed[UpstreamStream], text: str) -> Plan | None:
        """The route's other healthy targets that can carry on from ``text`` (any of them
        when there is no text yet), in route order; None when the route does not resume."""
        plan = self._plan(model)
        if not plan.resume:
            return None
        targets: list[Target] = []
        for target in plan.targets:
            if (target.name, target.model) == (broken.provider, broken.model):
                continue
            if target in targets or not (target.health.healthy and target.provider_health.healthy):
                continue
            if text and not can_continue(target.spec):
                continue
            targets.append(target)
        return dataclasses.replace(
            plan,
            targets=tuple(targets),
            first_tries=tuple((target, 0.0) for target in targets),
            context_fallback=None,
        )

    async def resume(
        self, plan: Plan, body: dict[str, Any], op: Operation
    ) -> Routed[UpstreamStream]:
        """A continuation's stream, from the first of ``plan``'s targets that starts one,
        through the usual attempts (first-byte limits, retries, health)."""
        return cast("Routed[UpstreamStream]", await RouteRequest(self, plan, body, True, op).run())

    def count_resumption(self, provider: str, outcome: str) -> None:
        self._metrics.provider_stream_resumptions.labels(provider, outcome).inc()

    def redact(self, routed: Routed[Any], message: str) -> str:
        """A message from ``routed``'s provider, safe to show the client."""
        return redact(self._providers[routed.provider].spec, message)

    def primary_healthy(self, model: str) -> bool:
        """The first target of ``model``'s route is healthy (its gate and its provider's):
        a fallback's stored answer steps aside for it."""
        try:
            primary = self._plan(model).targets[0]
        except NotFoundError:
            return False
        return primary.health.healthy and primary.provider_health.healthy

    def first_byte_limit(self, model: str, stream: bool) -> float:
        """The longest a target of ``model``'s route may take to its first byte (0: no
        such route): how long a process following another's call waits for its first news."""
        try:
            plan = self._plan(model)
        except NotFoundError:
            return 0.0
        specs = [target.provider.spec for target in plan.targets]
        if stream:
            return max(spec.first_token_limit for spec in specs)
        return max(spec.first_byte_timeout for spec in specs)

    def snapshot(self) -> dict[str, dict[str, object]]:
        """Per provider: state, reason, error rate, first-byte percentiles, and its targets."""
        return {name: health.snapshot() for name, health in self.health.items()}

    # -- routes and targets --------------------------------------------------------------

    def _plan(self, model: str) -> Plan:
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
        targets = tuple(self._target(t.provider, t.model or model) for t in route.targets)
        plan = Plan(
            targets=targets,
            first_tries=tuple((target, 0.0) for target in targets),
            context_fallback=None
            if context is None
            else self._target(context.provider, context.model or model),
            hedge=route.hedge,
            hedge_delay=route.hedge_delay,
            max_attempts=route.max_attempts,
            resume=route.resume,
            resume_store=route.resume_store,
        )
        if len(self._plans) >= _PLANS:
            self._plans.clear()
        self._plans[model] = plan
        return plan

    def _target(self, provider: str, model: str) -> Target:
        target = self._targets.get((provider, model))
        if target is None:
            owner = self.health[provider]
            if len(owner.targets) >= _TARGETS_PER_PROVIDER:
                oldest = next(iter(owner.targets))
                del owner.targets[oldest]
                self._targets.pop((provider, oldest), None)
            health = Health(f"{provider}:{model}", self._policy, self._state_changed, self.clock)
            owner.targets[model] = health
            target = self._targets[(provider, model)] = Target(
                self._providers[provider], model, health, owner
            )
        return target

    # -- one attempt ---------------------------------------------------------------------

    async def attempt(
        self, target: Target, body: dict[str, Any], stream: bool, op: Operation
    ) -> Any:
        """One upstream call, recorded; every failure leaves as a ``PrismError``."""
        if self.telemetry is not None:  # a span around it, current while the call is made
            return await self.telemetry.attempt(self._attempt, target, body, stream, op)
        return await self._attempt(target, body, stream, op)

    async def _attempt(
        self, target: Target, body: dict[str, Any], stream: bool, op: Operation
    ) -> Any:
        started = self.clock()
        try:
            if stream:
                async with asyncio.timeout(target.spec.first_token_limit):
                    value: Any = await open_started(
                        op,
                        target.provider,
                        body,
                        target.model,
                        lambda e: self._broken(target, e),
                        lambda: self._whole(target, started),
                        self.stalls,
                        target.pace,
                    )
            else:
                value = await op.complete(target.provider, body, target.model)
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
            # Ours, not the provider's: a 500 internal_error (another target may still answer).
            failed = PrismError(f"The gateway failed calling provider '{target.name}'.")
            self._record(target, started, stream, failed)
            raise failed from None
        self._record(target, started, stream, None)
        return value

    def _record(
        self, target: Target, started: float, stream: bool, error: PrismError | None
    ) -> None:
        now = self.clock()
        seconds = now - started
        if error is None:
            outcome, ok, detail = "ok", True, None
        else:
            outcome = outcome_of(error)
            ok = outcome == CLIENT_ERROR  # the provider answered; the request was wrong
            detail = None if ok else _detail(error)
        first_byte = seconds if error is None else None
        # A stream proves its target only once it is whole (``_whole``), not at its start.
        proof = None if stream else started
        target.health.record(now, ok, first_byte, stream, detail, proof)
        target.provider_health.record(now, ok, first_byte, stream, detail, proof)
        key = (target.name, ok)
        histogram = self._seconds.get(key)
        if histogram is None:
            histogram = self._seconds[key] = self._metrics.provider_seconds.labels(
                target.name, "ok" if ok else "error"
            )
        histogram.observe(seconds)
        self._count(target, outcome)

    def _count(self, target: Target, outcome: str) -> None:
        counter = target.counters.get(outcome)
        if counter is None:
            counter = target.counters[outcome] = self._metrics.provider_attempts.labels(
                target.name, outcome
            )
        counter.inc()

    def count_hedge(self, target: Target) -> None:
        self._metrics.provider_hedges.labels(target.name).inc()
        if self.telemetry is not None:
            self.telemetry.hedged(target)

    def _whole(self, target: Target, started: float) -> None:
        """A stream that ended whole: it may restore a demoted target, as a probe."""
        now = self.clock()
        target.health.proven(now, started)
        target.provider_health.proven(now, started)

    def _broken(self, target: Target, error: PrismError) -> None:
        """A stream that failed after its first bytes: no retry (the client has bytes)."""
        now, detail = self.clock(), _detail(error)
        target.health.record(now, False, error=detail, counted=True)
        target.provider_health.record(now, False, error=detail, counted=True)
        self._metrics.provider_stream_failures.labels(target.name).inc()

    def discard(self, task: asyncio.Task[Any]) -> None:
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
        """Gauge every change; log a demotion and a recovery once each."""
        what = "provider"
        if isinstance(health, ProviderHealth):
            self._metrics.provider_state.labels(health.name).set(_STATE_GAUGE[new])
        else:
            what = "target"
        if new is State.DEMOTED and old is State.HEALTHY:
            log.warning("%s %s demoted: %s", what, health.name, health.reason)
        elif new is State.HEALTHY:
            log.warning("%s %s recovered", what, health.name)


def _detail(error: PrismError) -> str:
    return f"{error.status} {error.code}"
