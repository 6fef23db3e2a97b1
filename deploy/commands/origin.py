"""`prism origin`: run the origin service."""

from __future__ import annotations

import logging
import os
from typing import Annotated

import typer

__all__ = ["app"]

app = typer.Typer(name="origin", help="Run the origin service.", no_args_is_help=True)


@app.command("serve")
def serve(
    host: Annotated[str, typer.Option(help="Interface of the public listener.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the public listener.")] = 8080,
    admin_host: Annotated[
        str,
        typer.Option(envvar="PRISM_ADMIN_HOST", help="Interface of the admin listener."),
    ] = "127.0.0.1",
    admin_port: Annotated[
        int,
        typer.Option(
            envvar="PRISM_ADMIN_PORT",
            help="Port of the admin listener: /healthz in detail and /metrics, never public.",
        ),
    ] = 9090,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "warning",
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            envvar="PRISM_WORKERS",
            help="Worker processes on the one public port (default: the cores this process"
            " may use). 1: a single process, no supervisor.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve the origin (OpenAI-compatible API, Redis cache, providers, KV writer).

    The API and a bare /healthz are on --host/--port; /healthz with every detail and
    /metrics only on --admin-host/--admin-port (loopback unless told otherwise).
    Configured from the environment: PRISM_KEY_SECRET, PRISM_FORWARD_SECRET, REDIS_URL,
    PRISM_PROVIDERS_FILE or OPENAI_API_KEY / OPENAI_BASE_URL / ANTHROPIC_API_KEY, and
    PRISM_KV_ACCOUNT_ID / PRISM_KV_NAMESPACE_ID / CLOUDFLARE_API_TOKEN / PRISM_KV_API_URL.

    With --workers N above 1, a supervisor binds both listeners, starts N workers on the
    public one (each its own app, event loop and Redis connection), restarts any that
    dies, replaces them one by one on SIGHUP and stops them gracefully on SIGTERM; the
    admin listener then shows the whole instance (every worker's /metrics merged).

    Example: prism origin serve --port 8080 --admin-port 9090 --workers 4
    """
    from origin import Settings, SettingsError
    from origin.http.server import listen
    from origin.http.watchdog import SystemdWatchdog

    try:
        settings = Settings.from_env()
    except SettingsError as error:
        typer.echo(f"Error: {error}", err=True)
        raise typer.Exit(2) from None
    try:
        sockets = listen(host, port, admin_host, admin_port)
    except OSError as error:
        typer.echo(f"Error: {error}; choose another with --port / --admin-port.", err=True)
        raise typer.Exit(1) from None
    # Under systemd with WatchdogSec= (the deployed unit): fed from the event loop.
    watchdog = SystemdWatchdog.from_env(os.environ)
    count = workers if workers is not None else len(os.sched_getaffinity(0))
    if count > 1:
        from origin.instance import WorkerOptions, serve_workers

        logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
        if not serve_workers(count, sockets[0], sockets[1], WorkerOptions(log_level), watchdog):
            raise typer.Exit(3)  # a worker failed to start (its error is above)
        return
    import uvicorn

    from origin import create_app
    from origin.http.server import freeze_heap, uvicorn_config

    try:
        app = create_app(
            settings,
            admin_port=sockets[1].getsockname()[1],
            on_loop_tick=watchdog.ping if watchdog is not None else None,
        )
    except SettingsError as error:  # e.g. telemetry asked for, its extra not installed
        for sock in sockets:
            sock.close()
        typer.echo(f"Error: {error}", err=True)
        raise typer.Exit(2) from None
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    if settings.access_log:
        from origin.http.access_log import print_access_log

        print_access_log()
    config = uvicorn_config(app, settings, log_level)  # loaded: its modules are frozen too
    freeze_heap()
    uvicorn.Server(config).run(sockets=sockets)
