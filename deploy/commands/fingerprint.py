"""`prism fingerprint`: compute a request's cache fingerprint, to debug misses."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from prism import EXCLUDED_FIELDS, PrismError, canonical_document, fingerprint
from prism.parsers import PARSERS
from prism.request import DEFAULT_LIMITS
from prism.routes import CHAT_PATH as PATH

__all__ = ["fingerprint_command"]


def fingerprint_command(
    project: Annotated[str, typer.Option("--project", "-p", help="Project id (part of the key).")],
    source: Annotated[
        str, typer.Argument(help="A file with the request's JSON body, or '-' for stdin.")
    ] = "-",
    explain: Annotated[
        bool, typer.Option("--explain", help="Show the canonical document that was hashed.")
    ] = False,
    path: Annotated[
        str,
        typer.Option("--path", help="API path of the request (/v1/embeddings, /v1/messages…)."),
    ] = PATH,
) -> None:
    """Print the cache fingerprint of a request body (chat completions unless --path says).

    Two requests hit the same cache entry exactly when their fingerprints agree;
    `--explain` shows which fields went in (and which were left out).

    Example: prism fingerprint --project acme body.json --explain
    """
    try:
        raw = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    except OSError as error:
        typer.echo(f"Error: cannot read {source}: {error.strerror}", err=True)
        raise typer.Exit(2) from None
    parse = PARSERS.get(path)
    if parse is None:
        typer.echo(f"Error: no cached API at {path}; one of {', '.join(PARSERS)}", err=True)
        raise typer.Exit(2)
    try:
        request = parse(raw, DEFAULT_LIMITS)
    except PrismError as error:
        typer.echo(f"Error: {error.status} {error.message}", err=True)
        raise typer.Exit(1) from None
    digest = fingerprint(project, path, request)
    if not explain:
        typer.echo(digest)
        return
    document = canonical_document(project, path, request)
    left_out = sorted(k for k in request.body if k in EXCLUDED_FIELDS)
    typer.echo(f"fingerprint: {digest}")
    typer.echo(f"left out:    {', '.join(left_out) or '(nothing)'}")
    typer.echo("hashed:")
    typer.echo(json.dumps(document, sort_keys=True, indent=2, ensure_ascii=False))
