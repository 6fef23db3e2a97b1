"""A provider's (or one provider:model target's) recent record, and the gate it keeps.

Errors are judged over a sliding **time** window (30 s in 10 buckets): at low traffic
old failures age out instead of condemning a provider that has recovered, and at high
traffic the window is still a few seconds of evidence. First-byte times are the last
64 successful calls of each kind (streamed, complete): percentiles need samples, not
seconds, and stay meaningful at any rate. Recording is O(1) (a bucket and a deque).

States: ``healthy`` → ``demoted`` when, over the window, at least ``min_calls`` calls
failed ``error_rate`` of the time, or ``consecutive`` calls in a row failed. A demoted
target is skipped while a healthy one remains (else tried last); once a
``probe_interval`` it lets one live request through (``probing``); ``probes_to_restore``
successes in a row restore it. A target demoted again within a window of its recovery
waits twice as long for its next probes each time (up to ``max_probe_interval``), as
Envoy's outlier ejection does: a provider failing a fixed share of calls is not let back
to fail a fresh batch every second. Time is always passed in, so tests need no sleeps.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

__all__ = ["Admission", "Health", "HealthPolicy", "ProviderHealth", "State"]


class State(Enum):
    HEALTHY = "healthy"
    PROBING = "probing"
    DEMOTED = "demoted"


class Admission:
    """What the gate says for one request: plain ints, so the stricter is ``max``."""

    OPEN = 0  # healthy: route to it in its place
    PROBE = 1  # demoted, and a probe is due: this request may be the probe
    SKIP = 2  # demoted: only when nothing healthy is left


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    window_seconds: float = 30.0
    buckets: int = 10
    min_calls: int = 10
    error_rate: float = 0.2
    consecutive: int = 3
    probe_interval: float = 1.0
    max_probe_interval: float = 30.0
    probes_to_restore: int = 2
    latency_samples: int = 64


# Called as (health, old state, new state) on every change of state.
OnChange = Callable[["Health", State, State], None]


class _Latencies:
    """The last N first-byte times; percentiles re-sorted only every few new samples
    (the hedge delay reads one per request)."""

    __slots__ = ("_samples", "_since_sort", "_sorted")

    _RESORT_AFTER = 8

    def __init__(self, size: int) -> None:
        self._samples: deque[float] = deque(maxlen=size)
        self._sorted: list[float] = []
        self._since_sort = 0

    def add(self, seconds: float) -> None:
        self._samples.append(seconds)
        self._since_sort += 1

    def quantile(self, q: float) -> float | None:
        if self._since_sort >= self._RESORT_AFTER or (self._since_sort and not self._sorted):
            self._sorted, self._since_sort = sorted(self._samples), 0
        ordered = self._sorted
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None

    def __len__(self) -> int:
        return len(self._samples)


class Health:
    """One provider's or target's rolling record and its state."""

    def __init__(
        self,
        name: str,
        policy: HealthPolicy | None = None,
        on_change: OnChange | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.clock = clock
        self.policy = policy = policy or HealthPolicy()
        self._on_change = on_change
        self._bucket_seconds = policy.window_seconds / policy.buckets
        self._epochs = [-1] * policy.buckets
        self._calls = [0] * policy.buckets
        self._errors = [0] * policy.buckets
        self._latency = (_Latencies(policy.latency_samples), _Latencies(policy.latency_samples))
        self.state = State.HEALTHY
        self.healthy = True  # the state, as the hot path reads it
        self.reason: str | None = None
        self.consecutive_failures = 0
        self._probe_successes = 0
        self._next_probe_at = 0.0
        self._demoted_at = 0.0
        self._restored_at = float("-inf")
        self._ejections = 0  # demotions in a row, each soon after the last recovery
        self._probe_interval = policy.probe_interval
        self.last_error: str | None = None
        self.last_error_at: float | None = None  # wall-clock, for people reading /healthz

    # -- the gate ------------------------------------------------------------------------

    def admission(self, now: float) -> int:
        if self.healthy:
            return Admission.OPEN
        return Admission.PROBE if now >= self._next_probe_at else Admission.SKIP

    def start_probe(self, now: float) -> None:
        """This request is the probe: the next one waits ``probe_interval`` (a probe that
        hangs does not keep the target out of rotation for ever)."""
        self._next_probe_at = now + self._probe_interval
        self._set(State.PROBING, self.reason)

    # -- the record ----------------------------------------------------------------------

    def record(
        self,
        now: float,
        ok: bool,
        first_byte: float | None = None,
        stream: bool = False,
        error: str | None = None,
        started: float | None = None,
        counted: bool = False,
    ) -> None:
        """One call's outcome; ``first_byte`` only for a success (its time to first byte).

        ``started``: when a successful call began, if it proves the target works (see
        ``proven``; None: it proves nothing yet, e.g. a stream at its first bytes).
        ``counted``: the call was already recorded (a stream that broke after its first
        bytes), so this failure replaces its success rather than adding a call."""
        epoch = int(now / self._bucket_seconds)
        index = epoch % len(self._epochs)
        if self._epochs[index] != epoch:
            self._epochs[index], self._calls[index], self._errors[index] = epoch, 0, 0
        if not counted:
            self._calls[index] += 1
        if ok:
            self.consecutive_failures = 0
            if first_byte is not None:
                self._latency[stream].add(first_byte)
            if started is not None:
                self.proven(now, started)
            return
        self._errors[index] += 1
        self.consecutive_failures += 1
        self.last_error, self.last_error_at = error, time.time()
        if self.state is State.HEALTHY:
            reason = self._verdict(now)
            if reason is not None:
                relapse = now - self._restored_at < self.policy.window_seconds
                self._ejections = self._ejections + 1 if relapse else 1
                self._probe_interval = min(
                    self.policy.probe_interval * 2 ** (self._ejections - 1),
                    self.policy.max_probe_interval,
                )
                self._next_probe_at = now + self._probe_interval
                self._demoted_at = now
                self._set(State.DEMOTED, reason)
        else:
            self._probe_successes = 0
            self._next_probe_at = max(self._next_probe_at, now + self._probe_interval)
            self._set(State.DEMOTED, self.reason)

    def proven(self, now: float, started: float) -> None:
        """A call begun at ``started`` has succeeded in full: a probe, if the target is out
        and the call began after it was put out."""
        if not self.healthy and started >= self._demoted_at:
            self._probe_succeeded(now)

    def _verdict(self, now: float) -> str | None:
        policy = self.policy
        if self.consecutive_failures >= policy.consecutive:
            return f"{self.consecutive_failures} failures in a row (last: {self.last_error})"
        calls, errors = self.counts(now)
        if calls >= policy.min_calls and errors >= policy.error_rate * calls:
            return (
                f"{errors} of {calls} calls failed in {policy.window_seconds:g} s"
                f" (last: {self.last_error})"
            )
        return None

    def _probe_succeeded(self, now: float) -> None:
        self._probe_successes += 1
        if self._probe_successes >= self.policy.probes_to_restore:
            # A clean slate: the failures that demoted it must not demote it again.
            self._epochs = [-1] * len(self._epochs)
            self._probe_successes = 0
            self._restored_at = now
            self._set(State.HEALTHY, None)
        else:
            self._next_probe_at = now  # the next request may confirm it at once
            self._set(State.DEMOTED, self.reason)

    def _set(self, state: State, reason: str | None) -> None:
        old, self.state, self.reason = self.state, state, reason
        self.healthy = state is State.HEALTHY
        if old is not state and self._on_change is not None:
            self._on_change(self, old, state)

    # -- reading it ----------------------------------------------------------------------

    def counts(self, now: float) -> tuple[int, int]:
        """(calls, errors) within the window."""
        oldest = int(now / self._bucket_seconds) - len(self._epochs)
        calls = errors = 0
        for epoch, c, e in zip(self._epochs, self._calls, self._errors, strict=True):
            if epoch > oldest:
                calls += c
                errors += e
        return calls, errors

    def first_byte(self, stream: bool, q: float) -> float | None:
        """The ``q`` quantile (0..1) of recent successful first-byte times, if any."""
        return self._latency[stream].quantile(q)

    def snapshot(self) -> dict[str, object]:
        calls, errors = self.counts(self.clock())

        def ms(value: float | None) -> float | None:
            return None if value is None else round(value * 1000, 1)

        return {
            "state": self.state.value,
            "reason": self.reason,
            "recent_calls": calls,
            "error_rate": round(errors / calls, 3) if calls else 0.0,
            "ttfb_p50_ms": ms(self.first_byte(True, 0.5)),
            "ttfb_p95_ms": ms(self.first_byte(True, 0.95)),
            "latency_p50_ms": ms(self.first_byte(False, 0.5)),
            "latency_p95_ms": ms(self.first_byte(False, 0.95)),
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
        }


class ProviderHealth(Health):
    """A provider's own record, and its targets' (one per upstream model it serves)."""

    def __init__(
        self,
        name: str,
        policy: HealthPolicy | None = None,
        on_change: OnChange | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name, policy, on_change, clock)
        self.targets: dict[str, Health] = {}  # by upstream model

    def snapshot(self) -> dict[str, object]:
        targets = {model: health.snapshot() for model, health in self.targets.items()}
        return {**super().snapshot(), "targets": targets}
