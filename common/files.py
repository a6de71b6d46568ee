"""Output files written whole or not at all: a crash never leaves a half-written result."""

from __future__ import annotations

import csv
import io
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write ``path`` through a temporary file and a rename."""
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


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """``rows`` as CSV (columns from the first row)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]) if rows else [])
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(path, buffer.getvalue())


def write_yaml(path: Path, data: Any) -> Path:
    """``data`` as YAML, keys in their given order."""
    write_atomic(path, yaml.safe_dump(data, sort_keys=False))
    return path
