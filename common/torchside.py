"""The torch side of the commands that import no torch (``alloc.profile``): its functions are
found through the entry-point group ``transformer_alloc.measurers`` (``pyproject.toml``), so the
layering holds (docs/architecture.md) and a missing install is one clear line."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from common.errors import TransformerAllocError

MEASURERS = "transformer_alloc.measurers"


def load(name: str, error: type[TransformerAllocError], flag: str, hint: str = "") -> Any:
    """The function registered as ``name``; ``error`` (one line naming ``flag``) if missing."""
    found = entry_points(group=MEASURERS, name=name)
    if not found:
        raise error(f"{flag}: needs the torch workers (entry point {MEASURERS}:{name}); run "
                    f"'pip install -e .'{hint}")
    return next(iter(found)).load()
