"""`prism bench`: the whole stack on loopback, every layer against its floor;
`prism bench faults`: the origin's failover with a sick provider, scenario by scenario."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer
from rich.console import Console, RenderableType
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

# Only the scenario names at import (the options' help); each command imports what it runs,
# so every other `prism` command (the origin's `serve` too) starts without the bench.
from deploy.bench.fault_scenarios import DEFAULT_SCENARIOS, SCENARIOS

from ._options import JsonOption

__all__ = [
    "app",
    "bench_command",
    "budget_command",
    "faults_command",
    "geo_command",
    "logsinks_command",
    "regions_command",
    "semantic_command",
]

# The callback's docstring is the group's help: `prism bench` itself is the layer benchmark.
app = typer.Typer(name="bench")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM unwinds like Ctrl-C, through the runner's cleanup.
    raise KeyboardInterrupt


@app.callback(invoke_without_command=True)
def bench_command(
    ctx: typer.Context,
    quick: Annotated[
        bool, typer.Option("--quick", help="Tiny run (1 s per case, no warm-up): a smoke check.")
    ] = False,
    duration: Annotated[
        float | None,
        typer.Option(help="Seconds per measured run (default 10; 1 with --quick)."),
    ] = None,
    out: Annotated[Path, typer.Option(help="Where the JSON and PNG go.")] = Path("bench-results"),
    profile: Annotated[
        bool,
        typer.Option(
            "--profile",
            help="Also show where the time goes (extra runs): the edge's KV hit step by step, "
            "and py-spy on the origin.",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Benchmark every layer against its floor, on loopback, in one run: the edge (KV hit
    and bad key vs a trivial Python Worker), the origin (Redis hit and miss at concurrency
    1 and 32 vs a one-GET ASGI app and the provider itself), streaming time to first byte,
    the KV writer, and the origin's memory. Prints a table, writes JSON and a PNG chart.

    Uses wrk when installed (apt-get install wrk), else a slower Python load generator,
    clearly labelled. `prism bench faults` measures failover instead (see its --help).
    Example: prism bench --duration 5
    """
    from deploy.bench.loadgen import wrk_path
    from deploy.bench.report import render_table, write_results
    from deploy.bench.runner import BenchConfig, BenchError, BenchRunner
    from deploy.local.stack import StackError
    from deploy.local.workers import RuntimeStartError, ToolchainNotFoundError

    if ctx.invoked_subcommand is not None:
        return
    console = Console(stderr=True)
    config = BenchConfig.smoke() if quick else BenchConfig()
    config = replace(config, profile=profile, profile_dir=out / "profile")
    if duration is not None:
        config = replace(config, duration=duration)
    if wrk_path() is None:
        console.print(
            "[yellow]wrk not found: using the Python fallback load generator, which is slower "
            "and may be the bottleneck (apt-get install wrk).[/yellow]"
        )
    # A bar on a terminal; plain step lines when logged (CI, pipes), nothing with --json.
    show_bar = console.is_terminal and not as_json
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not show_bar,
    ) as progress:
        task = progress.add_task("starting", total=None)
        done = 0
        began = time.monotonic()

        def step(label: str) -> None:
            nonlocal done
            progress.update(task, description=label, completed=done)
            done += 1
            if not show_bar and not as_json:
                elapsed = time.monotonic() - began
                console.print(f"[dim]{elapsed:5.1f}s {label}[/dim]", highlight=False)

        runner = BenchRunner(config, on_step=step)
        progress.update(task, total=runner.total_steps)
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            result = runner.run()
        except (BenchError, StackError, RuntimeStartError, ToolchainNotFoundError) as error:
            console.print(f"[red]Error:[/red] {str(error).splitlines()[0]}")
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            console.print("Benchmark interrupted; everything it started was stopped.")
            raise typer.Exit(130) from None
        finally:
            signal.signal(signal.SIGTERM, previous)
    _report(console, result, write_results(result, out), render_table(result), as_json)


