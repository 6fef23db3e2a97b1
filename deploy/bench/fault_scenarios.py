"""The fault benchmark's scenarios: how the primary provider misbehaves in each.

The secondary is always healthy. Probabilistic faults are drawn from a seeded
generator in the provider stand-in, so the same run hits the same share of requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_SCENARIOS", "SCENARIOS", "FaultScenario"]


@dataclass(frozen=True, slots=True)
class FaultScenario:
    name: str
    description: str
    # Queued on the primary for the whole scenario (count -1); None: no standing fault.
    fault: dict[str, Any] | None = None
    # An outage: 503 on every request for a window, then recovery (timed, paced requests).
    outage: bool = False
    # The secondary can continue a partial answer (its table's ``continuation``): a stream
    # the primary breaks after its first bytes is finished there, as one answer.
    resume: bool = False
    api: str = "chat"  # the API the load asks: "chat", "messages" (Anthropic's), "responses"


SCENARIOS: dict[str, FaultScenario] = {
    s.name: s
    for s in (
        FaultScenario("healthy", "both providers healthy (the baseline)"),
        FaultScenario(
            "errors_5xx",
            "primary: 30 % of requests get a 500",
            {"mode": "status", "status": 500, "probability": 0.3},
        ),
        FaultScenario(
            "stall",
            "primary: 5 % of requests stall 3 s before the first byte",
            {"mode": "stall_before_first_byte", "seconds": 3.0, "probability": 0.05},
        ),
        FaultScenario(
            "outage",
            "primary: 503 on everything for a window, then healthy again",
            outage=True,
        ),
        FaultScenario(
            "rate_limit",
            "primary: 30 % of requests get a 429 with Retry-After: 1",
            {"mode": "rate_limit", "retry_after": 1.0, "probability": 0.3},
        ),
        FaultScenario(
            "stream_cut",
            "primary: 30 % of answers cut mid-way (connection dropped after 3 events, "
            "or half a JSON body)",
            {"mode": "truncated_stream", "after_chunks": 3, "abort": 1, "probability": 0.3},
        ),
        FaultScenario(
            "stream_cut_resumed",
            "primary: 30 % of answers cut mid-way (connection dropped after 3 events); the "
            "secondary can continue a partial answer",
            {"mode": "truncated_stream", "after_chunks": 3, "abort": 1, "probability": 0.3},
            resume=True,
        ),
        FaultScenario(
            "stream_stall_resumed",
            "primary: 5 % of streams stall mid-way for 20 s (its limit is 60 s); the "
            "secondary can continue a partial answer",
            {"mode": "stall_mid_stream", "after_chunks": 3, "seconds": 20.0, "probability": 0.05},
            resume=True,
        ),
        FaultScenario(
            "messages_cut_resumed",
            "as stream_cut_resumed, the load on Anthropic's Messages API (translated to the "
            "providers' chat API)",
            {"mode": "truncated_stream", "after_chunks": 3, "abort": 1, "probability": 0.3},
            resume=True,
            api="messages",
        ),
        FaultScenario(
            "messages_stall_resumed",
            "as stream_stall_resumed, the load on Anthropic's Messages API",
            {"mode": "stall_mid_stream", "after_chunks": 3, "seconds": 20.0, "probability": 0.05},
            resume=True,
            api="messages",
        ),
        FaultScenario(
            "responses_cut_resumed",
            "as stream_cut_resumed, the load on the Responses API (translated to the "
            "providers' chat API)",
            {"mode": "truncated_stream", "after_chunks": 3, "abort": 1, "probability": 0.3},
            resume=True,
            api="responses",
        ),
        # Not in the default set: headers at once, then no first token.
        FaultScenario(
            "stall_after_headers",
            "primary: 5 % of requests send headers, then stall 3 s before the first token",
            {"mode": "stall_after_headers", "seconds": 3.0, "probability": 0.05},
        ),
    )
}

DEFAULT_SCENARIOS = (
    "healthy",
    "errors_5xx",
    "stall",
    "outage",
    "rate_limit",
    "stream_cut",
    "stream_cut_resumed",
    "stream_stall_resumed",
    "messages_cut_resumed",
    "messages_stall_resumed",
    "responses_cut_resumed",
)
