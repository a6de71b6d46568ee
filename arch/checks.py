"""Validation helpers of the vocabulary: problems collected as ``path = value: rule`` lines,
and the serialised fields of a dataclass."""

from __future__ import annotations

import math
from dataclasses import MISSING, fields
from typing import Any

from common.errors import TransformerAllocError, excerpt


class ConfigError(TransformerAllocError):
    """An invalid architecture description; ``problems`` lists every rule broken."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


def need_int(problems: list[str], path: str, value: Any, minimum: int) -> None:
    if not is_int(value) or value < minimum:
        problems.append(f"{path} = {excerpt(value)}: must be an integer >= {minimum}")


def need_number(problems: list[str], path: str, value: Any, low: float,
                high: float = math.inf, strict: bool = False) -> None:
    """A finite number in ``[low, high]`` (``(low, high]`` when ``strict``)."""
    if not (is_number(value) and (value > low if strict else value >= low) and value <= high):
        rule = f"{'>' if strict else '>='} {low:g}" + ("" if high == math.inf
                                                       else f" and <= {high:g}")
        problems.append(f"{path} = {excerpt(value)}: must be a number {rule}")


def need_choice(problems: list[str], path: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        problems.append(f"{path} = {excerpt(value)}: must be one of {', '.join(choices)}")


def need_bool(problems: list[str], path: str, value: Any) -> None:
    if not isinstance(value, bool):
        problems.append(f"{path} = {excerpt(value)}: must be true or false")


def check_keys(data: Any, valid: tuple[str, ...], path: str) -> None:
    if not isinstance(data, dict):
        raise ConfigError([f"{path or 'arch'}: expected a mapping, got {type(data).__name__}"])
    unknown = sorted(set(map(str, data)) - set(valid))
    if unknown:
        raise ConfigError(
            [f"{path + '.' if path else ''}{k}: unknown key; valid keys: {', '.join(valid)}"
             for k in unknown]
        )


def field_names(cls: type) -> tuple[str, ...]:
    """The serialised fields of a vocabulary dataclass (derived ones, like ``arch_id``, are
    not constructor arguments and are left out)."""
    return tuple(f.name for f in fields(cls) if f.init)


def fields_to_dict(obj: Any) -> dict[str, Any]:
    """Every serialised field of ``obj``; tuples of nested dataclasses become lists of dicts."""
    data = {}
    for name in field_names(type(obj)):
        value = getattr(obj, name)
        data[name] = [v.to_dict() for v in value] if isinstance(value, tuple) else value
    return data


def field_values(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj) if f.init}


def field_defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in fields(cls) if f.init and f.default is not MISSING}
