"""`prism origin`: run the origin service."""

from __future__ import annotations

import importlib.util
import logging
from typing import Annotated

import typer

from deploy.local.ports import port_is_free

__all__ = ["app"]

app = typer.Typer(name="origin", help="Run the origin service.", no_args_is_help=True)


@app.command("serve")
def serve(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "warning",
) -> None:
    """Serve the origin (OpenAI-compatible API, Redis cache, providers, KV writer).

    Configured from the environment: PRISM_KEY_SECRET, PRISM_FORWARD_SECRET, REDIS_URL,
    PRISM_PROVIDERS_FILE or OPENAI_API_KEY / OPENAI_BASE_URL / ANTHROPIC_API_KEY, and
    PRISM_KV_ACCOUNT_ID / PRISM_KV_NAMESPACE_ID / CLOUDFLARE_API_TOKEN / PRISM_KV_API_URL.

    Example: prism origin serve --port 8080
    """
    import uvicorn

    from origin import Settings, SettingsError, create_app

    try:
        settings = Settings.from_env()
    except SettingsError as error:
        typer.echo(f"Error: {error}", err=True)
        raise typer.Exit(2) from None
    if not port_is_free(host, port):
        typer.echo(f"Error: port {port} on {host} is in use; choose another with --port.", err=True)
        raise typer.Exit(1)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        http="httptools" if importlib.util.find_spec("httptools") else "h11",
        server_header=False,
        proxy_headers=False,  # the origin reads no client address: skip that middleware
    )