def _pairs(values: list[str], option: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise typer.BadParameter(f"expected NAME=VALUE, got {item!r}", param_hint=option)
        pairs[name.strip()] = value
    return pairs


@app.command("faults")
def faults_command(
    requests: Annotated[int, typer.Option(help="Requests per scenario.")] = 2000,
    concurrency: Annotated[int, typer.Option(help="Requests in flight at once.")] = 16,
    scenario: Annotated[
        list[str] | None,
        typer.Option(
            help=f"Run only these (repeatable; the healthy baseline always runs first): "
            f"{', '.join(SCENARIOS)}. Default: {', '.join(DEFAULT_SCENARIOS)}.",
        ),
    ] = None,
    hedge_delay: Annotated[
        float,
        typer.Option(help="The router's hedge delay (s) the time-to-first-byte target allows."),
    ] = 0.25,
    outage_lead: Annotated[
        float, typer.Option(help="Healthy seconds before the primary's outage starts.")
    ] = 3.0,
    outage_seconds: Annotated[
        float, typer.Option(help="How long the primary's outage lasts (s).")
    ] = 10.0,
    recovery_seconds: Annotated[
        float, typer.Option(help="How long the return to the primary is watched (s).")
    ] = 30.0,
    origin_env: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=VALUE for the origin's environment (repeatable), e.g. router settings."
        ),
    ] = None,
    provider_setting: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=VALUE added to both providers' tables in the providers file "
            "(repeatable; VALUE is TOML, e.g. first_byte_timeout=5)."
        ),
    ] = None,
    out: Annotated[Path, typer.Option(help="Where the JSON and PNG go.")] = Path("bench-results"),
    as_json: JsonOption = False,
) -> None:
    """Benchmark failover while one provider is sick, scenario by scenario.

    Two local providers (primary, secondary) behind a real origin and Redis; per
    scenario the primary fails one way (30 % 5xx, stalls before the first
    byte, an outage that recovers, 429 with Retry-After, streams cut mid-way) while the
    secondary stays healthy. Reports success rate, time to first byte against the healthy
    baseline, extra upstream calls, and for the outage how fast the primary is demoted and
    taken back; each target met or missed. Writes JSON and a PNG timeline.

    Example: prism bench faults --requests 500 --scenario outage
    """
    from deploy.bench.fault_report import render_fault_table, write_fault_results
    from deploy.bench.faults import FaultBenchConfig, FaultBenchRunner
    from deploy.bench.runner import BenchError

    console = Console(stderr=True)
    try:
        config = FaultBenchConfig(
            requests=requests,
            concurrency=concurrency,
            scenarios=tuple(scenario) if scenario else DEFAULT_SCENARIOS,
            hedge_delay=hedge_delay,
            outage_lead=outage_lead,
            outage_seconds=outage_seconds,
            recovery_seconds=recovery_seconds,
            origin_env=_pairs(origin_env or [], "--origin-env"),
            provider_settings=_pairs(provider_setting or [], "--provider-setting"),
        )
    except BenchError as error:
        console.print(f"[red]Error:[/red] {error}", soft_wrap=True)
        raise typer.Exit(2) from None
    show_bar = console.is_terminal and not as_json
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not show_bar,
    ) as progress:
        tasks = {
            name: progress.add_task(name, total=requests, start=False) for name in config.scenarios
        }
        logged: set[str] = set()
        began = time.monotonic()

        def on_progress(name: str, done: int, total: int) -> None:
            if name not in logged:
                logged.add(name)
                progress.start_task(tasks[name])
                if not show_bar and not as_json:
                    elapsed = time.monotonic() - began
                    console.print(f"[dim]{elapsed:5.1f}s scenario {name}[/dim]", highlight=False)
            progress.update(tasks[name], completed=done)

        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            result = FaultBenchRunner(config, on_progress).run()
        except BenchError as error:
            console.print(f"[red]Error:[/red] {str(error).splitlines()[0]}", soft_wrap=True)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            console.print("Benchmark interrupted; everything it started was stopped.")
            raise typer.Exit(130) from None
        finally:
            signal.signal(signal.SIGTERM, previous)
    _report(console, result, write_fault_results(result, out), render_fault_table(result), as_json)


