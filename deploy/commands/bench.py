"""`prism bench`: the whole stack on loopback, every layer against its floor."""

from __future__ import annotations

import json
import signal
import time
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from deploy.bench import BenchConfig, BenchError, BenchRunner, render_table, write_results
from deploy.bench.loadgen import wrk_path
from deploy.local.stack import StackError
from deploy.local.workers import RuntimeStartError, ToolchainNotFoundError

from ._options import JsonOption

__all__ = ["bench_command"]


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM unwinds like Ctrl-C, through the runner's cleanup.
    raise KeyboardInterrupt


def bench_command(
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
    clearly labelled. Example: prism bench --duration 5
    """
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
    paths = write_results(result, out)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        # Wide enough for the table even when piped (make bench | tee), where rich assumes 80.
        stdout = Console()
        if not stdout.is_terminal:
            stdout = Console(width=150)
        stdout.print(render_table(result))
    console.print(
        "results: " + ", ".join(str(p) for p in paths.values()), highlight=False, soft_wrap=True
    )
