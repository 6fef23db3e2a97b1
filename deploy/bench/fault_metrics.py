"""The fault benchmark's numbers and targets, as pure functions over recorded requests.

Nothing here does I/O, so every number in the report can be recomputed from the
JSON file, and the targets are unit-tested on synthetic runs.

Times are seconds since the scenario's start. A *record* is one client request;
a provider's *arrivals* are the times its chat requests reached it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from .loadgen import percentile

__all__ = [
    "BIN_SECONDS",
    "DEMOTED_SHARE",
    "RECORD_FIELDS",
    "RETURNED_SHARE",
    "RequestRecord",
    "TargetRow",
    "cut_midway",
    "demotion_seconds",
    "evaluate",
    "return_seconds",
    "summarize",
]

# Width of the time bins the outage is judged in.
BIN_SECONDS = 0.5
# Demoted: from some bin on, the primary receives at most this share of the requests sent
# (re-probes of a demoted provider stay under it).
DEMOTED_SHARE = 0.2
# Returned: from some bin on, at least this share of the answers come from the primary.
RETURNED_SHARE = 0.9

SUCCESS_GOAL = 0.999
# A stream the primary cuts after its first bytes reached the client cannot be answered by
# another provider without holding every stream back until it ends (which would cost every
# client its first byte): such requests are the floor, measured in the run. Prism must cut
# at most this share of what calling the primary directly would have cut.
CUT_SHARE_GOAL = 0.10
EXTRA_CALLS_GOAL = 0.10
TTFB_SLACK = 1.2  # p99 may exceed the healthy p99 plus the hedge delay by 20 %
DEMOTION_GOAL_S = 5.0
RETURN_GOAL_S = 30.0
# With a secondary that can continue: broken streams finished as one answer, and a stalled
# one's whole time (its stall told by its pace, then the continuation).
RESUMED_GOAL = 0.99
RESUME_GOAL_S = 5.0


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One client request as the benchmark saw it."""

    start: float  # seconds since the scenario began
    ttfb: float | None  # seconds to the first body byte (None: none arrived)
    total: float  # seconds to the end of the response (or the error)
    status: int  # HTTP status; 0 when no response arrived
    provider: str | None  # the x-prism-provider header
    stream: bool
    ok: bool  # 200 and complete: a parsable body, or a stream ending in data: [DONE]
    error: str | None = None  # why not ok, in a few words
    resumed: bool = False  # a stream another provider finished (its last chunk says so)

    def to_row(self) -> list[Any]:
        """Compact form for the JSON file (see ``RECORD_FIELDS``)."""
        ttfb = None if self.ttfb is None else round(self.ttfb, 5)
        total = round(self.total, 5)
        return [round(self.start, 4), ttfb, total, self.status, self.provider, self.stream,
                self.ok, self.error, self.resumed]  # fmt: skip

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> RequestRecord:
        return cls(*row)


