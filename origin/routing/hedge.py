"""Hedged requests: when to start the next target, and how many extra calls we may make.

A target that has not produced its first byte within its hedge delay gets company:
the route's next target is started too and the first to answer wins. The delay follows
the target's own recent first-byte times (its p95 by default), clamped to
[``HEDGE_FLOOR``, ``HEDGE_CEILING``]; with no history yet it is the ceiling. Hedges are
rationed by a token bucket per target, refilled by ``REFILL`` per primary request, so
hedging adds at most about 10 % upstream calls and an outage never doubles the load.
"""

from __future__ import annotations

from dataclasses import dataclass

from .health import Health

__all__ = ["HEDGE_CEILING", "HEDGE_FLOOR", "REFILL", "HedgeBudget", "hedge_delay"]

HEDGE_FLOOR = 0.25
HEDGE_CEILING = 5.0
REFILL = 0.1  # tokens per primary request: about one hedge per ten requests
BURST = 5.0  # hedges that may follow one another after a calm spell


@dataclass(slots=True)
class HedgeBudget:
    tokens: float = BURST

    def refill(self) -> None:
        """One primary request went to this target."""
        if self.tokens < BURST:
            self.tokens = min(BURST, self.tokens + REFILL)

    @property
    def available(self) -> bool:
        return self.tokens >= 1.0

    def take(self) -> bool:
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


def hedge_delay(health: Health, stream: bool, fixed: float | None, percentile: float) -> float:
    """Seconds to wait for this target's first byte before starting the next one."""
    if fixed is not None:
        return fixed
    recent = health.first_byte(stream, percentile / 100)
    if recent is None:
        return HEDGE_CEILING
    return min(HEDGE_CEILING, max(HEDGE_FLOOR, recent))
