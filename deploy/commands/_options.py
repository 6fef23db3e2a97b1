"""Options shared by several commands."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["JsonOption"]

# Every command a script would read has the same switch.
JsonOption = Annotated[
    bool, typer.Option("--json", help="Print JSON (for scripts) instead of text for people.")
]
