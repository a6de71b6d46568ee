"""Helpers shared by the project's ``python -m`` entry points (no torch, no Ray).

Every entry point reports bad input as one line on stderr naming the flag, the value and the rule,
and exits with code 2; results go to stdout as ``--format table|json|yaml``.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml

FORMATS = ("table", "json", "yaml")


class UsageError(Exception):
    """Bad input found after parsing; the message is the one line to print."""


class Parser(argparse.ArgumentParser):
    """``ArgumentParser`` whose errors are one line (no usage dump) with exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def fail(prog: str, message: str) -> int:
    """Print one error line for ``prog`` and return the bad-input exit code."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """argparse type: an integer in ``[low, high]``, with the rule in the error."""
    rule = f"an integer >= {low}" if high is None else f"an integer between {low} and {high}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: must be {rule}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text!r}: must be {rule}")
        return value

    return parse


def number(low: float, strict: bool = False) -> Callable[[str], float]:
    """argparse type: a finite number ``>= low`` (``> low`` if ``strict``)."""
    rule = f"a number {'>' if strict else '>='} {low:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: must be {rule}") from None
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"{text!r}: must be {rule}")
        return value

    return parse


def add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", "-f", choices=FORMATS, default="table",
                        help="output format (default: table)")


def check_writable(flag: str, path: Path) -> None:
    """Raise ``UsageError`` unless ``path`` can be created (its directory exists)."""
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{flag} {str(path)!r}: directory {str(parent)!r} does not exist")
    if path.is_dir():
        raise UsageError(f"{flag} {str(path)!r}: is a directory, expected a file path")


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write ``path`` through a temporary file and a rename: never a half-written file."""
    data = text.encode() if isinstance(text, str) else text
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".",
                               prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def new_figure(ncols: int, figsize: tuple[float, float]) -> tuple[Any, Any]:
    """``(fig, axes)``: one row of ``ncols`` axes on matplotlib's headless backend (imported
    here, only when something is plotted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=figsize, constrained_layout=True)


def write_figure(fig: Any, path: Path, dpi: int = 110) -> None:
    """Save a matplotlib figure to ``path`` as PNG, atomically, and release it."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    plt.close(fig)
    write_atomic(path, buffer.getvalue())


def dump(data: Any, fmt: str) -> str:
    """``data`` as JSON or YAML text."""
    if fmt == "json":
        return json.dumps(data, indent=2)
    return yaml.safe_dump(data, sort_keys=False)


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Any]],
                 right: Sequence[bool] | None = None) -> str:
    """A plain monospace table; numbers right-aligned unless ``right`` says otherwise."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    if right is None:
        right = [isinstance(c, (int, float)) for c in rows[0]] if rows else [False] * len(headers)
    lines = []
    for n, row in enumerate(cells):
        parts = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right)]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
