"""The limit a target's recent streams make (``origin.routing.stall_watch``); a stall caught
by it through a real origin is in ``test_resume``."""

from __future__ import annotations

from origin.routing.stall_watch import FACTOR, FLOOR, Pace


def test_a_pace_is_the_providers_limit_until_learned_then_a_multiple_of_its_silences() -> None:
    pace = Pace()
    for longest in (0.1, 0.0):
        pace.record(longest)
        assert pace.limit(60.0) == 60.0  # too few whole streams yet
    pace.record(0.2)
    assert pace.limit(60.0) == FLOOR  # quick streams: never below the floor
    pace.record(1.5)
    assert pace.limit(60.0) == FACTOR * 1.5
    assert pace.limit(3.0) == 3.0  # never above the provider's own limit
