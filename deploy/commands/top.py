"""`prism top`: a running origin's traffic, providers, spend and KV writer, live in the terminal."""

from __future__ import annotations

import contextlib
import json
import os
import select
import sys
import termios
import time
import tty
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from deploy.origin_metrics import Frame, frame_of, parse_health, parse_metrics, parse_spend
from origin.dashboard.figures import LAYERS, Totals

from ._options import JsonOption

__all__ = ["top_command"]

DEFAULT_ADMIN_URL = "http://127.0.0.1:9090"  # `prism origin serve`'s admin listener
_NONE = "-"  # a figure not known (yet)
_TWO_COLUMNS = 140  # terminal columns from which the tables sit side by side
_STATE_COLOURS = {"healthy": "green", "probing": "yellow", "demoted": "red"}


class ScrapeError(Exception):
    """The origin could not be read; the message says why, in one line."""


@dataclass(frozen=True, slots=True)
class _Target:
    url: str
    admin_key: str | None
    source: str  # where the URL came from, for the header


def _target(url: str | None, admin_key: str | None, state_dir: Path) -> _Target:
    """The admin listener to read: --url; else the `prism dev` stack in the state folder
    (with its own admin key, over $PRISM_ADMIN_KEY, which names a deployment's); else the
    default admin port on this machine."""
    if url is not None:
        return _Target(url.rstrip("/"), admin_key or os.environ.get("PRISM_ADMIN_KEY"), "--url")
    dev_file = state_dir / "dev.json"
    if dev_file.is_file():
        with contextlib.suppress(OSError, ValueError):
            local: dict[str, Any] = json.loads(dev_file.read_text())
            secrets: dict[str, Any] = {}
            with contextlib.suppress(OSError, ValueError):
                secrets = json.loads((state_dir / "dev-secrets.json").read_text())
            found = local.get("origin_admin_url")
            if isinstance(found, str):
                key = admin_key or secrets.get("PRISM_ADMIN_KEY") or None
                return _Target(found.rstrip("/"), key, f"prism dev ({state_dir})")
    return _Target(DEFAULT_ADMIN_URL, admin_key or os.environ.get("PRISM_ADMIN_KEY"), "default")


class _Scraper:
    """Reads the admin listener and keeps the last counters, for rates."""

    def __init__(self, target: _Target, client: httpx.Client) -> None:
        self.target = target
        self._client = client
        self._previous: Totals | None = None

    def _get(self, path: str) -> httpx.Response:
        try:
            return self._client.get(self.target.url + path)
        except httpx.HTTPError as error:
            raise ScrapeError(
                f"cannot reach {self.target.url}{path}: {type(error).__name__}"
            ) from None

    def scrape(self) -> Frame:
        metrics = self._get("/metrics")
        if metrics.status_code == 401:
            raise ScrapeError(f"{self.target.url}/metrics needs a key: give --admin-key")
        if metrics.status_code != 200:
            raise ScrapeError(f"{self.target.url}/metrics answered HTTP {metrics.status_code}")
        health = self._get("/healthz")
        try:
            totals = parse_metrics(metrics.text, time.time())
            report = parse_health(health.json())
        except ValueError as error:
            raise ScrapeError(str(error)) from None
        spend, notes = None, []
        if self.target.admin_key is None:
            notes.append("spend is this process's since it started (no admin key: --admin-key)")
        else:
            latest = self._get("/dashboard/latest")
            if latest.status_code == 200:
                spend = parse_spend(latest.json())
                if spend is None:
                    notes.append("spend today: not sampled yet, or Redis unreadable")
            elif latest.status_code == 401:
                notes.append("the admin key was refused; spend is this process's since start")
            else:
                notes.append("the dashboard is off (no PRISM_ADMIN_KEY at the origin)")
        frame = frame_of(self.target.url, self._previous, totals, report, spend, tuple(notes))
        self._previous = totals
        return frame


