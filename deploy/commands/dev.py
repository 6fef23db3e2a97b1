"""`prism dev`: the whole stack on loopback, in one command."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console

from deploy.local.stack import DEMO_LABEL, Component, LocalStack, StackConfig, StackError

__all__ = ["dev_command"]


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM behaves like Ctrl-C: unwind through stack.stop().
    raise KeyboardInterrupt


def dev_command(
    origin_port: Annotated[int, typer.Option(help="Port of the origin.")] = 8080,
    edge_port: Annotated[int, typer.Option(help="Port of the edge Worker.")] = 8787,
    kv_port: Annotated[int, typer.Option(help="Port of the Workers KV REST stand-in.")] = 8788,
    redis_url: Annotated[
        str | None,
        typer.Option(
            envvar="REDIS_URL",
            help="Use this Redis instead of starting a private one.",
            show_envvar=True,
        ),
    ] = None,
    regions: Annotated[
        int,
        typer.Option(
            min=1,
            max=2,
            help="2: a second origin (region ap-south-1, next to us-west-1) reading a "
            "replica of the private Redis, and the edge failing over between them.",
        ),
    ] = 1,
    state_dir: Annotated[
        Path, typer.Option(help="Where the stack keeps KV data, logs and dev secrets.")
    ] = Path(".prism"),
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print one JSON line with URLs and the dev key when ready."),
    ] = False,
) -> None:
    """Run the whole stack locally: Redis, the origin, the edge Worker (real local
    Workers runtime) with the KV REST stand-in, and the providers from the environment
    (OPENAI_API_KEY, ANTHROPIC_API_KEY or PRISM_PROVIDERS_FILE) or else a local demo provider.

    Dev secrets and a dev key are created when none are set. Ctrl-C stops everything.

    Example: prism dev --edge-port 8787   (or --regions 2 for two origins)
    """
    console = Console(stderr=True)
    state_dir.mkdir(parents=True, exist_ok=True)

    def ready(component: Component) -> None:
        console.print(
            f"[green]✓[/green] {component.name:<9} {component.url}  [dim]{component.detail}"
        )

    stack = LocalStack(
        StackConfig(
            state_dir=state_dir,
            origin_port=origin_port,
            edge_port=edge_port,
            kv_api_port=kv_port,
            redis_url=redis_url,
            regions=regions,
        ),
        on_ready=ready,
    )
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with console.status("Starting the Prism stack…"):
            info = stack.start()
        if info.provider == DEMO_LABEL:
            console.print(
                "[yellow]No provider keys set: answers come from the local demo provider "
                f"(x-prism-provider: {DEMO_LABEL}), not a real model.[/yellow]"
            )
        # Plain lines, not a table: the key must never be cut to fit the terminal.
        console.print(f"\n[bold]Prism is running[/bold] at {info.edge_url} (project 'dev')")
        console.print(f"dev key: {info.api_key}", soft_wrap=True, highlight=False)
        console.print(
            f"try:     prism smoke {info.edge_url} --key {info.api_key}",
            soft_wrap=True,
            highlight=False,
        )
        console.print(
            f"watch:   prism top   ·   dashboard: {info.origin_admin_url}/dashboard "
            f"(admin key: PRISM_ADMIN_KEY in {state_dir}/dev-secrets.json)",
            soft_wrap=True,
            highlight=False,
        )
        console.print("[dim]Ctrl-C to stop.[/dim]")
        if as_json:
            typer.echo(json.dumps(info.to_dict()))
        while True:
            dead = stack.dead_component()
            if dead is not None:
                console.print(f"[red]{dead} stopped unexpectedly; logs in {state_dir}/logs/[/red]")
                raise typer.Exit(1)
            time.sleep(0.2)
    except StackError as error:
        console.print(f"[red]Error:[/red] {error}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        pass
    finally:
        with console.status("Stopping…"):
            stack.stop()
        signal.signal(signal.SIGTERM, previous)
        console.print("Prism stack stopped.")
