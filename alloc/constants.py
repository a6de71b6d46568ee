"""The bound's fitted constants as a small YAML file (written by ``alloc.calibrate``, read by
``python -m alloc.solve --constants FILE``).

Only ``c_proj``, ``c_head``, ``order`` and ``width_order`` change the allocation; ``scale`` (loss
units per unit of bound) and ``fit`` (where the numbers come from, how well they fit) are kept for
the reader. A file without ``width_order`` (written before it existed) reads as ``m = 0``, the
bound it was fitted with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from alloc.errors import ConstantsError
from common.errors import Problem
from common.files import dump_yaml, read_yaml

FIELDS = ("c_proj", "c_head", "order")
OPTIONAL = ("width_order",)  # absent: 0, the bound before it (docs/theory.md §2.3)
METADATA = ("scale", "fit")


@dataclass(frozen=True)
class Constants:
    """``c_proj``, ``c_head`` > 0, the smoothness order ``n >= 1`` of docs/theory.md §2 and the
    width order ``m >= 0`` of §2.3."""

    c_proj: float = 1.0
    c_head: float = 1.0
    order: float = 2.0
    width_order: float = 0.0

    def as_flags(self) -> dict[str, float]:
        """The ``alloc.solve`` argument names (``order`` is ``--order``, ``width_order``
        ``--width-order``)."""
        return {"c_proj": self.c_proj, "c_head": self.c_head, "order": self.order,
                "width_order": self.width_order}


def to_yaml(constants: Constants, scale: float | None = None,
            fit: dict[str, Any] | None = None) -> str:
    data: dict[str, Any] = {k: float(v) for k, v in constants.as_flags().items()}
    if scale is not None:
        data["scale"] = float(scale)
    if fit:
        data["fit"] = fit
    return dump_yaml(data)


def read_constants(path: Path) -> Constants:
    """Load and check a constants file.

    Raises:
        ConstantsError: unreadable file, unknown key, missing key or a value out of range.
    """
    def bad(rule: str) -> ConstantsError:  # a problem of the file, the field ``constants``
        return ConstantsError.of([Problem("constants", repr(str(path)), rule)])

    try:
        data = read_yaml(path)
    except OSError as err:
        raise bad(f"cannot read ({err.strerror})") from None
    except yaml.YAMLError as err:
        raise bad(f"not YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise bad(f"expected a mapping with keys {', '.join(FIELDS)}")
    unknown = sorted(set(data) - set(FIELDS) - set(OPTIONAL) - set(METADATA))
    if unknown:
        raise bad(f"unknown key {unknown[0]!r}; valid: {', '.join(FIELDS + OPTIONAL + METADATA)}")
    values = {}
    for key in FIELDS + OPTIONAL:
        if key not in data:
            if key in OPTIONAL:
                continue
            raise bad(f"missing key {key!r}")
        value, (low, strict) = data[key], _RULES[key]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(
            value) and (value > low if strict else value >= low)
        if not ok:
            rule = f"{'>' if strict else '>='} {low:g}"
            raise bad(f"{key} = {value!r}: must be a finite number {rule}")
        values[key] = float(value)
    return Constants(**values)


# Per key: the lowest value and whether it is excluded.
_RULES = {"c_proj": (0.0, True), "c_head": (0.0, True), "order": (1.0, False),
          "width_order": (0.0, False)}
