"""Each provider's recent record: the window a health gate will demote and re-probe on."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

__all__ = ["ProviderHealth"]


@dataclass(slots=True)
class ProviderHealth:
    """Outcomes and latencies of the last ``window`` calls to one provider."""

    window: int = 100
    _outcomes: deque[tuple[bool, float]] = field(init=False)
    last_error: str | None = None
    last_error_at: float | None = None

    def __post_init__(self) -> None:
        self._outcomes = deque(maxlen=self.window)

    def record(self, ok: bool, seconds: float, error: str | None = None) -> None:
        self._outcomes.append((ok, seconds))
        if not ok:
            self.last_error, self.last_error_at = error, time.time()

    @property
    def error_rate(self) -> float:
        if not self._outcomes:
            return 0.0
        return sum(1 for ok, _ in self._outcomes if not ok) / len(self._outcomes)

    def latency_p50(self) -> float | None:
        latencies = sorted(seconds for ok, seconds in self._outcomes if ok)
        return latencies[len(latencies) // 2] if latencies else None

    def snapshot(self) -> dict[str, object]:
        p50 = self.latency_p50()
        return {
            "recent_calls": len(self._outcomes),
            "error_rate": round(self.error_rate, 3),
            "latency_p50_ms": round(p50 * 1000, 1) if p50 is not None else None,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
        }
