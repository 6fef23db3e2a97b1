"""A request's stages as ``Server-Timing`` tells them: the edge's own, the failures it
survived, and the origin's next to them.

Inside a Worker the clock moves only across I/O and is coarse, so CPU-only stages read
0 there (the benchmark measures them from outside).
"""

from __future__ import annotations

from .platform import Platform

__all__ = ["Timings", "elapsed_ms", "origin_stages", "survived"]

# (stage, milliseconds), in the order the stages ran; one list per request.
Timings = list[tuple[str, float]]


def elapsed_ms(started: float, ended: float) -> float:
    """A stage's milliseconds: never negative (the Workers clock is coarse)."""
    return max(0.0, (ended - started) * 1000)


def survived(
    stage: str, error: Exception, request_id: str, platform: Platform, timings: Timings
) -> None:
    """A dependency failure the request survives: logged, and named in Server-Timing as
    ``{stage}-error`` (``kv-error``, ``revocation-error``) so a client can see it too."""
    what = "timed out" if isinstance(error, TimeoutError) else f"failed: {error!r}"
    platform.log_error(f"prism edge: request {request_id}: {stage} {what}")
    timings.append((f"{stage}-error", 0.0))


def origin_stages(timing: str) -> str:
    """The origin's Server-Timing stages, renamed ``origin-*`` next to the edge's own."""
    return ", ".join(f"origin-{part.strip()}" for part in timing.split(",") if part.strip())
