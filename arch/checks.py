"""The project's one validation kit: problems collected as ``path = value: rule`` lines into a
list, so that everything wrong with an input is reported at once (``ArchConfig``,
``TrainConfig`` and the search-space loader use it); and the serialised fields of a vocabulary
dataclass.

Each ``*_rule`` says the rule a value breaks (None when it holds): the rules' one wording, for
these lines and for the ``common.errors.Problem`` records that ``PlanSettings`` collects. Each
``need_*`` appends a line when ``value`` breaks its rule and returns whether it holds, so a
caller can skip the checks that depend on it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any, TypeVar

from arch.errors import ConfigError
from common.errors import excerpt

T = TypeVar("T")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


def add(problems: list[str], path: str, value: Any, rule: str) -> None:
    """Record that ``value`` at ``path`` breaks ``rule``."""
    problems.append(f"{path} = {excerpt(value)}: {rule}")


def int_rule(value: Any, minimum: int, maximum: int | None = None) -> str | None:
    """The rule ``value`` breaks if it is not an integer ``>= minimum`` (``<= maximum``)."""
    if is_int(value) and value >= minimum and (maximum is None or value <= maximum):
        return None
    return (f"must be an integer >= {minimum}" if maximum is None else
            f"must be an integer between {minimum} and {maximum:,}")


def number_rule(value: Any, low: float, high: float = math.inf,
                strict: bool = False) -> str | None:
    """The rule ``value`` breaks if it is not a finite number in ``[low, high]`` (``(low,
    high]`` when ``strict``)."""
    if is_number(value) and (value > low if strict else value >= low) and value <= high:
        return None
    rule = f"{'>' if strict else '>='} {low:g}" + ("" if high == math.inf else f" and <= {high:g}")
    return f"must be a number {rule}"


def choice_rule(value: Any, choices: tuple[str, ...]) -> str | None:
    """The rule ``value`` breaks if it is not one of ``choices``."""
    return None if value in choices else f"must be one of {', '.join(choices)}"


def bool_rule(value: Any) -> str | None:
    """The rule ``value`` breaks if it is not a bool."""
    return None if isinstance(value, bool) else "must be true or false"


def _need(problems: list[str], path: str, value: Any, rule: str | None) -> bool:
    if rule is None:
        return True
    add(problems, path, value, rule)
    return False


def need_int(problems: list[str], path: str, value: Any, minimum: int,
             maximum: int | None = None) -> bool:
    """An integer ``>= minimum`` (and ``<= maximum``)."""
    return _need(problems, path, value, int_rule(value, minimum, maximum))


def need_number(problems: list[str], path: str, value: Any, low: float,
                high: float = math.inf, strict: bool = False) -> bool:
    """A finite number in ``[low, high]`` (``(low, high]`` when ``strict``)."""
    return _need(problems, path, value, number_rule(value, low, high, strict))


def need_choice(problems: list[str], path: str, value: Any, choices: tuple[str, ...]) -> bool:
    return _need(problems, path, value, choice_rule(value, choices))


def need_bool(problems: list[str], path: str, value: Any) -> bool:
    return _need(problems, path, value, bool_rule(value))


def need_keys(problems: list[str], data: Any, valid: tuple[str, ...], path: str) -> bool:
    """A mapping whose keys are all ``valid`` (each unknown key is one line listing them);
    False only when ``data`` is no mapping at all."""
    if not isinstance(data, dict):
        add(problems, path or "(top level)", data,
            f"must be a mapping with keys {', '.join(valid)}")
        return False
    for key in sorted(set(data) - set(valid), key=str):
        add(problems, f"{path + '.' if path else ''}{key}", data[key],
            f"unknown key; valid keys: {', '.join(valid)}")
    return True


def need_choices(problems: list[str], path: str, value: Any, check: Callable[[Any], bool],
                 rule: str) -> tuple[Any, ...]:
    """A value or a non-empty list of values each passing ``check``; returns them (empty when
    one fails)."""
    items = value if isinstance(value, list) else [value]
    if not items:
        add(problems, path, value, "must not be empty")
        return ()
    bad = [v for v in items if not check(v)]
    if bad:
        add(problems, path, bad[0] if len(bad) == 1 else bad, rule)
        return ()
    return tuple(items)


def parse_items(problems: list[str], items: Any, path: str,
                parse: Callable[[Any, str], T], rule: str) -> list[T]:
    """Each entry of the non-empty list ``items`` parsed by ``parse(entry, "path[i]")``; every
    entry's problems (a ``ConfigError``) collected, not only the first's."""
    if not isinstance(items, list) or not items:
        add(problems, path, items, rule)
        return []
    parsed = []
    for i, item in enumerate(items):
        try:
            parsed.append(parse(item, f"{path}[{i}]"))
        except ConfigError as err:
            problems.extend(err.problems)
    return parsed


def check_keys(data: Any, valid: tuple[str, ...], path: str) -> None:
    """Raise ``ConfigError`` unless ``data`` is a mapping of ``valid`` keys only."""
    problems: list[str] = []
    need_keys(problems, data, valid, path)
    if problems:
        raise ConfigError(problems)


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
