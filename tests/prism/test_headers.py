"""The Server-Timing header: each stage's duration to two decimals, as ``%.2f`` would."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from prism import headers as h


def test_stages_render_in_order_with_two_decimals() -> None:
    stages = [("auth", 0.0123), ("redis", 12.345678), ("origin", 1500.0)]
    assert h.server_timing(stages) == "auth;dur=0.01, redis;dur=12.35, origin;dur=1500.00"
    assert h.server_timing([]) == ""


def test_a_negative_duration_reads_as_zero() -> None:
    assert h.server_timing([("kv", -0.5)]) == "kv;dur=0.00"


@given(st.floats(min_value=0, max_value=1e6, allow_nan=False))
def test_any_duration_renders_as_float_formatting_would(ms: float) -> None:
    rendered = h.server_timing([("x", ms)])
    # Only a duration within a rounding error of a half-hundredth may round the other way.
    if abs(ms * 100 % 1 - 0.5) > 1e-6:
        assert rendered == f"x;dur={ms:.2f}"
