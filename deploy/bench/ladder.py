"""The edge's KV hit taken apart: the ladder Worker, staged and measured step by step.

Python inside workerd cannot be sampled and its clock stands still while code
runs, so each step of a hit (read the request, check the key, read and parse
the body, fingerprint, KV read, decode, respond) is timed from outside: the
ladder Worker answers after step N, and step N's cost is its median minus
step N-1's. Two probes stand apart: ``fetch`` (one outbound fetch, the fixed
cost of every forward to the origin) and ``edge`` (the real Worker), both
counted from the constant answer. The entry runs next to the real ``prism``
and ``edge`` packages, staged by the same builder as the edge itself.
"""

from __future__ import annotations

import shutil
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from deploy.edge_bundle import build_edge
from deploy.local.workers import ExtraWorker

from .loadgen import LoadSpec, run_load
from .servers import BenchError

__all__ = ["LADDER_STEPS", "ladder_worker", "measure_ladder"]

_ENTRY = Path(__file__).with_name("workers") / "ladder" / "entry.py"
# Kept in step with STEPS in workers/ladder/entry.py (that file runs only in Pyodide).
LADDER_STEPS = (
    "const", "request", "auth", "body", "parse", "fingerprint", "kv", "kv_bounded", "decode",
    "respond", "fetch", "edge", "edge_miss",
)  # fmt: skip
# Measured apart from the ladder: what each adds is counted from "const".
_APART = frozenset({"fetch", "edge", "edge_miss"})


def ladder_worker(folder: Path, secrets: Mapping[str, str], constant_url: str) -> ExtraWorker:
    """Stage the ladder Worker in ``folder`` (the edge bundle with another entry).

    Its origin is ``constant_url`` (a server that answers at once), so the real
    edge's miss path is measured without the origin's own time in it.
    """
    bundle = build_edge("local", folder, origin_url=constant_url)
    shutil.copyfile(_ENTRY, bundle.root / "entry.py")
    variables = {**secrets, "ORIGIN_URL": constant_url}
    return ExtraWorker("ladder", bundle.root, vars=variables, kv_binding="PRISM_KV")


def measure_ladder(
    url: str,
    bodies: tuple[str, str],
    headers: Mapping[str, str],
    seconds: int,
    rounds: int,
    on_step: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Each step at concurrency 1, ``rounds`` times round-robin (so drifting load from
    elsewhere touches every step alike); the median of the rounds' p50s, and what
    each step adds over the one before it. ``bodies``: (the hit body, a miss body
    with the ``UNIQUE`` token)."""
    p50s: dict[str, list[float]] = {step: [] for step in LADDER_STEPS}
    p90s: dict[str, list[float]] = {step: [] for step in LADDER_STEPS}
    for number in range(rounds):
        on_step(f"edge ladder: round {number + 1} of {rounds}")
        for step in LADDER_STEPS:
            body = bodies[1] if step == "edge_miss" else bodies[0]
            load = LoadSpec(url=f"{url}?step={step}", concurrency=1, duration=seconds,
                            body=body, headers=headers, nonce=f"ladder{number}")  # fmt: skip
            result = run_load(load)
            if result.non_2xx or result.errors:
                raise BenchError(f"ladder step {step} failed ({result.non_2xx} non-2xx)")
            p50s[step].append(result.p50_ms)
            p90s[step].append(result.p90_ms)
    rows: list[dict[str, Any]] = []
    previous = 0.0
    for step in LADDER_STEPS:
        p50 = statistics.median(p50s[step])
        base = rows[0]["p50_ms"] if step in _APART else previous
        rows.append(
            {
                "step": step,
                "p50_ms": round(p50, 3),
                "p90_ms": round(statistics.median(p90s[step]), 3),
                "added_p50_ms": round(p50 - base, 3),
                "measured_from": "const" if step in _APART else "previous step",
            }
        )
        if step not in _APART:
            previous = p50
    return rows
