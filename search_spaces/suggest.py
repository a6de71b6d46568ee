"""What sampling asks of a trial: the ``Suggester`` protocol (Optuna's ``Trial`` satisfies it)
and the suggesters that sample without Optuna: uniformly at random, from given params, or along
a path of choices (the odometer that lists a finite space's grid)."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any, Protocol

from search_spaces.errors import SpaceError


class Suggester(Protocol):
    """What sampling needs from a trial (Optuna's ``Trial`` satisfies it)."""

    def suggest_categorical(self, name: str, choices: Any) -> Any: ...

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1,
                    log: bool = False) -> int: ...

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float: ...


class RandomSuggester:
    """Uniform random choices (tests, and sampling without Optuna)."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.params: dict[str, Any] = {}

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        return self.params.setdefault(name, self.rng.choice(list(choices)))

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1,
                    log: bool = False) -> int:
        return self.params.setdefault(name, low + step * self.rng.randint(0, (high - low) // step))

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float:
        if log:
            value = math.exp(self.rng.uniform(math.log(low), math.log(high)))
        else:
            value = self.rng.uniform(low, high)
        return self.params.setdefault(name, value)


class FixedSuggester(RandomSuggester):
    """Returns the given params (what an enqueued Optuna trial does); random for the rest."""

    def __init__(self, params: Mapping[str, Any], seed: int = 0) -> None:
        super().__init__(seed)
        self.params = dict(params)


class PathSuggester(RandomSuggester):
    """Takes the ``path[k]``-th choice at the k-th decision (0 past the path's end), recording
    each decision's number of options: an odometer over a finite space."""

    def __init__(self, path: list[int], source: str, free: frozenset[str] = frozenset()
                 ) -> None:
        super().__init__()
        self.path, self.source, self.free = path, source, free
        self.decisions: list[tuple[int, int]] = []

    def _pick(self, name: str, options: list[Any]) -> Any:
        k = len(self.decisions)
        index = self.path[k] if k < len(self.path) else 0
        self.decisions.append((index, len(options)))
        return self.params.setdefault(name, options[index])

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        return self._pick(name, list(choices))

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1,
                    log: bool = False) -> int:
        if name in self.free:  # not a coordinate of the grid: not recorded
            return low
        return self._pick(name, list(range(low, high + 1, step)))

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float:
        if name in self.free:
            return low
        if low != high:
            raise SpaceError(f"{self.source}: sampler 'grid' needs finite choices; {name} is a "
                             f"range {low:g}..{high:g} (give a list)")
        return self._pick(name, [low])


def next_path(decisions: list[tuple[int, int]]) -> list[int] | None:
    """The odometer's next path after ``decisions`` ((choice, options) per decision), or None
    when every path was taken."""
    decisions = list(decisions)
    while decisions and decisions[-1][0] + 1 >= decisions[-1][1]:
        decisions.pop()
    if not decisions:
        return None
    return [d[0] for d in decisions[:-1]] + [decisions[-1][0] + 1]
