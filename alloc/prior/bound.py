"""The allocator's bound as a prior over the points of a search space (docs/theory.md §11).

A search space is finite in everything the allocator speaks about (head counts, head dims,
``qk_dim``, MLP or not, finite training choices); ``candidates`` enumerates those points (or, past
``MAX_CANDIDATES``, draws that many at random), leaving the numeric training ranges (a learning
rate range) to be sampled apart. A ``Prior`` is a normalised distribution over the candidates,
built from an *energy* per candidate:

* ``allocator_prior``: the energy is the allocator's bound summed over the layers
  (``alloc.plan.layer_bound``: the log early-layer bound of the extraction layers, the saturation
  rule's error of the later layers' ``qk_dim``); fields the bound does not model (MLP, attention
  kind, training choices) get equal mass;
* ``centred_prior``: the energy is the distance to one point (the graded priors of the
  benchmark: centred on a good, a median or a bad point).

Energies are scaled to [0, 1] over the candidates and ``log p = -energy / temperature`` (then
normalised): the temperature is the prior's spread, ``exp(1 / temperature)`` the odds of its best
over its worst candidate, whatever the bound's units.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from alloc.plan import layer_bound
from alloc.settings import PlanSettings
from arch import ArchConfig, LayerSpec, param_count
from search_spaces import PROBE_IO, FixedSuggester, RandomSuggester, SearchSpace, SpaceError

MAX_CANDIDATES = 2_000  # the pairwise distances are a MAX^2 matrix (32 MB of float64)
DEFAULT_TEMPERATURE = 0.2  # best:worst odds e^5 ~ 150


def point_key(params: Mapping[str, Any], free: frozenset[str] = frozenset()) -> str:
    """A point's identity: its params but the ``free`` ones, as canonical JSON."""
    return json.dumps({k: v for k, v in params.items() if k not in free}, sort_keys=True,
                      default=str)


@dataclass(frozen=True)
class Candidates:
    """The points of a space the prior ranks, their architectures and pairwise distances."""

    params: tuple[Mapping[str, Any], ...]
    archs: tuple[ArchConfig, ...]
    free: frozenset[str]  # params sampled apart (numeric training ranges)
    exhaustive: bool  # every point of the space (False: a random subset of a larger space)
    distance: np.ndarray  # (n, n): summed per-param distances, each in [0, 1]
    chance: np.ndarray  # (n,): random search's probability of each point (sums to 1)

    def __len__(self) -> int:
        return len(self.params)

    def index(self) -> dict[str, int]:
        """Candidate index by ``point_key``."""
        return {point_key(p): i for i, p in enumerate(self.params)}


def candidates(space: SearchSpace, limit: int = MAX_CANDIDATES, seed: int = 0,
               include: Sequence[Mapping[str, Any]] = ()) -> Candidates:
    """Every point of ``space`` (its numeric training ranges aside), or ``limit`` distinct random
    points and the ``include`` ones (e.g. the allocator's plan) when it has more. Each point's
    ``chance`` is random search's probability of it: from the grid's decisions when every point
    is listed; equal over a random subset (itself random search's sample)."""
    free = space.ranges
    try:
        listed = space.grid_chances(limit=limit, free=free)
        points, exhaustive = [p for p, _ in listed], True
        chance = np.array([c for _, c in listed])
    except SpaceError:  # too many points (the only SpaceError of a loaded space's grid)
        points, exhaustive = _random_points(space, limit, free, seed), False
        known = {point_key(p) for p in points}
        points += [dict(p) for p in include if point_key(p, free) not in known]
        points = [{k: v for k, v in p.items() if k not in free} for p in points]
        chance = np.full(len(points), 1 / len(points))
    archs = tuple(space.sample(FixedSuggester(p), PROBE_IO)[0] for p in points)
    return Candidates(tuple(points), archs, free, exhaustive, pairwise_distance(points),
                      chance / chance.sum())


def _random_points(space: SearchSpace, limit: int, free: frozenset[str],
                   seed: int) -> list[dict[str, Any]]:
    rng, found = random.Random(seed), dict[str, dict[str, Any]]()
    for _ in range(limit * 20):  # a space this large rarely repeats a point
        suggester = RandomSuggester(rng.randrange(2**63))
        space.sample(suggester, PROBE_IO)
        params = {k: v for k, v in suggester.params.items() if k not in free}
        found.setdefault(point_key(params), params)
        if len(found) == limit:
            break
    return list(found.values())


