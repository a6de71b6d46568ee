"""Headless matplotlib figures written as PNG; matplotlib is imported only when plotting."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from common.files import write_atomic


def new_figure(ncols: int, figsize: tuple[float, float], rows: int = 1) -> tuple[Any, Any]:
    """``(fig, axes)``: ``rows`` rows (default one) of ``ncols`` axes on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(rows, ncols, figsize=figsize, constrained_layout=True)


def write_figure(fig: Any, path: Path, dpi: int = 110) -> None:
    """Save a figure to ``path`` as PNG, atomically, and release it."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    plt.close(fig)
    write_atomic(path, buffer.getvalue())
