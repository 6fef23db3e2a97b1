"""matplotlib for the benches' PNGs: an optional extra (``bench``), drawn to files only."""

from __future__ import annotations

from typing import Any

__all__ = ["NO_MATPLOTLIB", "pyplot"]

NO_MATPLOTLIB = "matplotlib is not installed (pip install 'prism-edge-gateway[bench]')"


def pyplot() -> Any | None:
    """``matplotlib.pyplot`` on its file-only backend, or None when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")  # no display here, and none needed
    import matplotlib.pyplot as plt

    return plt
