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

Nothing is imported here: `prism`'s other commands start without the bench.
"""