def pairwise_distance(points: Sequence[Mapping[str, Any]]) -> np.ndarray:
    """Distance between points: per param, the gap in its sorted choices over the number of
    gaps for numbers (1 head vs 2 heads is closer than 1 vs 64), 0 or 1 for other values, and 1
    where only one of the two points has the param; summed over params."""
    # (n, n) work per param, in place: a search's pool is 2,000 points (4 M pairs), and the
    # masks are skipped for a param every point has
    n = len(points)
    total = np.zeros((n, n))
    for name in sorted({k for p in points for k in p}):
        values = [p.get(name) for p in points]
        present = np.array([v is not None for v in values])
        everywhere = bool(present.all())
        choices = sorted({v for v in values if v is not None}, key=_order)
        if len(choices) > 1:
            numeric = all(isinstance(c, int | float) and not isinstance(c, bool)
                          for c in choices)
            position = {c: i / (len(choices) - 1) for i, c in enumerate(choices)}
            x = np.array([position[v] if v is not None else 0.0 for v in values])
            if numeric:
                gap = np.subtract.outer(x, x)
                np.abs(gap, out=gap)
            else:
                gap = np.not_equal.outer(x, x).astype(float)
            if not everywhere:
                gap *= np.logical_and.outer(present, present)
            total += gap
        if not everywhere:
            total += np.not_equal.outer(present, present)
    return total


def _order(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, int | float) else (1, str(value))


@dataclass(frozen=True)
class Prior:
    """A distribution over ``candidates``: ``log_prob`` normalised, built from ``energy``."""

    label: str
    candidates: Candidates
    energy: np.ndarray  # lower is better; scaled to [0, 1]
    temperature: float
    anchor: tuple[int, ...] = ()  # the candidates closest to the allocator's own plan

    @cached_property  # read several times per proposal; the prior never changes
    def log_prob(self) -> np.ndarray:
        logits = -self.energy / self.temperature
        return logits - _logsumexp(logits)

    def mode(self, among: np.ndarray, rng: np.random.Generator) -> int:
        """The most probable candidate of ``among`` (indices). Of equals (the bound is silent
        on MLPs, attention kinds, training choices and on every ``qk_dim`` within the
        tolerance), the closest to the ``anchor`` (the allocator's plan: what it chose for
        those), then the one with the fewest parameters, then at random."""
        values = self.energy[among]
        best = among[np.flatnonzero(values <= values.min() + 1e-12)]
        if self.anchor:  # the plan's fields where the bound is silent
            near = self.candidates.distance[np.ix_(np.array(self.anchor), best)].min(axis=0)
            best = best[near <= near.min() + 1e-12]
        sizes = np.array([param_count(self.candidates.archs[i]).total for i in best])
        return int(rng.choice(best[sizes == sizes.min()]))

    def describe(self) -> dict[str, Any]:
        """What the study records of the prior."""
        top = self.mode(np.arange(len(self.energy)), np.random.default_rng(0))
        return {"prior": self.label, "temperature": self.temperature,
                "candidates": len(self.candidates), "exhaustive": self.candidates.exhaustive,
                "mode": self.candidates.archs[top].describe()}


def _logsumexp(x: np.ndarray) -> float:
    top = float(x.max())
    return top + math.log(float(np.exp(x - top).sum()))


def from_energy(label: str, cands: Candidates, raw: np.ndarray, temperature: float,
                anchor: tuple[int, ...] = ()) -> Prior:
    """The prior ``p ~ exp(-scaled energy / temperature)``; equal energies give equal mass."""
    if not temperature > 0:
        raise ValueError(f"temperature {temperature}: must be > 0")
    spread = float(raw.max() - raw.min())
    scaled = (raw - raw.min()) / spread if spread > 0 else np.zeros_like(raw)
    return Prior(label, cands, scaled, temperature, anchor)


def allocator_energy(cands: Candidates, settings: PlanSettings) -> np.ndarray:
    """The allocator's bound of each candidate, summed over its layers (a layer bound is
    computed once per distinct layer: candidates share most of them)."""
    cache: dict[tuple[int, LayerSpec], float] = {}

    def bound(i: int, layer: LayerSpec) -> float:
        key = (i, layer)
        if key not in cache:
            cache[key] = layer_bound(settings, i, layer)
        return cache[key]

    return np.array([sum(bound(i, layer) for i, layer in enumerate(arch.layers))
                     for arch in cands.archs])


def allocator_prior(cands: Candidates, settings: PlanSettings,
                    temperature: float = DEFAULT_TEMPERATURE, label: str = "allocator",
                    plan: Mapping[str, Any] | None = None) -> Prior:
    """The allocator's bound (with ``settings``' inputs and constants) as a prior; ``plan``:
    the allocator's own answer as params of the space, which breaks the bound's ties."""
    return from_energy(label, cands, allocator_energy(cands, settings), temperature,
                       () if plan is None else nearest(cands, plan))


def nearest(cands: Candidates, params: Mapping[str, Any]) -> tuple[int, ...]:
    """The candidates that agree with most of ``params`` (a plan names no training choice:
    every learning rate of the space agrees with it equally)."""
    misses = np.array([sum(p.get(k) != v for k, v in params.items() if k not in cands.free)
                       for p in cands.params])
    return tuple(int(i) for i in np.flatnonzero(misses == misses.min()))


def centred_prior(cands: Candidates, centre: int, temperature: float = DEFAULT_TEMPERATURE,
                  label: str = "centred") -> Prior:
    """A prior centred on candidate ``centre``: its energy is the distance to it."""
    return from_energy(label, cands, cands.distance[centre].copy(), temperature)