def _number(value: float | None, digits: int = 1) -> str:
    return _NONE if value is None else f"{value:,.{digits}f}"


def _percent(value: float | None) -> str:
    return _NONE if value is None else f"{100 * value:.1f} %"


def _usd(value: float | None) -> str:
    if value is None:
        return _NONE
    return f"${value:,.2f}" if value >= 1 or value == 0 else f"${value:.6f}"


def _uptime(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def render(frame: Frame, interval: float, live: bool, width: int = 160) -> RenderableType:
    """The frame as people read it: two columns on a wide terminal, one on a narrow one."""
    health, rates, totals = frame.health, frame.rates, frame.totals
    status_colour = "green" if health.status == "ok" else "yellow"
    head = Text.assemble(
        ("prism top ", "bold"),
        f"{frame.url} · release {health.version} · up {_uptime(health.uptime_seconds)} · ",
        (health.status, status_colour),
        f" · every {interval:g} s" + (" · q to quit" if live else ""),
    )

    layers = Table(
        title="Requests (this origin, and the edge's told to it)",
        title_justify="left",
        min_width=40,
    )
    layers.add_column("layer")
    layers.add_column("req/s", justify="right")
    layers.add_column("total", justify="right")
    for layer in LAYERS:
        per_second = None if rates is None else rates.requests.get(layer, 0.0)
        layers.add_row(layer, _number(per_second), f"{totals.requests.get(layer, 0):,.0f}")
    layers.add_row(
        "all",
        _number(None if rates is None else rates.total),
        f"{sum(totals.requests.values()):,.0f}",
        style="bold",
    )
    summary = Text(
        f"hit ratio {_percent(None if rates is None else rates.hit_ratio)} (last interval)\n"
        f"          {_percent(totals.hit_ratio)} (since start)\n"
        f"5xx/s     {_number(None if rates is None else rates.server_errors, 2)}\n"
        "kv: hits served by Workers KV at the\nedge, told to this origin after them.",
        style="",
    )

    providers = Table(title="Providers (health gates, last 30 s)", title_justify="left")
    for name in ("provider", "state", "calls/s", "calls", "errors", "p50 ms", "p95 ms", "reason"):
        providers.add_column(name, justify="left" if name in ("provider", "reason") else "right")
    for name, point in sorted(health.providers.items()):
        colour = _STATE_COLOURS.get(point.state, "white")
        providers.add_row(
            name,
            f"[{colour}]{point.state}[/{colour}]",
            _number(None if rates is None else rates.provider_calls.get(name, 0.0)),
            str(point.recent_calls),
            _percent(point.error_rate),
            _number(point.p50_ms),
            _number(point.p95_ms),
            point.reason or "",
        )

    scope = (
        "Spend today (UTC, every origin)"
        if frame.spend_scope == "today"
        else "Spend since this origin started"
    )
    spend = Table(title=scope, title_justify="left")
    for name in ("project", "spent", "saved", "hits", "calls"):
        spend.add_column(name, justify="left" if name == "project" else "right")
    for name, row in sorted(frame.spend.items(), key=lambda item: -item[1].cost_usd):
        spend.add_row(
            name,
            _usd(row.cost_usd),
            _usd(row.saved_usd),
            _NONE if row.hits is None else f"{row.hits:,}",
            _NONE if row.calls is None else f"{row.calls:,}",
        )
    if not frame.spend:
        spend.add_row("(none yet)", "", "", "", "")

    kv = Text(
        f"KV writer: {'on' if health.kv_enabled else 'off'} · queue {totals.kv_queued:,.0f} · "
        f"in flight {totals.kv_in_flight:,.0f} · sent {totals.kv_sent:,.0f} "
        f"({_number(None if rates is None else rates.kv_sent)}/s) · "
        f"dropped {totals.kv_dropped:,.0f}\n"
        f"Redis: " + ("ok" if health.redis_ok else "unreachable") + " · "
        f"event loop lag {totals.loop_lag * 1000:,.0f} ms"
        f" (refused while lagging: {totals.loop_lag_refused:,.0f})",
    )
    notes = [Text(note, style="dim") for note in frame.notes]
    if width < _TWO_COLUMNS:
        return Group(head, layers, summary, providers, spend, kv, *notes)
    body = Table.grid(padding=(0, 3))
    body.add_row(Group(layers, summary), Group(providers, spend, kv))
    return Group(head, body, *notes)


@contextlib.contextmanager
def _keys() -> Iterator[Any]:
    """Single key presses from the terminal (cbreak: no Enter needed, Ctrl-C still a
    signal), restored on the way out; a wait that returns early when ``q`` is pressed."""
    stdin = sys.stdin
    tty_in = stdin.isatty()
    saved = termios.tcgetattr(stdin) if tty_in else None
    if tty_in:
        tty.setcbreak(stdin.fileno())

    def wait(seconds: float) -> bool:
        """Wait up to ``seconds``; True when the user asked to quit."""
        if not tty_in:
            time.sleep(seconds)
            return False
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([stdin], [], [], left)
            if ready and os.read(stdin.fileno(), 1) in (b"q", b"Q"):
                return True
        return False

    try:
        yield wait
    finally:
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)


