"""`prism dev`: the whole stack on loopback, in one command."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer
from rich.console import Console

from deploy.local.stack import DEMO_LABEL, Component, LocalStack, StackConfig, StackError

__all__ = ["dev_command"]

# Each of these unwinds through stack.stop(), as Ctrl-C does.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Stopping:
    """The first SIGINT, SIGTERM or SIGHUP raises KeyboardInterrupt; from then on, and once
    the stop has begun, they are ignored, so none cuts stack.stop() short (make forwards
    to its child the SIGTERM the whole group had already been sent)."""

    def __init__(self) -> None:
        self._begun = False
        self._previous: dict[int, Any] = {}
        self._done = threading.Event()

    def install(self, parent: int | None) -> None:
        for signum in _STOP_SIGNALS:
            if signal.getsignal(signum) is not signal.SIG_IGN:  # nohup, a background job
                self._previous[signum] = signal.signal(signum, self._on_signal)
        ttys = [fd for fd in (0, 1, 2) if os.isatty(fd)]
        if parent is not None or ttys:
            watch = threading.Thread(
                target=self._watch, args=(parent, ttys), name="prism-dev-watch", daemon=True
            )
            watch.start()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self._begun:
            self._begun = True
            raise KeyboardInterrupt

    def _watch(self, parent: int | None, ttys: list[int]) -> None:
        """Turns our parent's death (reparented) into SIGTERM, and our terminal's hang-up
        into SIGHUP: the session leader alone is sent SIGHUP when a terminal closes (tmux
        kill-session with `make dev` as the pane's command), and make then waits for us."""
        poller = select.poll() if ttys and hasattr(select, "poll") else None
        for fd in ttys:
            if poller is not None:
                poller.register(fd, 0)  # hang-ups are always reported
        while not self._done.wait(0.2):
            if parent is not None and os.getppid() != parent:
                signum = signal.SIGTERM
            elif poller is not None and any(e & select.POLLHUP for _, e in poller.poll(0)):
                signum = signal.SIGHUP
            else:
                continue
            main = threading.main_thread().ident
            assert main is not None
            signal.pthread_kill(main, signum)  # the main thread: it wakes from its sleep
            return

    def begin(self) -> None:
        self._begun = True
        self._done.set()

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)


def _say(say: Callable[..., object], *args: object) -> None:
    # A closed terminal (EIO) or pipe must not cut the stop short.
    with contextlib.suppress(OSError):
        say(*args)


@contextlib.contextmanager
def _status(console: Console, text: str) -> Iterator[None]:
    """``console.status`` that a closed terminal does not break."""
    status = console.status(text)
    _say(status.start)
    try:
        yield
    finally:
        _say(status.stop)


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
    stop_with_parent: Annotated[
        bool,
        typer.Option(
            help="Stop the stack when the process that started prism dev exits, even if "
            "it is killed (make dev sets it).",
        ),
    ] = False,
) -> None:
    """Run the whole stack locally: Redis, the origin, the edge Worker (real local
    Workers runtime) with the KV REST stand-in, and the providers from the environment
    (OPENAI_API_KEY, ANTHROPIC_API_KEY or PRISM_PROVIDERS_FILE) or else a local demo provider.

    Dev secrets and a dev key are created when none are set. Ctrl-C, SIGTERM or SIGHUP
    (the terminal closing) stops everything; so does SIGKILL, on Linux.

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
    stopping = _Stopping()
    stopping.install(os.getppid() if stop_with_parent else None)
    try:
        with _status(console, "Starting the Prism stack…"):
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
        if info.regions:
            up = stack.regions_up()
            console.print(
                "regions: " + ", ".join(f"{region} {up[region]}" for region in info.regions)
            )
        console.print("[dim]Ctrl-C to stop.[/dim]")
        if as_json:
            typer.echo(json.dumps({**info.to_dict(), "regions_up": stack.regions_up()}))
        while True:
            # An origin that exits is restarted, one stopped is reported: the edge asks the
            # other region meanwhile. Any other part ending stops the stack.
            for line in stack.origins.check():
                _say(console.print, f"[yellow]{line}[/yellow]")
            dead = stack.fatal_component()
            if dead is not None:
                console.print(f"[red]{dead} stopped unexpectedly; logs in {state_dir}/logs/[/red]")
                raise typer.Exit(1)
            time.sleep(0.2)
    except StackError as error:
        _say(console.print, f"[red]Error:[/red] {error}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        pass
    finally:
        stopping.begin()
        with _status(console, "Stopping…"):
            stack.stop()
        _say(console.print, "Prism stack stopped.")
        stopping.restore()
