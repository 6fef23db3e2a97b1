"""The `prism bench semantic --pairs FILE` and `--scale N` runs, for the command."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from origin.settings import SemanticEngine

__all__ = ["other_runs"]


def other_runs(
    pairs: list[Path], scale: int | None, threshold: float, model: Path | None, out: Path,
    as_json: bool, engine: SemanticEngine = "auto",
) -> None:  # fmt: skip
    if scale is not None and not 100 <= scale <= 1_000_000:
        raise typer.BadParameter("--scale must be 100-1000000")
    stdout = Console() if Console().is_terminal else Console(width=140)
    result: dict[str, object] = {}
    try:
        if pairs:
            from .semantic import load
            from .semantic_pairs import plot, render_pairs, run_pairs

            loaded = load(engine, model)
            reports = [run_pairs(loaded, path, threshold) for path in pairs]
            out.mkdir(parents=True, exist_ok=True)
            png = plot(reports, threshold, out / "semantic-pairs.png")
            data = {
                "threshold": threshold,
                "engine": type(loaded).__name__,
                "png": str(png),
                "files": [r.to_dict() for r in reports],
            }
            (out / "semantic-pairs.json").write_text(json.dumps(data, indent=1))
            result["pairs"] = data
            if not as_json:
                stdout.print(render_pairs(reports, threshold))
                stdout.print("* without the lexical guard (cosine similarity alone)")
                stdout.print(f"wrote {out / 'semantic-pairs.json'} and {png}")
        if scale is not None:
            from .semantic_scale import render_scale, run_scale

            measured = run_scale(scale)
            result["scale"] = measured
            if not as_json:
                for line in render_scale(measured):
                    stdout.print(line)
    except (RuntimeError, OSError, ImportError, ValueError) as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(json.dumps(result))
