"""The router alone, with fake providers and a fake clock: no server, no sleeps for time."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from origin.apis.chat import ChatOperation
from origin.metrics import Metrics
from origin.providers.base import ProviderSpec, UpstreamCompletion, UpstreamStream
from origin.providers.config import ModelRoute, ModelTarget, ProviderConfig, load_provider_config
from origin.providers.upstream_http import redact
from origin.routing.health import Admission, Health, HealthPolicy, State
from origin.routing.hedge import HEDGE_CEILING, HEDGE_FLOOR, HedgeBudget, hedge_delay
from origin.routing.retry import outcome_of
from origin.routing.router import Routed, Router
from prism import (
    InvalidRequestError,
    NotFoundError,
    PrismError,
    RateLimitError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from tests.polling import async_wait_for

BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
CHAT = ChatOperation()

# A behaviour is what one call does: answer, raise, or run a coroutine first.
Behaviour = Callable[[], Awaitable[None]] | PrismError | BaseException | None


def answer(name: str) -> UpstreamCompletion:
    return UpstreamCompletion(body=name.encode(), completion={"choices": [], "by": name})


@dataclass
class FakeProvider:
    """Scripted calls: each takes the next behaviour (None: answer at once)."""

    spec: ProviderSpec
    script: deque[Behaviour] = field(default_factory=deque)
    calls: int = 0
    cancelled: int = 0
    closed: int = 0
    chunks: tuple[bytes, ...] = (b"data: 1\n\n", b"data: 2\n\n")
    mid_stream_error: PrismError | None = None

    async def _behave(self) -> None:
        self.calls += 1
        behaviour = self.script.popleft() if self.script else None
        if isinstance(behaviour, BaseException):
            raise behaviour
        if behaviour is not None:
            try:
                await behaviour()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise

    async def complete(self, body: dict[str, Any], model: str) -> UpstreamCompletion:
        await self._behave()
        return answer(f"{self.spec.name}:{model}")

    async def stream(self, body: dict[str, Any], model: str) -> UpstreamStream:
        await self._behave()
        first_wait = self.script.popleft() if self.script else None

        async def events() -> AsyncIterator[bytes]:
            if callable(first_wait):
                try:
                    await first_wait()
                except asyncio.CancelledError:
                    self.cancelled += 1
                    raise
            for chunk in self.chunks:
                yield chunk
            if self.mid_stream_error is not None:
                raise self.mid_stream_error

        async def close() -> None:
            self.closed += 1

        return UpstreamStream(events=events(), close=close)

    async def aclose(self) -> None:
        pass


def forever() -> Callable[[], Awaitable[None]]:
    async def wait() -> None:
        await asyncio.Event().wait()

    return wait


def after(seconds: float) -> Callable[[], Awaitable[None]]:
    async def wait() -> None:
        await asyncio.sleep(seconds)

    return wait


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def spec(name: str, **policy: Any) -> ProviderSpec:
    defaults: dict[str, Any] = {"retry_backoff": 0.0}
    return ProviderSpec(name=name, kind="openai", base_url=f"http://{name}", **defaults | policy)


@dataclass
class Fixture:
    router: Router
    providers: dict[str, FakeProvider]
    metrics: Metrics
    clock: Clock

    def attempts(self, provider: str, outcome: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "prism_provider_attempts_total", {"provider": provider, "outcome": outcome}
        )
        return value or 0.0


def make(
    *names: str,
    route: ModelRoute | None = None,
    specs: dict[str, dict[str, Any]] | None = None,
) -> Fixture:
    specs = specs or {}
    providers = {n: FakeProvider(spec(n, **specs.get(n, {}))) for n in names}
    route = route or ModelRoute(tuple(ModelTarget(n, None) for n in names))
    config = ProviderConfig(
        providers={n: p.spec for n, p in providers.items()}, routes={"m": route}
    )
    metrics, clock = Metrics(), Clock()
    router = Router(config, providers, metrics, clock=clock, jitter=lambda: 0.5)
    return Fixture(router, providers, metrics, clock)


# ---------------------------------------------------------------- the quiet path


async def test_healthy_primary_answers_with_one_call_and_no_extra_task() -> None:
    f = make("a")
    seen: list[int] = []

    async def count_tasks() -> None:
        seen.append(len(asyncio.all_tasks()))

    f.providers["a"].script.append(count_tasks)
    routed = await f.router.complete(BODY, "m", CHAT)
    assert (routed.provider, routed.label, routed.fallback) == ("a", "a", False)
    assert routed.value.completion["by"] == "a:m"
    assert f.providers["a"].calls == 1
    assert seen == [1]  # the call ran in the caller's task: nothing was spawned for it
    assert f.attempts("a", "ok") == 1


async def test_unknown_model_is_404() -> None:
    f = make("a")
    with pytest.raises(NotFoundError) as caught:
        await f.router.complete(BODY, "other", CHAT)
    assert caught.value.code == "model_not_found"


# ---------------------------------------------------------------- retry policy


async def test_a_500_is_retried_once_on_the_same_provider() -> None:
    f = make("a", "b")
    f.providers["a"].script.append(UpstreamError("boom"))
    routed = await f.router.complete(BODY, "m", CHAT)
    assert (routed.provider, routed.fallback, routed.attempts) == ("a", False, 2)
    assert f.providers["b"].calls == 0
    assert f.attempts("a", "server_error") == 1 and f.attempts("a", "ok") == 1


async def test_a_second_503_fails_over_and_the_answer_is_a_fallback() -> None:
    f = make("a", "b")
    f.providers["a"].script.extend([UpstreamUnavailableError("x"), UpstreamUnavailableError("x")])
    routed = await f.router.complete(BODY, "m", CHAT)
    assert (routed.provider, routed.fallback) == ("b", True)
    assert f.providers["a"].calls == 2 and f.providers["b"].calls == 1


async def test_the_attempt_budget_bounds_upstream_calls() -> None:
    f = make("a", "b", "c")
    for name in "abc":
        f.providers[name].script.extend([UpstreamError("boom")] * 2)
    with pytest.raises(UpstreamError):
        await f.router.complete(BODY, "m", CHAT)
    calls = [f.providers[n].calls for n in "abc"]
    assert calls == [2, 1, 0]  # a, its retry, then b: three in all


async def test_a_400_is_the_callers_answer_and_never_retried() -> None:
    f = make("a", "b")
    f.providers["a"].script.append(
        InvalidRequestError("bad", code="content_policy_violation", param="messages")
    )
    with pytest.raises(InvalidRequestError) as caught:
        await f.router.complete(BODY, "m", CHAT)
    assert (caught.value.code, caught.value.param) == ("content_policy_violation", "messages")
    assert f.providers["a"].calls == 1 and f.providers["b"].calls == 0
    # the provider answered: a caller's error is not held against it
    assert f.router.health["a"].state is State.HEALTHY
    assert f.attempts("a", "client_error") == 1


async def test_a_429_fails_over_at_once_when_another_target_is_healthy() -> None:
    f = make("a", "b")
    f.providers["a"].script.append(RateLimitError("slow down", headers={"retry-after": "1"}))
    routed = await f.router.complete(BODY, "m", CHAT)
    assert routed.provider == "b"
    assert f.providers["a"].calls == 1
    assert f.attempts("a", "rate_limited") == 1


async def test_a_429_with_a_short_retry_after_waits_when_no_other_target_can_answer() -> None:
    f = make("a")
    f.providers["a"].script.append(RateLimitError("slow down", headers={"retry-after": "0.01"}))
    routed = await f.router.complete(BODY, "m", CHAT)
    assert routed.provider == "a" and f.providers["a"].calls == 2


async def test_a_429_with_a_long_retry_after_is_passed_on() -> None:
    f = make("a")
    f.providers["a"].script.append(RateLimitError("slow down", headers={"retry-after": "7"}))
    with pytest.raises(RateLimitError) as caught:
        await f.router.complete(BODY, "m", CHAT)
    assert caught.value.headers == {"retry-after": "7"}
    assert f.providers["a"].calls == 1


async def test_a_bug_in_an_adapter_becomes_a_500_and_fails_over() -> None:
    f = make("a", "b")
    f.providers["a"].script.append(RuntimeError("adapter bug"))
    routed = await f.router.complete(BODY, "m", CHAT)
    assert routed.provider == "b"
    assert f.attempts("a", "adapter_error") == 1
    f.providers["a"].script.append(KeyError("again"))
    f.providers["b"].script.append(KeyError("and here"))
    with pytest.raises(PrismError) as caught:
        await f.router.complete(BODY, "m", CHAT)
    assert (caught.value.status, caught.value.code) == (500, "internal_error")


# ---------------------------------------------------------------- context fallback


def context_error() -> InvalidRequestError:
    return InvalidRequestError("too long", code="context_length_exceeded", param="messages")


async def test_context_length_exceeded_goes_to_the_routes_larger_target() -> None:
    route = ModelRoute((ModelTarget("a", "small"),), context_fallback=ModelTarget("b", "large"))
    f = make("a", "b", route=route)
    f.providers["a"].script.append(context_error())
    routed = await f.router.complete(BODY, "m", CHAT)
    assert (routed.provider, routed.model, routed.fallback) == ("b", "large", True)
    assert routed.value.completion["by"] == "b:large"


async def test_context_length_exceeded_without_a_fallback_passes_through() -> None:
    f = make("a", "b")
    f.providers["a"].script.append(context_error())
    with pytest.raises(InvalidRequestError) as caught:
        await f.router.complete(BODY, "m", CHAT)
    assert caught.value.code == "context_length_exceeded"
    assert f.providers["b"].calls == 0


# ---------------------------------------------------------------- the health gate


async def test_a_failing_target_is_demoted_skipped_probed_and_restored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "prism.origin")
    f = make("a", "b", specs={"a": {"retries": 0}})
    a, b = f.providers["a"], f.providers["b"]
    a.script.extend([UpstreamError("down")] * 3)
    for _ in range(3):
        assert (await f.router.complete(BODY, "m", CHAT)).provider == "b"
    snapshot = f.router.snapshot()["a"]
    assert snapshot["state"] == "demoted"
    assert "3 failures in a row" in str(snapshot["reason"])
    targets = snapshot["targets"]
    assert isinstance(targets, dict) and targets["m"]["state"] == "demoted"
    assert f.metrics.registry.get_sample_value("prism_provider_state", {"provider": "a"}) == 2
    # demoted: skipped while b is healthy, straight away (no hedge delay, no call to a)
    routed = await f.router.complete(BODY, "m", CHAT)
    assert (routed.provider, routed.fallback, a.calls) == ("b", True, 3)
    # a second later one request probes a, in its own place; two good probes restore it
    f.clock.now += 1.0
    assert (await f.router.complete(BODY, "m", CHAT)).provider == "a"
    assert f.router.snapshot()["a"]["state"] != "healthy"
    assert (await f.router.complete(BODY, "m", CHAT)).provider == "a"
    assert f.router.snapshot()["a"]["state"] == "healthy"
    assert f.metrics.registry.get_sample_value("prism_provider_state", {"provider": "a"}) == 0
    messages = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("provider a demoted: 3 failures") for m in messages) == 1
    assert sum(m.startswith("target a:m demoted") for m in messages) == 1
    assert sum(m == "provider a recovered" for m in messages) == 1
    assert sum(m == "target a:m recovered" for m in messages) == 1
    assert b.calls == 4


async def test_a_failed_probe_keeps_the_target_demoted_until_the_next_probe() -> None:
    f = make("a", "b", specs={"a": {"retries": 0}})
    a = f.providers["a"]
    a.script.extend([UpstreamError("down")] * 4)
    for _ in range(3):
        await f.router.complete(BODY, "m", CHAT)
    f.clock.now += 1.0
    assert (await f.router.complete(BODY, "m", CHAT)).provider == "b"  # a's probe failed over
    assert a.calls == 4
    assert (await f.router.complete(BODY, "m", CHAT)).provider == "b"  # no probe due yet
    assert a.calls == 4
    assert f.router.snapshot()["a"]["state"] == "demoted"


async def test_when_every_target_is_demoted_they_are_still_tried() -> None:
    f = make("a", "b", specs={"a": {"retries": 0}, "b": {"retries": 0}})
    for name in "ab":
        f.providers[name].script.extend([UpstreamError("down")] * 3)
    for _ in range(3):
        with pytest.raises(UpstreamError):
            await f.router.complete(BODY, "m", CHAT)
    assert {n: f.router.snapshot()[n]["state"] for n in "ab"} == {"a": "demoted", "b": "demoted"}
    routed = await f.router.complete(BODY, "m", CHAT)  # both recovered meanwhile: tried anyway
    assert routed.provider == "a"


def test_error_rate_over_the_window_demotes_and_old_errors_age_out() -> None:
    policy = HealthPolicy(consecutive=100, min_calls=5, error_rate=0.5)
    health = Health("t", policy)
    now = 0.0
    for ok in (True, False, True, False, True):
        health.record(now, ok)
    assert health.state is State.HEALTHY  # 2 of 5
    health.record(now, False)  # 3 of 6
    assert health.state is State.DEMOTED  # type: ignore[comparison-overlap]  # record() changed what mypy narrowed
    assert health.reason is not None and "3 of 6 calls failed in 30 s" in health.reason
    fresh = Health("u", policy)
    for _ in range(4):
        fresh.record(now, False)
    now += 31.0  # the window has moved on: those failures no longer count
    assert fresh.counts(now) == (0, 0)
    fresh.record(now, False)
    assert fresh.state is State.HEALTHY


def test_first_byte_percentiles_come_from_recent_successes() -> None:
    health = Health("t")
    for ms in range(1, 101):
        health.record(0.0, True, ms / 1000, stream=True)
    assert health.first_byte(True, 0.5) == pytest.approx(0.069)  # the last 64: 37..100 ms
    assert health.first_byte(True, 0.95) == pytest.approx(0.097)
    assert health.first_byte(False, 0.5) is None
    snapshot = health.snapshot()
    assert snapshot["ttfb_p95_ms"] == 97.0 and snapshot["latency_p50_ms"] is None


# ---------------------------------------------------------------- hedging


def test_hedge_delay_follows_recent_first_bytes_within_floor_and_ceiling() -> None:
    health = Health("t")
    assert hedge_delay(health, True, None, 95) == HEDGE_CEILING  # no history yet
    for _ in range(10):
        health.record(0.0, True, 0.01, stream=True)
    assert hedge_delay(health, True, None, 95) == HEDGE_FLOOR
    for _ in range(64):
        health.record(0.0, True, 0.8, stream=True)
    assert hedge_delay(health, True, None, 95) == 0.8
    assert hedge_delay(health, True, 2.0, 95) == 2.0  # fixed in the TOML


def test_hedge_budget_allows_about_one_hedge_per_ten_requests() -> None:
    budget = HedgeBudget()
    hedges = 0
    for _ in range(1000):
        budget.refill()
        hedges += budget.take()
    assert 100 <= hedges <= 106  # the burst, then one per ten


async def test_a_slow_target_is_hedged_and_the_loser_is_cancelled() -> None:
    f = make("a", "b", specs={"a": {"hedge_delay": 0.01}})
    f.providers["a"].script.append(forever())
    routed = await f.router.complete(BODY, "m", CHAT)
    assert (routed.provider, routed.fallback, routed.hedged) == ("b", True, True)
    await async_wait_for(lambda: f.providers["a"].cancelled == 1)  # the loser, cancelled
    assert f.attempts("a", "cancelled") == 1 and f.attempts("b", "ok") == 1
    assert (
        f.metrics.registry.get_sample_value("prism_provider_hedges_total", {"provider": "b"}) == 1
    )


async def test_no_task_is_made_for_a_hedge_before_its_delay_passes() -> None:
    f = make("a", "b")  # hedging possible: b is healthy and the budget is full
    seen: list[set[asyncio.Task[object]]] = []
    before = asyncio.all_tasks()  # the loop is shared: other tests' tasks may be on it

    async def new_tasks() -> None:
        seen.append(asyncio.all_tasks() - before)

    f.providers["a"].script.append(new_tasks)
    routed = await f.router.complete(BODY, "m", CHAT)
    assert (routed.provider, routed.hedged) == ("a", False)
    assert seen == [set()] and f.providers["b"].calls == 0


async def test_a_client_that_leaves_mid_race_cancels_both_calls() -> None:
    f = make("a", "b", specs={"a": {"hedge_delay": 0.01}})
    a, b = f.providers["a"], f.providers["b"]
    a.script.append(forever())
    b.script.append(forever())
    request = asyncio.ensure_future(f.router.complete(BODY, "m", CHAT))
    await async_wait_for(lambda: b.calls == 1)
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    await async_wait_for(lambda: a.cancelled == 1 and b.cancelled == 1)


async def test_the_primary_still_wins_when_it_answers_first() -> None:
    f = make("a", "b", specs={"a": {"hedge_delay": 0.01}})
    f.providers["a"].script.append(after(0.05))
    f.providers["b"].script.append(forever())
    routed = await f.router.complete(BODY, "m", CHAT)
    assert (routed.provider, routed.fallback, routed.hedged) == ("a", False, True)
    await async_wait_for(lambda: f.providers["b"].cancelled == 1)


async def test_a_bug_in_a_hedge_task_is_mapped_and_counted_not_raised() -> None:
    f = make("a", "b", specs={"a": {"hedge_delay": 0.001}})
    f.providers["a"].script.append(after(0.05))
    f.providers["b"].script.append(RuntimeError("adapter bug in the hedge"))
    routed = await f.router.complete(BODY, "m", CHAT)
    assert (routed.provider, routed.hedged) == ("a", True)
    assert f.attempts("b", "adapter_error") == 1
    assert f.router.health["b"].last_error == "500 internal_error"


async def test_hedges_are_rationed_by_the_budget() -> None:
    f = make("a", "b", specs={"a": {"hedge_delay": 0.001}})
    a, b = f.providers["a"], f.providers["b"]
    for _ in range(10):
        a.script.append(after(0.05))
        b.script.append(forever())
        assert (await f.router.complete(BODY, "m", CHAT)).provider == "a"
    # five from the burst, then 0.1 token per request: not enough for a sixth in ten
    assert b.calls == 5


async def test_hedging_can_be_switched_off_per_route() -> None:
    route = ModelRoute((ModelTarget("a", None), ModelTarget("b", None)), hedge=False)
    f = make("a", "b", route=route, specs={"a": {"hedge_delay": 0.001}})
    seen: list[int] = []

    async def slow() -> None:
        seen.append(len(asyncio.all_tasks()))
        await asyncio.sleep(0.02)

    f.providers["a"].script.append(slow)
    assert (await f.router.complete(BODY, "m", CHAT)).provider == "a"
    assert f.providers["b"].calls == 0 and seen == [1]


# ---------------------------------------------------------------- streams


async def drain(routed: Routed[UpstreamStream]) -> list[bytes]:
    return [chunk async for chunk in routed.value.events]


async def test_a_stream_is_returned_only_with_its_first_bytes() -> None:
    f = make("a")
    routed = await f.router.stream(BODY, "m", CHAT)
    assert await drain(routed) == [b"data: 1\n\n", b"data: 2\n\n"]


async def test_headers_then_silence_fail_over_within_the_first_token_limit() -> None:
    f = make("a", "b", specs={"a": {"first_token_timeout": 0.05, "hedge": False}})
    a = f.providers["a"]
    a.script.extend([None, forever()])  # the stream opens, then no first byte
    routed = await f.router.stream(BODY, "m", CHAT)
    assert (routed.provider, routed.fallback) == ("b", True)
    assert await drain(routed) == [b"data: 1\n\n", b"data: 2\n\n"]
    assert a.cancelled == 1 and a.closed == 1  # its connection was closed
    assert f.attempts("a", "timeout") == 1
    assert f.router.health["a"].last_error == "504 upstream_timeout"


async def test_a_stream_hedge_closes_the_losing_stream() -> None:
    f = make("a", "b", specs={"a": {"hedge_delay": 0.01}})
    a = f.providers["a"]
    a.script.extend([None, forever()])
    routed = await f.router.stream(BODY, "m", CHAT)
    assert (routed.provider, routed.hedged) == ("b", True)
    await async_wait_for(lambda: a.cancelled == 1 and a.closed == 1)


async def test_a_stream_broken_mid_way_is_not_retried_but_counts_once() -> None:
    f = make("a", "b")
    a = f.providers["a"]
    a.mid_stream_error = UpstreamError("cut", code="upstream_truncated")
    routed = await f.router.stream(BODY, "m", CHAT)
    with pytest.raises(UpstreamError):
        await drain(routed)
    f.router.stream_failed(routed, UpstreamError("cut", code="upstream_truncated"))
    assert f.providers["b"].calls == 0
    calls, errors = f.router.health["a"].counts(f.clock())
    assert (calls, errors) == (1, 1)  # one call: its start, then its break, counted once
    assert f.router.health["a"].last_error == "502 upstream_truncated"


async def test_a_failure_after_the_stream_was_declared_whole_does_not_count() -> None:
    f = make("a")
    a = f.providers["a"]
    a.mid_stream_error = UpstreamError("reset after [DONE]", code="upstream_truncated")
    routed = await f.router.stream(BODY, "m", CHAT)
    f.router.stream_finished(routed)  # the consumer saw [DONE] and reads on only to free it
    with pytest.raises(UpstreamError):
        await drain(routed)
    health = f.router.health["a"]
    assert (health.counts(f.clock()), health.last_error) == ((1, 0), None)
    failures = f.metrics.registry.get_sample_value(
        "prism_provider_stream_failures_total", {"provider": "a"}
    )
    assert not failures


def test_only_calls_begun_after_a_demotion_can_restore_it() -> None:
    health = Health("t", HealthPolicy())
    for _ in range(3):
        health.record(10.0, False, started=9.0)
    assert health.state is State.DEMOTED
    # calls that were already on their way when it was demoted prove nothing
    health.record(10.01, True, 0.1, started=9.5)
    health.record(10.02, True, 0.1, started=9.6)
    assert health.state is State.DEMOTED
    health.start_probe(11.0)
    health.record(11.1, True, 0.1, started=11.0)
    health.record(11.2, True, 0.1, started=11.1)
    assert health.state is State.HEALTHY  # type: ignore[comparison-overlap]  # record() changed what mypy narrowed


async def test_a_stream_failure_the_flight_detects_counts_against_the_target() -> None:
    f = make("a")
    routed = await f.router.stream(BODY, "m", CHAT)
    await drain(routed)
    f.router.stream_failed(routed, UpstreamError("bad", code="upstream_malformed"))
    target = f.router.health["a"].targets["m"]
    assert target.last_error == "502 upstream_malformed"
    assert f.router.health["a"].last_error == "502 upstream_malformed"


async def test_a_timeout_is_not_retried_on_the_same_provider() -> None:
    f = make("a", "b")
    f.providers["a"].script.append(UpstreamTimeoutError("slow"))
    routed = await f.router.complete(BODY, "m", CHAT)
    assert routed.provider == "b" and f.providers["a"].calls == 1


def test_spec_defaults_are_the_documented_policy() -> None:
    default = ProviderSpec(name="x", kind="openai", base_url="http://x")
    assert (default.retries, default.retry_backoff, default.max_retry_after) == (1, 0.1, 5.0)
    assert default.first_token_limit == default.first_byte_timeout
    assert replace(default, first_token_timeout=2.0).first_token_limit == 2.0


# ---------------------------------------------------------------- the providers TOML


def test_routing_policy_and_route_tables_come_from_the_providers_toml(tmp_path: Path) -> None:
    path = tmp_path / "providers.toml"
    path.write_text(
        """