def top_command(
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            help="The origin's admin listener. [default: the prism dev stack's, from "
            "--state-dir; else http://127.0.0.1:9090]",
            show_default=False,
        ),
    ] = None,
    admin_key: Annotated[
        str | None,
        typer.Option(
            "--admin-key",
            help="The origin's PRISM_ADMIN_KEY, for spend today per project (every origin). "
            "[default: $PRISM_ADMIN_KEY, or the prism dev stack's]",
            show_default=False,
        ),
    ] = None,
    interval: Annotated[
        float, typer.Option("--interval", min=0.2, help="Seconds between refreshes.")
    ] = 2.0,
    once: Annotated[
        bool,
        typer.Option("--once", help="Print one frame (rates over one --interval) and exit."),
    ] = False,
    as_json: JsonOption = False,
    state_dir: Annotated[Path, typer.Option(help="The prism dev stack's state folder.")] = Path(
        ".prism"
    ),
) -> None:
    """Watch a running origin: requests a second by cache layer, hit ratio, provider
    health and latency, spend by project and the KV writer, refreshed in place.

    Reads the admin listener (/metrics, /healthz, and /dashboard/latest with the admin
    key); rates come from successive scrapes. q or Ctrl-C quits. --json prints one JSON
    frame (like --once) for scripts.

    Example: prism top --url http://127.0.0.1:9090 --interval 1
    """
    target = _target(url, admin_key, state_dir)
    console = Console()
    with httpx.Client(
        timeout=max(2.0, interval),
        headers={"authorization": f"Bearer {target.admin_key}"} if target.admin_key else {},
    ) as client:
        scraper = _Scraper(target, client)
        if once or as_json:
            try:
                scraper.scrape()
                time.sleep(interval)
                frame = scraper.scrape()
            except ScrapeError as error:
                typer.echo(f"Error: {error}", err=True)
                raise typer.Exit(1) from None
            if as_json:
                typer.echo(json.dumps(frame.as_dict()))
            else:
                console.print(render(frame, interval, live=False, width=console.width))
            return
        _watch(scraper, console, interval)


def _watch(scraper: _Scraper, console: Console, interval: float) -> None:
    live = Live(console=console, auto_refresh=False, transient=False)
    with contextlib.suppress(KeyboardInterrupt), _keys() as wait, live:
        while True:
            try:
                frame = scraper.scrape()
                view: RenderableType = render(frame, interval, live=True, width=console.width)
            except ScrapeError as error:
                view = Text.assemble(("prism top ", "bold"), (str(error), "red"), " · retrying")
            live.update(view, refresh=True)
            if wait(interval):
                break
