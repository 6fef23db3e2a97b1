"""`prism build`: generate deployable artefacts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from deploy.edge_bundle import BuildTarget, build_edge

from ._options import JsonOption

__all__ = ["app"]

app = typer.Typer(name="build", help="Generate deployable artefacts.", no_args_is_help=True)


@app.command("edge")
def edge(
    target: Annotated[
        str, typer.Option(help="'local' (the pinned local runtime) or 'cloudflare'.")
    ] = "cloudflare",
    out: Annotated[Path, typer.Option(help="Folder to stage the Worker project in.")] = Path(
        "build/edge"
    ),
    origin_url: Annotated[
        str | None, typer.Option(envvar="PRISM_ORIGIN_URL", help="ORIGIN_URL for the Worker.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Stage the edge Worker: only the edge/ and prism/ modules, the entry for the target
    runtime, build constants, and its own wrangler.toml (and, for cloudflare, a
    pyproject.toml with no dependencies for pywrangler).

    Example: prism build edge --target cloudflare --out build/edge
    """
    if target not in ("local", "cloudflare"):
        typer.echo("Error: --target must be 'local' or 'cloudflare'.", err=True)
        raise typer.Exit(2)
    if out.exists() and any(out.iterdir()) and not (out / "wrangler.toml").exists():
        typer.echo(
            f"Error: {out} is not empty and not a Prism build; refusing to replace it.", err=True
        )
        raise typer.Exit(2)
    chosen: BuildTarget = "local" if target == "local" else "cloudflare"
    bundle = build_edge(chosen, out, origin_url=origin_url)
    if as_json:
        typer.echo(json.dumps({"out": str(out), "target": target, "files": bundle.files}))
        return
    typer.echo(f"Staged the {target} edge Worker in {out} ({len(bundle.files)} files):")
    for name in bundle.files:
        typer.echo(f"  {name}")
