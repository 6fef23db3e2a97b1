"""`prism bench`: every layer of the gateway against its floor, in one run, on loopback.

- ``runner``: drives the load against each row and its floor, collects the result;
  ``bench_stack``: starts the stack, the floors and the ceiling, and checks every path.
- ``loadgen``: wrk with a generated Lua script (or a labelled Python fallback).
- ``floor_app``: the minimal ASGI app that does one Redis GET (the Redis-hit floor).
- ``workers/trivial``: the trivial Python Worker (the edge's floor in the same runtime).
- ``probes``: time to first byte of streams; ``profiler``: py-spy on the origin.
- ``report``: the table, the JSON and the PNG chart; ``targets``: the performance targets.
- ``hit_driver``: Redis hits through the origin's app in-process, for callgrind's
  instruction counts (load-independent, unlike wall-clock rows on a shared machine).

`prism bench faults` (failover with a sick provider): ``faults`` runs it,
``fault_scenarios`` says how the primary fails, ``fault_load`` is the client,
``fault_metrics`` the numbers and targets (pure), ``fault_report`` the output.
"""

from .loadgen import LoadResult, LoadSpec, run_load
from .report import draw_chart, render_table, write_results
from .runner import BenchConfig, BenchError, BenchRunner
from .targets import evaluate_targets

__all__ = [
    "BenchConfig",
    "BenchError",
    "BenchRunner",
    "LoadResult",
    "LoadSpec",
    "draw_chart",
    "evaluate_targets",
    "render_table",
    "run_load",
    "write_results",
]