RECORD_FIELDS = (
    "start", "ttfb", "total", "status", "provider", "stream", "ok", "error", "resumed",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class TargetRow:
    """One acceptance target of one scenario: what it asks, what was measured, the verdict."""

    scenario: str
    name: str
    goal: str
    measured: str
    met: bool | None  # None: could not be measured in this run

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def _bins(start: float, end: float) -> list[tuple[float, float]]:
    """Whole bins of BIN_SECONDS covering [start, end) (a partial last bin is dropped)."""
    count = int((end - start) / BIN_SECONDS + 1e-9)
    return [(start + i * BIN_SECONDS, start + (i + 1) * BIN_SECONDS) for i in range(count)]


def _count(times: Sequence[float], low: float, high: float) -> int:
    return sum(1 for t in times if low <= t < high)


def demotion_seconds(
    records: Sequence[RequestRecord], primary_arrivals: Sequence[float], start: float, end: float
) -> float | None:
    """Seconds from the outage's start until requests stop going to the primary first.

    The answer is the start of the earliest bin from which, up to the outage's end, every
    bin's primary arrivals are at most DEMOTED_SHARE of the requests sent in it; None if
    the primary kept getting them to the end.
    """
    sent = [r.start for r in records]
    demoted_from: float | None = None
    for low, high in _bins(start, end):
        share = _count(primary_arrivals, low, high) / max(1, _count(sent, low, high))
        if share > DEMOTED_SHARE:
            demoted_from = None
        elif demoted_from is None:
            demoted_from = low
    return None if demoted_from is None else round(demoted_from - start, 3)


def return_seconds(records: Sequence[RequestRecord], primary: str, end: float) -> float | None:
    """Seconds from the outage's end until the primary answers again.

    The start of the earliest bin after the end from which every later bin with answers
    has at least RETURNED_SHARE of them from ``primary``; None if it never does.
    """
    answered = [r for r in records if r.ok and r.start >= end]
    if not answered:
        return None
    last = max(r.start for r in answered)
    returned_from: float | None = None
    for low, high in _bins(end, last + BIN_SECONDS):
        in_bin = [r for r in answered if low <= r.start < high]
        if not in_bin:
            continue
        share = sum(1 for r in in_bin if r.provider == primary) / len(in_bin)
        if share < RETURNED_SHARE:
            returned_from = None
        elif returned_from is None:
            returned_from = low
    return None if returned_from is None else round(returned_from - end, 3)


def cut_midway(record: RequestRecord) -> bool:
    """A 200 stream whose first bytes reached the client and which then did not complete."""
    return record.stream and record.status == 200 and record.ttfb is not None and not record.ok


def summarize(
    records: Sequence[RequestRecord],
    upstream: Mapping[str, Mapping[str, Any]],
    *,
    primary: str,
    outage: tuple[float, float] | None = None,
    primary_arrivals: Sequence[float] = (),
) -> dict[str, Any]:
    """The numbers of one scenario: success, time to first byte, who answered, upstream calls."""
    sent = len(records)
    ok = sum(1 for r in records if r.ok)
    ttfb = sorted(r.ttfb for r in records if r.ttfb is not None)
    calls = sum(int(stats.get("chat_requests", 0)) for stats in upstream.values())
    summary: dict[str, Any] = {
        "requests": sent,
        "succeeded": ok,
        "success_rate": round(ok / sent, 5) if sent else 0.0,
        "streamed": sum(1 for r in records if r.stream),
        "ttfb_ms": {
            "p50": _ms(percentile(ttfb, 50)),
            "p90": _ms(percentile(ttfb, 90)),
            "p99": _ms(percentile(ttfb, 99)),
            "max": _ms(ttfb[-1]) if ttfb else 0.0,
        },
        # Streams that began (bytes reached the client) and then broke: no failover can save them.
        "cut_midway": sum(1 for r in records if cut_midway(r)),
        "answered_by": dict(Counter(r.provider or "none" for r in records if r.ok)),
        "failures": dict(Counter(r.error or f"status {r.status}" for r in records if not r.ok)),
        "upstream_calls": calls,
        "extra_upstream_calls": round((calls - sent) / sent, 4) if sent else 0.0,
    }
    resumed = sorted(r.total for r in records if r.resumed and r.ok)
    if resumed:
        # Finished by another provider: each cost one more call, which is not waste.
        summary["resumed"] = {
            "completed": len(resumed),
            "total_p50_s": round(percentile(resumed, 50), 3),
            "total_p99_s": round(percentile(resumed, 99), 3),
        }
        summary["extra_upstream_calls"] = (
            round((calls - sent - len(resumed)) / sent, 4) if sent else 0.0
        )
    if outage is not None:
        start, end = outage
        summary["outage"] = {
            "start_s": round(start, 3),
            "end_s": round(end, 3),
            "demotion_s": demotion_seconds(records, primary_arrivals, start, end),
            "return_s": return_seconds(records, primary, end),
        }
    return summary


def _verdict(value: float | None, limit: float, *, at_least: bool = False) -> bool | None:
    if value is None:
        return None
    return value >= limit if at_least else value <= limit


def _resumed_rows(name: str, scenario: Mapping[str, Any]) -> list[TargetRow]:
    """Where the secondary can continue: the broken streams finished as one answer, and how
    long a stalled one took to resume."""
    summary = scenario["summary"]
    resumed = summary.get("resumed", {})
    saved, lost = int(resumed.get("completed", 0)), int(summary.get("cut_midway", 0))
    broken = saved + lost
    share = saved / broken if broken else None
    rows = [
        TargetRow(
            name,
            "broken streams finished by the secondary, text whole",
            f"≥ {RESUMED_GOAL:.0%}",
            "no stream broke" if share is None else f"{share:.2%} ({saved}/{broken})",
            _verdict(share, RESUMED_GOAL, at_least=True),
        )
    ]
    fault = scenario.get("fault") or {}
    if fault.get("mode") == "stall_mid_stream":
        p99 = resumed.get("total_p99_s")
        rows.append(
            TargetRow(
                name,
                "a stalled stream's whole time, resumed (p99)",
                f"≤ {RESUME_GOAL_S:g} s",
                "none resumed" if p99 is None else f"{p99:.2f} s",
                _verdict(p99, RESUME_GOAL_S),
            )
        )
    return rows


def _success_rows(name: str, scenario: Mapping[str, Any]) -> list[TargetRow]:
    """Success, re-based where the primary cuts streams: see ``CUT_SHARE_GOAL``."""
    summary = scenario["summary"]
    fault = scenario.get("fault") or {}
    cut = int(summary.get("cut_midway", 0))
    if scenario.get("resume"):
        return _resumed_rows(name, scenario)
    if fault.get("mode") != "truncated_stream":
        rate = summary["success_rate"]
        return [
            TargetRow(
                name,
                "success rate",
                f"≥ {SUCCESS_GOAL:.1%}",
                f"{rate:.2%} ({summary['succeeded']}/{summary['requests']})",
                _verdict(rate, SUCCESS_GOAL, at_least=True),
            )
        ]
    savable = summary["requests"] - cut
    rate = summary["succeeded"] / savable if savable else 0.0
    direct = float(fault.get("probability", 1.0)) * summary["streamed"]
    share = cut / direct if direct else 0.0
    return [
        TargetRow(
            name,
            "success rate, less streams cut after their first byte",
            f"≥ {SUCCESS_GOAL:.1%}",
            f"{rate:.2%} ({summary['succeeded']}/{savable}; "
            f"all requests {summary['success_rate']:.2%})",
            _verdict(rate, SUCCESS_GOAL, at_least=True),
        ),
        TargetRow(
            name,
            "streams cut after their first byte",
            f"≤ {CUT_SHARE_GOAL:.0%} of calling the primary directly",
            f"{cut} of ~{direct:.0f} ({share:.1%})",
            _verdict(share, CUT_SHARE_GOAL),
        ),
    ]


def evaluate(result: Mapping[str, Any]) -> list[TargetRow]:
    """Every target of every scenario in ``result`` (the benchmark's JSON), met or missed.

    The time-to-first-byte target needs the healthy baseline; without it the row says so.
    """
    hedge = float(result["hedge_delay_s"])
    scenarios: Mapping[str, Mapping[str, Any]] = result["scenarios"]
    healthy = scenarios.get("healthy")
    rows: list[TargetRow] = []
    for name, scenario in scenarios.items():
        summary = scenario["summary"]
        rows.extend(_success_rows(name, scenario))
        extra = summary["extra_upstream_calls"]
        rows.append(
            TargetRow(
                name,
                "extra upstream calls",
                f"≤ {EXTRA_CALLS_GOAL:.0%}",
                f"{extra:.1%} ({summary['upstream_calls']} calls for "
                f"{summary['requests']} requests)",
                _verdict(extra, EXTRA_CALLS_GOAL),
            )
        )
        if name != "healthy":
            p99 = summary["ttfb_ms"]["p99"]
            if healthy is None:
                rows.append(
                    TargetRow(
                        name,
                        "TTFB p99",
                        "healthy p99 + hedge + 20 %",
                        f"{p99:.1f} ms (no healthy baseline in this run)",
                        None,
                    )
                )
            else:
                base = healthy["summary"]["ttfb_ms"]["p99"]
                limit = (base + hedge * 1000) * TTFB_SLACK
                rows.append(
                    TargetRow(
                        name,
                        "TTFB p99",
                        f"≤ (healthy p99 + hedge {hedge:g} s) x {TTFB_SLACK:g} = {limit:.0f} ms",
                        f"{p99:.1f} ms (p50 {summary['ttfb_ms']['p50']:.1f} ms)",
                        p99 <= limit,
                    )
                )
        outage = summary.get("outage")
        if outage is not None:
            demoted = outage["demotion_s"]
            rows.append(
                TargetRow(
                    name,
                    "demotion after the outage starts",
                    f"≤ {DEMOTION_GOAL_S:g} s",
                    "never (the primary was tried first throughout)"
                    if demoted is None
                    else f"{demoted:.1f} s",
                    False if demoted is None else demoted <= DEMOTION_GOAL_S,
                )
            )
            back = outage["return_s"]
            rows.append(
                TargetRow(
                    name,
                    "back on the primary after the outage",
                    f"≤ {RETURN_GOAL_S:g} s",
                    "never (within the run)" if back is None else f"{back:.1f} s",
                    False if back is None else back <= RETURN_GOAL_S,
                )
            )
    return rows
