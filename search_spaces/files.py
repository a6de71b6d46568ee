"""Search-space files: a path, or a space shipped in ``search_spaces/``, read once
(``SpaceFile``); the space, the data it names and its shape come from what was read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from arch.checks import is_int, is_number
from common.files import read_yaml
from search_spaces.errors import SpaceError
from search_spaces.loader import parse_data, parse_space, raise_if_any
from search_spaces.placeholders import uses_allocator
from search_spaces.schema import SPACES_DIR, TOP_KEYS, Planner, layer_indices
from search_spaces.space import SearchSpace
from userdata import DataSpec


def resolve_path(name: str | Path) -> Path:
    """A path as given, else a space shipped in ``search_spaces/`` (``.yaml`` optional)."""
    path = Path(name)
    if path.exists():
        return path
    for candidate in (SPACES_DIR / path.name, SPACES_DIR / f"{path.name}.yaml"):
        if candidate.exists():
            return candidate
    shipped = ", ".join(p.name for p in shipped_spaces())
    raise SpaceError(f"search space {str(name)!r}: no such file here or in search_spaces/ "
                     f"(shipped: {shipped})")


def shipped_spaces() -> list[Path]:
    return sorted(SPACES_DIR.glob("*.yaml"))


@dataclass(frozen=True)
class SpaceFile:
    """A space file read once: its YAML mapping and where it was found. The space, the data it
    names and its shape are derived from the mapping, never by reading the file again."""

    data: Mapping[str, Any]
    source: str  # the path it was read from

    @classmethod
    def read(cls, name: str | Path) -> SpaceFile:
        """Read a space file (a path, or a space shipped in ``search_spaces/``)."""
        path = resolve_path(name)
        try:
            data = read_yaml(path)
        except (OSError, yaml.YAMLError) as err:
            raise SpaceError(f"{path}: cannot read YAML ({str(err).splitlines()[0]})") from None
        if not isinstance(data, dict):
            raise SpaceError(f"{path}: must be a mapping with keys {', '.join(TOP_KEYS)}")
        return cls(data, str(path))

    def load(self, budget: int | None = None, planner: Planner | None = None) -> SearchSpace:
        """The validated space (``budget`` overrides the file's; ``planner`` resolves
        ``allocator`` placeholders)."""
        data = dict(self.data) if budget is None else {**self.data, "budget": budget}
        return parse_space(data, self.source, planner)

    def data_source(self) -> DataSpec | None:
        """The file's ``data:`` (what it searches when no task is given)."""
        problems: list[str] = []
        spec = parse_data(problems, self.data.get("data"), self.source)
        raise_if_any(problems, self.source)
        return spec

    def shape(self, budget: int | None = None) -> tuple[int, int, float] | None:
        """``(budget, depth, largest MLP ratio)``, known before the space is loaded (the data's
        pilot profile needs them first); None where a field is not plain (the space's own
        checks report it when it is loaded)."""
        width: Any = budget or self.data.get("budget")
        depth: Any = self.data.get("depth")
        rules = self.data.get("layers")
        ratios = [r.get("mlp_ratio", 0) for r in rules if isinstance(r, dict)] \
            if isinstance(rules, list) else []
        flat = [v for r in ratios for v in (r if isinstance(r, list) else [r])]
        if not (is_int(width) and is_int(depth) and all(is_number(v) for v in flat)):
            return None
        return int(width), int(depth), float(max(flat, default=0))

    def uses_allocator(self) -> bool:
        """Whether the file's rules take values from the allocator's plan (``allocator``)."""
        return uses_allocator(self.data)

    def plan_mlp_ratio(self) -> float | None:
        """The largest MLP ratio layer 0's rule allows: the MLP the allocator's plan for the
        space is made for, known before the space is loaded (its ``allocator`` placeholders
        take that plan); None where the rules are not plain (the space's own checks report it
        when it is loaded)."""
        depth, rules = self.data.get("depth"), self.data.get("layers")
        if not isinstance(depth, int) or not is_int(depth) or not isinstance(rules, list):
            return None
        for rule in rules:
            if isinstance(rule, dict) and 0 in layer_indices([], "layers",
                                                             rule.get("layers", "all"), depth):
                ratios = rule.get("mlp_ratio", [0])  # the loader's default
                values = ratios if isinstance(ratios, list) else [ratios]
                if not values or not all(is_number(v) for v in values):
                    return None
                return float(max(values))
        return None


def load_space(name: str | Path, budget: int | None = None,
               planner: Planner | None = None) -> SearchSpace:
    """Read and validate a space file (``budget`` overrides the file's; ``planner`` resolves
    ``allocator`` placeholders)."""
    return SpaceFile.read(name).load(budget, planner)