[providers.a]
base_url = "http://a/v1"
retries = 2
retry_backoff = 0.2
max_retry_after = 3
first_token_timeout = 4
hedge_delay = 0.5
hedge_percentile = 90
[providers.b]
base_url = "http://b/v1"
hedge = false
[models]
"plain" = ["a", "b:big"]
[models."rich"]
targets = ["a:small"]
context_fallback = "b:large"
hedge_delay = 1.5
max_attempts = 2
"""
    )
    config = load_provider_config(path, {})
    a, b = config.providers["a"], config.providers["b"]
    assert (a.retries, a.retry_backoff, a.max_retry_after) == (2, 0.2, 3.0)
    assert (a.first_token_limit, a.hedge_delay, a.hedge_percentile) == (4.0, 0.5, 90.0)
    assert (b.hedge, b.retries, b.hedge_delay) == (False, 1, None)
    assert config.route("plain") == ModelRoute((ModelTarget("a", None), ModelTarget("b", "big")))
    assert config.route("rich") == ModelRoute(
        (ModelTarget("a", "small"),),
        context_fallback=ModelTarget("b", "large"),
        hedge_delay=1.5,
        max_attempts=2,
    )
    assert config.targets("rich") == ((a, "small"),)


@pytest.mark.parametrize(
    ("table", "complaint"),
    [
        ('[providers.a]\nbase_url = "http://a"\nretries = -1', "retries"),
        ('[providers.a]\nbase_url = "http://a"\nhedge = "no"', "hedge must be true or false"),
        ('[providers.a]\nbase_url = "http://a"\nhedge_delay = 0', "hedge_delay"),
        ('[providers.a]\nbase_url = "http://a"\nhedge_percentile = 120', "hedge_percentile"),
        ('[providers.a]\nbase_url = "http://a"\n[models.m]\ntargets = ["a"]\nhedges = 1', "hedges"),
        (
            '[providers.a]\nbase_url = "http://a"\n[models.m]\ntargets = ["a"]\nmax_attempts = 0',
            "max_attempts",
        ),
        (
            '[providers.a]\nbase_url = "http://a"\n[models.m]\ntargets = ["a"]\ncontext_fallback = "z"',
            "unknown provider 'z'",
        ),
    ],
)
def test_bad_routing_settings_are_refused_at_start_up(
    tmp_path: Path, table: str, complaint: str
) -> None:
    path = tmp_path / "providers.toml"
    path.write_text(table)
    with pytest.raises(ValueError, match=complaint):
        load_provider_config(path, {})


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (InvalidRequestError("x", code="context_length_exceeded"), "client_error"),
        (NotFoundError("x"), "client_error"),
        (RateLimitError("x"), "rate_limited"),
        (UpstreamError("HTTP 500"), "server_error"),
        (UpstreamError("reset", code="bad_gateway"), "server_error"),
        (UpstreamUnavailableError("503"), "server_error"),
        (UpstreamTimeoutError("slow"), "timeout"),
        (UpstreamError("refused", code="upstream_unreachable"), "unreachable"),
        (UpstreamError("bad json", code="upstream_malformed"), "malformed"),
        (UpstreamError("key", code="upstream_auth_failed"), "auth"),
        (PrismError("bug"), "adapter_error"),
    ],
)
def test_each_failure_is_classified_for_retry_and_metrics(error: PrismError, outcome: str) -> None:
    assert outcome_of(error) == outcome


def test_a_provider_message_never_shows_any_part_of_the_gateways_key() -> None:
    spec = ProviderSpec("p", "openai", "http://x", api_key="sk-live-0123456789abcdef")
    message = "x" * 490 + " bad key sk-live-0123456789abcdef"  # the key straddles the cut
    shown = redact(spec, message)
    assert len(shown) <= 500 and "sk-live" not in shown and "0123" not in shown


def test_by_default_a_provider_failing_three_calls_in_ten_is_demoted() -> None:
    health = Health("t", HealthPolicy(consecutive=100))
    for ok in [True, False, True, True, False, True, True, True, True]:
        health.record(0.0, ok)
    assert health.state is State.HEALTHY  # 2 of 9: too few calls to judge, and under 25 %
    health.record(0.0, False)
    assert health.state is State.DEMOTED  # type: ignore[comparison-overlap]  # record() changed what mypy narrowed; 3 of 10


def test_a_target_that_relapses_soon_after_recovering_waits_longer_for_its_probes() -> None:
    health = Health("t", HealthPolicy())
    now = 0.0

    def demote() -> None:
        for _ in range(3):
            health.record(now, False, started=now)
        assert health.state is State.DEMOTED

    def next_probe() -> float:
        probe_at = now
        while health.admission(probe_at) != Admission.PROBE:
            probe_at += 0.25
        return probe_at - now

    def restore() -> None:
        for _ in range(2):
            health.start_probe(now)
            health.record(now, True, 0.1, started=now)
        assert health.state is State.HEALTHY

    waits = []
    for _ in range(4):
        demote()
        waits.append(next_probe())
        now += waits[-1]
        restore()
        now += 1.0  # fails again a second after it came back
    assert waits == [1.0, 2.0, 4.0, 8.0]
    now += 60.0  # healthy for longer than the window: a later failure starts afresh
    demote()
    assert next_probe() == 1.0


async def test_a_streamed_probe_restores_its_target_only_once_the_stream_is_whole() -> None:
    f = make("a", "b", specs={"a": {"retries": 0}})
    a = f.providers["a"]
    a.script.extend([UpstreamError("down")] * 3)
    for _ in range(3):
        await f.router.complete(BODY, "m", CHAT)
    assert f.router.snapshot()["a"]["state"] == "demoted"
    for _ in range(2):  # two probes, each a stream
        f.clock.now += 1.0
        routed = await f.router.stream(BODY, "m", CHAT)
        assert routed.provider == "a"
        await drain(routed)
        assert f.router.snapshot()["a"]["state"] != "healthy"  # its first bytes prove nothing
        f.router.stream_finished(routed)  # the flight found it whole
    assert f.router.snapshot()["a"]["state"] == "healthy"