def _report(
    console: Console,
    result: dict[str, Any],
    paths: dict[str, Path],
    table: RenderableType,
    as_json: bool,
) -> None:
    """The result as JSON on stdout, or its table; then where the files went (stderr)."""
    if as_json:
        typer.echo(json.dumps(result))
    else:
        # Wide enough for the table even when piped (make bench | tee), where rich assumes 80.
        stdout = Console()
        if not stdout.is_terminal:
            stdout = Console(width=150)
        stdout.print(table)
    console.print(
        "results: " + ", ".join(str(p) for p in paths.values()), highlight=False, soft_wrap=True
    )


@app.command("semantic")
def semantic_command(
    threshold: Annotated[
        float | None,
        typer.Option(help="The threshold to report in detail. [default: the policy's default]"),
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(help="A sentence-transformers model directory. [default: the bundled one]"),
    ] = None,
    pairs: Annotated[
        list[Path] | None,
        typer.Option(
            "--pairs",
            help='Instead: labelled pairs from this file (JSON lines {"a", "b", "same"}; '
            "repeatable): b asked after a was cached; writes JSON and a PNG to --out.",
        ),
    ] = None,
    scale: Annotated[
        int | None,
        typer.Option(help="Instead: the cost of a miss with this many records in one partition."),
    ] = None,
    out: Annotated[Path, typer.Option(help="Where --pairs writes.")] = Path("bench-results"),
    engine: Annotated[
        str, typer.Option(help="The engine: auto (onnxruntime int8, else numpy), onnx, numpy.")
    ] = "auto",
    load: Annotated[
        bool,
        typer.Option(
            "--load",
            help="Instead: the layer under load, 50/200/500 unique misses a second through "
            "two real origins (writes semantic-load.json to --out).",
        ),
    ] = False,
    quick: Annotated[
        bool, typer.Option("--quick", help="With --load: one small rate for 3 s, a smoke check.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Measure the semantic cache's precision on the labelled question pairs (paraphrases
    that should match, near misses that must not), at a sweep of thresholds, with and
    without the lexical guard; and the model's cost (ms per embedding, RSS). With
    --pairs, the same on other labelled files; with --scale, a miss's cost and the memory
    with that many records in one partition (a private redis-server); with --load, the
    layer at 50, 200 and 500 unique misses a second (a provider answering in 100 ms):
    lookups by outcome, the latency it adds over the same load with it off, embedding
    cost and batches, origin CPU and RSS, and paraphrases found 10 ms (same origin) and
    150 ms (another origin) after their original was answered (exit status 1 if a check
    fails).

    Example: prism bench semantic --threshold 0.92
    """
    from deploy.bench.semantic import run
    from origin.settings import SEMANTIC_ENGINES
    from prism import DEFAULT_SEMANTIC_THRESHOLD

    if load:
        _semantic_load(quick, out, as_json)
        return
    chosen = DEFAULT_SEMANTIC_THRESHOLD if threshold is None else threshold
    if engine not in SEMANTIC_ENGINES:
        raise typer.BadParameter(f"--engine must be {', '.join(SEMANTIC_ENGINES)}")
    if pairs or scale is not None:
        from deploy.bench.semantic_cli import other_runs

        other_runs(pairs or [], scale, chosen, model, out, as_json, engine)
        return
    try:
        report = run(chosen, model, engine=engine)
    except (RuntimeError, OSError, ImportError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(report.to_dict()))
        return
    from rich.table import Table

    table = Table(title=f"Semantic cache precision ({report.model}, {report.pairs} pairs)")
    for column in ("set", "threshold", "hit rate", "wrong hits", "hit rate*", "wrong hits*"):
        table.add_column(column, justify="right")
    for row in report.rows:
        mark = " <" if row.threshold == chosen else ""
        table.add_row(
            row.split,
            f"{row.threshold:.2f}{mark}",
            f"{row.hit_rate:.1%}",
            f"{row.wrong_hit_rate:.1%}",
            f"{row.hit_rate_unguarded:.1%}",
            f"{row.wrong_hit_rate_unguarded:.1%}",
        )
    stdout = Console() if Console().is_terminal else Console(width=120)
    stdout.print(table)
    stdout.print("* without the lexical guard (cosine similarity alone)")
    stdout.print(
        f"{report.paraphrases} paraphrases, {report.near_misses} near misses; at "
        f"{chosen:.2f}: {len(report.wrong_hits)} wrong hits, {len(report.missed)} missed "
        f"paraphrases. Model: {report.engine}, loaded in {report.load_seconds:.2f} s, "
        f"{report.embed_ms_p50:.2f} ms p50 / {report.embed_ms_p99:.2f} ms p99 per "
        f"embedding (wall), {report.embed_cpu_ms_p50:.2f} ms p50 CPU, RSS {report.rss_mb:.0f} MB."
    )
    for wrong in report.wrong_hits:
        stdout.print(
            f"wrong hit ({wrong['kind']}, {wrong['score']}): {wrong['a']!r} ~ {wrong['b']!r}"
        )


def _semantic_load(quick: bool, out: Path, as_json: bool) -> None:
    from deploy.bench.machine import machine_info
    from deploy.bench.semantic_load import LoadConfig, run_semantic_load
    from deploy.bench.semantic_load_report import render_load, write_load

    console = Console(stderr=True)
    config = LoadConfig.quick() if quick else LoadConfig()
    result = _on_the_stack(
        console,
        lambda step: write_load(config, run_semantic_load(config, step), machine_info(), out),
    )
    if as_json:
        typer.echo(json.dumps(result))
    else:
        stdout = Console() if Console().is_terminal else Console(width=180)
        stdout.print(render_load(result))
        console.print(f"results: {out / 'semantic-load.json'}", markup=False)
    if not all(check["ok"] for check in result["checks"]):
        raise typer.Exit(1)


@app.command("budget")
def budget_command(
    concurrent: Annotated[
        int, typer.Option(help="Concurrent misses against a budget with room for 10.")
    ] = 200,
    misses: Annotated[int, typer.Option(help="Sequential misses per side (budget or not).")] = 200,
    as_json: JsonOption = False,
) -> None:
    """Budgets under load, in one process on loopback (a private Redis, the provider
    stand-in, the origin): how many of CONCURRENT distinct misses a budget with room for
    10 admits, and what a budget adds to a miss (end to end, and its Redis script alone).

    Example: prism bench budget --concurrent 200
    """
    from deploy.bench.budget import run_budget_bench

    if not 1 <= concurrent <= 1000 or not 20 <= misses <= 10_000:
        raise typer.BadParameter("--concurrent must be 1-1000 and --misses 20-10000")
    result = run_budget_bench(concurrent, misses)
    if as_json:
        typer.echo(json.dumps(result))
        return
    admission, miss = result["admission"], result["miss_path"]
    typer.echo(
        f"admission: {admission['admitted']} of {admission['concurrent']} concurrent misses "
        f"admitted (the budget holds {admission['budget_room']}), {admission['refused_429']} "
        f"refused; spent ${admission['spent_usd']:.6f} of ${admission['limit_usd']:.6f}, "
        f"reserved after: ${admission['reserved_after_usd']:.6f}; {admission['wall_s']} s"
    )
    typer.echo(
        f"miss p50: {miss['no_budget']['p50_ms']} ms without a budget, "
        f"{miss['budget']['p50_ms']} ms with one; the reservation script alone: "
        f"{miss['redis_script']['reserve_p50_us']} us (settle, after the answer: "
        f"{miss['redis_script']['settle_p50_us']} us)"
    )


@app.command("regions")
def regions_command(
    quick: Annotated[
        bool, typer.Option("--quick", help="Smoke-sized: the same scenarios in about a minute.")
    ] = False,
    out: Annotated[Path, typer.Option(help="Where regions.json and regions.png go.")] = Path(
        "bench-results"
    ),
    as_json: JsonOption = False,
) -> None:
    """A second region's worth when the nearest origin is in trouble, on the `prism dev
    --regions 2` stack: 10 new requests a second through the edge for 90 s, the nearest
    origin stopped (SIGSTOP) at 20 s and resumed at 60 s; the same with SIGKILL and a
    restart; then a provider taking 20 s for every answer. Checks (exit status 1 if one
    fails): ≥ 99 % answered 200, none slower than the probe (2 s + 1 s) + its normal
    latency + 1 s, the median once detected within 10 % of the healthy one, traffic back
    on the nearest origin within a recheck (5 s) once it answers; with the slow provider,
    no failover and one provider call per request.

    Example: prism bench regions --quick
    """
    from deploy.bench.regions import RegionsConfig, run_regions
    from deploy.bench.regions_report import render_regions, write_regions

    console = Console(stderr=True)
    config = RegionsConfig.quick() if quick else RegionsConfig()
    result = _on_the_stack(console, lambda step: run_regions(config, on_step=step))
    path, chart_problem = write_regions(result, out)
    if as_json:
        typer.echo(json.dumps({k: v for k, v in result.items() if k != "scenarios"} | {
            "scenarios": [{k: v for k, v in s.items() if k != "samples"}
                          for s in result["scenarios"]]
        }))  # fmt: skip
    else:
        stdout = Console() if Console().is_terminal else Console(width=160)
        stdout.print(render_regions(result))
        console.print(
            f"results: {path}" + (f" ({chart_problem})" if chart_problem else ""), markup=False
        )
    if not result["ok"]:
        raise typer.Exit(1)


@app.command("geo")
def geo_command(
    requests: Annotated[int, typer.Option(help="New requests per customer and edge.")] = 10,
    scale: Annotated[
        float, typer.Option(help="Every distance of the profile times this (0.1: a quick run).")
    ] = 1.0,
    loopback: Annotated[
        bool, typer.Option("--loopback", help="No network namespaces even when root.")
    ] = False,
    out: Annotated[Path, typer.Option(help="Where geo.json and geo.png go.")] = Path(
        "bench-results"
    ),
    as_json: JsonOption = False,
) -> None:
    """The three requests (miss, Redis hit, KV hit) of a customer in Singapore and one in
    San Francisco, with the origin in ap-south-1 only and with a second in us-west-1, each
    part in its own network namespace with a delay proxy on every link (round trips from
    the profile in deploy/bench/geo_profile.py); then the nearer origin killed mid-run.
    Checks (exit status 1 if one fails): a KV hit costs at most the client-PoP round trip
    + 5 ms, a Redis hit one PoP-origin round trip + 10 ms, San Francisco's miss pays the
    us-west-1 round trip with two regions, and no request fails when an origin dies.
    Without root (or `ip`), every part runs on loopback instead, and it says so.

    Example: prism bench geo --requests 10
    """
    from deploy.bench.geo import GeoConfig, run_geo
    from deploy.bench.geo_profile import DEFAULT_PROFILE
    from deploy.bench.geo_report import render_geo, write_geo
    from deploy.local import netns

    console = Console(stderr=True)
    why_not = "--loopback given" if loopback else netns.available()
    if why_not is not None:
        console.print(
            f"[yellow]No network namespaces ({why_not}): every part on loopback, the same "
            "delay proxies between them.[/yellow]"
        )
    profile = DEFAULT_PROFILE if scale == 1.0 else DEFAULT_PROFILE.scaled(scale)
    config = GeoConfig(profile, requests=requests, isolated=why_not is None)
    result = _on_the_stack(console, lambda step: run_geo(config, on_step=step))
    path, chart_problem = write_geo(result, out)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        stdout = Console() if Console().is_terminal else Console(width=160)
        stdout.print(render_geo(result))
        console.print(
            f"results: {path}" + (f" ({chart_problem})" if chart_problem else ""), markup=False
        )
    if not all(check["ok"] for check in result["checks"]):
        raise typer.Exit(1)


@app.command("logsinks")
def logsinks_command(
    outage: Annotated[
        float | None,
        typer.Option(help="Seconds S3 and the collector stay down (default 60; 3 with --quick)."),
    ] = None,
    rate: Annotated[int | None, typer.Option(help="Requests a second (default 200).")] = None,
    phase: Annotated[
        float | None, typer.Option(help="Seconds before and after the outage (default 30).")
    ] = None,
    buffer: Annotated[
        int,
        typer.Option(help="PRISM_LOG_BUFFER: records that may wait per sink (past it: dropped)."),
    ] = 50_000,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick", help="100 requests/s, 2 s before and after, 3 s down: a smoke run."
        ),
    ] = False,
    out: Annotated[Path, typer.Option(help="Where logsinks.json goes.")] = Path("bench-results"),
    as_json: JsonOption = False,
) -> None:
    """The request log's sinks killed under load: one origin with every sink on (the
    Redis window, durable files in S3 on moto, OTLP logs to a Rotel collector), steady
    open-loop load of Redis hits and 10 % misses; S3 and the collector SIGKILLed, kept
    down --outage seconds and started again on their ports. Per phase (before, outage,
    after): requests, errors, p50/p99; per sink: records produced, found in it afterwards,
    counted dropped, the most waiting. Checks (exit status 1 if one fails): no request
    failed, the outage's p99 within 1.5 x before + 2 ms, and for every sink found +
    dropped == produced.

    Example: prism bench logsinks --quick
    """
    from deploy.bench.machine import machine_info
    from deploy.bench.sink_outage import OutageConfig, run_sink_outage
    from deploy.bench.sink_outage_report import render_outage, write_outage

    config = OutageConfig.quick() if quick else OutageConfig()
    changes: dict[str, Any] = {"buffer": buffer}
    if outage is not None:
        changes["outage"] = outage
    if rate is not None:
        changes["rate"] = rate
    if phase is not None:
        changes["before"] = changes["after"] = phase
    config = replace(config, **changes)
    if config.outage <= 0 or config.rate < 1 or config.before <= 0 or config.buffer < 1:
        raise typer.BadParameter("--outage, --phase, --rate and --buffer must be positive")
    console = Console(stderr=True)
    result = _on_the_stack(
        console,
        lambda step: write_outage(config, run_sink_outage(config, step), machine_info(), out),
    )
    if as_json:
        typer.echo(json.dumps(result))
    else:
        stdout = Console() if Console().is_terminal else Console(width=140)
        stdout.print(render_outage(result))
        console.print(f"results: {out / 'logsinks.json'}", markup=False)
    if not all(check["ok"] for check in result["checks"]):
        raise typer.Exit(1)


def _on_the_stack(
    console: Console, run: Callable[[Callable[[str], None]], dict[str, Any]]
) -> dict[str, Any]:
    """``run`` (a bench on the local stack, told how to say each step) with SIGTERM taken
    as Ctrl-C, so the stack is stopped; a stack that cannot start is one red line and exit
    status 1."""
    from deploy.local.stack import StackError
    from deploy.local.workers import RuntimeStartError, ToolchainNotFoundError

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return run(lambda step: console.print(f"[dim]{step}…[/dim]"))
    except (StackError, RuntimeStartError, ToolchainNotFoundError, RuntimeError, OSError) as error:
        console.print(f"[red]Error:[/red] {error}")
        raise typer.Exit(1) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
