"""Search spaces: which per-layer configurations a search samples, and how (docs/theory.md §5).

A ``SearchSpace`` (read from YAML by ``search_spaces.loader``) fixes the width budget ``D`` (the
model's ``d_model`` and every layer's attention-width cap), the depth, the global ``ArchConfig``
fields, one ``LayerRule`` per layer range and the training hyper-parameters.

Sampling is define-by-run against anything with Optuna's ``suggest_categorical`` /
``suggest_int`` / ``suggest_float`` (an Optuna trial, or ``RandomSuggester`` here), and every
sampled point is a valid ``ArchConfig`` by construction: derived values are one-point integer
ranges, and the loader rejects rules whose choices could break the budget. Param names come
from ``arch.codec`` (``L0.attention``, ``L0.g1.count``, ``L1-3.attention`` for a shared
rule) plus ``train.<key>``; ``encode`` is the inverse of sampling, so any architecture of the
space can be enqueued.

A layer rule samples one head group (a head count from ``heads``, its dimension derived as
``budget / count`` or from ``head_dim``) or, with ``groups: {max: G}``, up to G groups whose
widths fill the layer's budget exactly: the group dims come from ``head_dim``, every count but
the last is sampled (in steps that keep the rest divisible) and the last one fills the budget.

With ``kv_heads`` (grouped-query attention) each group also samples its number of key/value
heads, ``L{i}.g{j}.kv_heads``, from the rule's list. Optuna needs a categorical param's choices
fixed, so every choice divides every count the rule can sample: the loader checks that a
one-group rule's head counts are multiples of each choice, and a several-group rule samples its
counts in multiples of their least common multiple. Without the key every query head has its
own key/value head and nothing more is sampled or recorded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from arch import TrainConfig, codec
from arch.config import (
    SINGLE_WIDTH_KINDS,
    ArchConfig,
    AttentionKind,
    HeadGroup,
    LayerSpec,
    ModelIO,
    Role,
    merge_groups,
)
from common.errors import TransformerAllocError
from userdata import DataSpec

# Input/output of no task: enumerating a grid and validating a rule's choices need an
# ArchConfig, and the layers' validity does not depend on the task.
PROBE_IO = ModelIO(max_seq_len=1, vocab_size=1)


class SpaceError(TransformerAllocError):
    """An invalid search space, or an architecture outside one; the message names the file,
    the key and the rule."""


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


@dataclass(frozen=True)
class QkRule:
    """How a group's ``qk_dim`` is chosen: equal to ``v_dim``, or reduced on a grid below it."""

    reduced: bool = False
    low: int = 8
    step: int = 8

    def range(self, kind: str, v_dim: int) -> tuple[int, int, int]:
        """``(low, high, step)`` of the integer param; one point when the kind has one width."""
        if not self.reduced or kind in SINGLE_WIDTH_KINDS or v_dim <= self.low:
            return v_dim, v_dim, 1
        return self.low, self.low + (v_dim - self.low) // self.step * self.step, self.step

    def allows(self, kind: str, v_dim: int, qk_dim: int) -> bool:
        low, high, step = self.range(kind, v_dim)
        return low <= qk_dim <= high and (qk_dim - low) % step == 0


@dataclass(frozen=True)
class LayerRule:
    """The allowed configurations of the layers ``indices``."""

    indices: tuple[int, ...]
    attention: tuple[AttentionKind, ...]
    mlp_ratio: tuple[float, ...]
    heads: tuple[int, ...]  # head counts of a one-group rule
    head_dim: tuple[int, ...] | None  # None: derived as budget // count (one-group rules)
    qk: QkRule
    budget: int
    role: Role = "process"
    eta: float = 1.0
    freeze_mlp: bool = False
    shared: bool = False  # every layer of the rule takes one sampled configuration
    max_groups: int = 1  # > 1: up to this many head groups filling ``budget`` exactly
    kv_heads: tuple[int, ...] | None = None  # key/value heads per group; None: one per query head

    @property
    def kv_unit(self) -> int:
        """What every sampled head count is a multiple of: the least common multiple of the
        ``kv_heads`` choices (so that each divides it), 1 without them."""
        return math.lcm(*self.kv_heads) if self.kv_heads else 1

    def names(self, i: int) -> tuple[int, ...]:
        """The layers a param of layer ``i`` is named for (all of a shared rule's layers)."""
        return self.indices if self.shared else (i,)

    def v_dims(self, count: int) -> tuple[int, ...]:
        return (self.budget // count,) if self.head_dim is None else self.head_dim

    def sample(self, layers: tuple[int, ...], trial: Suggester) -> LayerSpec:
        """One layer configuration, its params named for ``layers``."""
        kind = trial.suggest_categorical(codec.layer_key(layers, "attention"), self.attention)
        mlp_ratio = trial.suggest_categorical(codec.layer_key(layers, "mlp_ratio"),
                                              self.mlp_ratio)
        widths = (self._sample_groups(layers, trial) if self.max_groups > 1
                  else [self._sample_one_group(layers, trial)])
        heads = []
        for j, (count, v_dim) in enumerate(widths):
            low, high, step = self.qk.range(kind, v_dim)
            qk_dim = trial.suggest_int(codec.group_key(layers, j, "qk_dim"), low, high, step=step)
            kv = 0 if self.kv_heads is None else trial.suggest_categorical(
                codec.group_key(layers, j, "kv_heads"), self.kv_heads)
            heads.append(HeadGroup(count, qk_dim, v_dim, kv))
        fixed = self.fixed_fields(mlp_ratio)
        for name, value in fixed.items():  # recorded, so the params decode to this layer
            if value != codec.DEFAULTS[name]:
                trial.suggest_categorical(codec.layer_key(layers, name), (value,))
        return LayerSpec(kind, tuple(heads), mlp_ratio=float(mlp_ratio), **fixed)

    def fixed_fields(self, mlp_ratio: float) -> dict[str, Any]:
        """The layer fields the rule fixes rather than samples."""
        return {"role": self.role, "eta": self.eta,
                "freeze_mlp": self.freeze_mlp and mlp_ratio > 0}

    def _sample_one_group(self, layers: tuple[int, ...], trial: Suggester) -> tuple[int, int]:
        count = trial.suggest_categorical(codec.group_key(layers, 0, "count"), self.heads)
        if self.head_dim is None:  # derived: a one-point range keeps the value in the study
            v = self.budget // count
            return count, trial.suggest_int(codec.group_key(layers, 0, "v_dim"), v, v)
        return count, trial.suggest_categorical(codec.group_key(layers, 0, "v_dim"),
                                                self.head_dim)

    def _sample_groups(self, layers: tuple[int, ...], trial: Suggester) -> list[tuple[int, int]]:
        """Up to ``max_groups`` (count, v_dim) filling ``budget``: the last count is derived,
        and each earlier count steps by ``unit * last / gcd(dim, last)`` so the rest stays
        divisible by the last dim times ``unit`` (``kv_unit``: every count is a multiple of it);
        the loader checks the minimal widths always fit."""
        assert self.head_dim is not None
        n = trial.suggest_int(codec.layer_key(layers, codec.GROUP_COUNT), 1, self.max_groups)
        dims = [trial.suggest_categorical(codec.group_key(layers, j, "v_dim"), self.head_dim)
                for j in range(n)]
        last, unit = dims[-1], self.kv_unit
        steps = [unit * last // math.gcd(d, last) for d in dims[:-1]]
        used, out = 0, []
        for j, (dim, step) in enumerate(zip(dims, steps)):
            reserve = sum(s * d for s, d in zip(steps[j + 1:], dims[j + 1:-1])) + unit * last
            high = (self.budget - used - reserve) // dim
            count = trial.suggest_int(codec.group_key(layers, j, "count"), step,
                                      high - high % step, step=step)
            used += count * dim
            out.append((count, dim))
        rest = (self.budget - used) // last
        out.append((trial.suggest_int(codec.group_key(layers, n - 1, "count"), rest, rest),
                    last))
        return out

    def problems(self, layer: LayerSpec, where: str) -> list[str]:
        """Why ``layer`` is not a configuration of this rule (empty: it is)."""
        problems = [f"{where}.{name} = {value!r}: allowed {list(allowed)}" for value, allowed, name
                    in ((layer.attention, self.attention, "attention"),
                        (layer.mlp_ratio, self.mlp_ratio, "mlp_ratio")) if value not in allowed]
        problems += [f"{where}.{k} = {getattr(layer, k)!r}: the space fixes {v!r}"
                     for k, v in self.fixed_fields(layer.mlp_ratio).items()
                     if getattr(layer, k) != v]
        if layer.tied_output:
            problems.append(f"{where}.tied_output = True: the space samples untied outputs")
        problems += (self._groups_problems(layer, where) if self.max_groups > 1
                     else self._one_group_problems(layer, where))
        for j, g in enumerate(layer.heads):
            if not self.qk.allows(layer.attention, g.v_dim, g.qk_dim):
                low, high, step = self.qk.range(layer.attention, g.v_dim)
                problems.append(f"{where}.heads[{j}].qk_dim = {g.qk_dim}: allowed "
                                f"{low}..{high} step {step}")
            if self.kv_heads is None and g.grouped:
                problems.append(f"{where}.heads[{j}].kv_heads = {g.kv_heads}: the space gives "
                                "every query head its own key/value head (no kv_heads key)")
            elif self.kv_heads is not None and g.kv_heads not in self.kv_heads:
                problems.append(f"{where}.heads[{j}].kv_heads = {g.kv_heads}: allowed "
                                f"{list(self.kv_heads)}")
        return problems

    def _one_group_problems(self, layer: LayerSpec, where: str) -> list[str]:
        if len(layer.heads) != 1:
            return [f"{where}.heads = {layer.heads_str}: the space samples one head group "
                    "per layer (groups: {max: G} samples several)"]
        g = layer.heads[0]
        return [f"{where}.heads[0].{name} = {value}: allowed {list(allowed)}"
                for value, allowed, name in ((g.count, self.heads, "count"),
                                             (g.v_dim, self.v_dims(g.count), "v_dim"))
                if value not in allowed]

    def _groups_problems(self, layer: LayerSpec, where: str) -> list[str]:
        assert self.head_dim is not None
        heads, problems = layer.heads, []
        if len(heads) > self.max_groups:
            problems.append(f"{where}.heads = {layer.heads_str}: at most {self.max_groups} "
                            "head groups")
        if layer.width != self.budget:
            problems.append(f"{where}.heads = {layer.heads_str}: width {layer.width} must fill "
                            f"the layer budget {self.budget}")
        last, unit = heads[-1].v_dim, self.kv_unit
        for j, g in enumerate(heads):
            if g.v_dim not in self.head_dim:
                problems.append(f"{where}.heads[{j}].v_dim = {g.v_dim}: allowed "
                                f"{list(self.head_dim)}")
            elif j < len(heads) - 1 and g.count % (last // math.gcd(g.v_dim, last)):
                problems.append(f"{where}.heads[{j}] = {g}: its width must be a multiple of "
                                f"the last group's head dim {last} (order the groups by "
                                "decreasing head dim)")
            elif g.count % unit:
                problems.append(f"{where}.heads[{j}].count = {g.count}: must be a multiple of "
                                f"{unit}, which every kv_heads choice {list(self.kv_heads or ())} "
                                "divides")
        return problems


@dataclass(frozen=True)
class TrainParam:
    """A training hyper-parameter: fixed, a list of choices, or a numeric range."""

    key: str
    value: Any = None
    choices: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False

    @property
    def name(self) -> str:
        return f"train.{self.key}"

    def sample(self, trial: Suggester) -> Any:
        if self.choices is not None:
            return trial.suggest_categorical(self.name, self.choices)
        if self.low is None or self.high is None:
            return self.value
        if self.integer:
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, log=self.log)


@dataclass(frozen=True)
class SearchSpace:
    name: str
    description: str
    budget: int
    depth: int
    model: Mapping[str, Any]
    rules: tuple[LayerRule, ...]
    train: tuple[TrainParam, ...]
    sampler: str  # tpe | random | grid | prior (grid: every point of a finite space is enqueued)
    source: str  # where it was loaded from (for messages)
    data: Mapping[str, Any]  # the validated YAML content (hashed)
    data_source: DataSpec | None = None  # ``data:``: searched when no task is given

    @property
    def hash(self) -> str:
        text = json.dumps(self.data, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def rule(self, index: int) -> LayerRule:
        return next(r for r in self.rules if index in r.indices)

    def fixed_train(self, key: str) -> Any:
        return next(p.value for p in self.train if p.key == key)

    def with_train(self, **values: Any) -> SearchSpace:
        """The same space with some training hyper-parameters fixed (e.g. a smoke test's)."""
        train = [p for p in self.train if p.key not in values]
        train += [TrainParam(key, value=value) for key, value in values.items()]
        data = {**self.data, "train": {**self.data.get("train", {}), **values}}
        return dataclasses.replace(self, train=tuple(train), data=data)

    def sample(self, trial: Suggester, io: ModelIO) -> tuple[ArchConfig, dict[str, Any]]:
        """A valid architecture wired to ``io`` (the task's length, inputs and outputs) and its
        training hyper-parameters, drawn through ``trial``."""
        layers: list[LayerSpec] = []
        for i in range(self.depth):
            rule = self.rule(i)
            names = rule.names(i)
            layers.append(layers[names[0]] if names[0] < i else rule.sample(names, trial))
        fields = {**self.model, **io.fields(self.model.get("tie_embeddings", False))}
        arch = ArchConfig(d_model=self.budget, layers=tuple(layers), **fields)
        return arch, {p.key: p.sample(trial) for p in self.train}

    def largest(self, io: ModelIO) -> ArchConfig:
        """An architecture at least as large as any the space samples for ``io``: every layer
        at its rule's full width with ``qk_dim = v_dim``, its widest MLP and its most heads
        (what memory bounds are checked against)."""
        layers = []
        for i in range(self.depth):
            rule = self.rule(i)
            # Most heads: the one-group rule's largest count, else the budget over the
            # smallest head dimension a group may take.
            heads = max(rule.heads) if rule.heads else rule.budget // min(
                rule.head_dim or (1,))
            dim = 2 * max(1, rule.budget // heads // 2)  # even: valid for every positional
            layers.append(LayerSpec("mhsa", (HeadGroup(max(1, rule.budget // dim), dim),),
                                    mlp_ratio=max(rule.mlp_ratio)))
        # Learned positions: the most parameters of any positional encoding.
        fields = {**self.model, **io.fields(self.model.get("tie_embeddings", False)),
                  "positional": "learned"}
        return ArchConfig(d_model=self.budget, layers=tuple(layers), **fields)

    def largest_train(self, key: str) -> Any:
        """The largest value the space gives the training field ``key``."""
        param = next((p for p in self.train if p.key == key), None)
        if param is None:
            return getattr(TrainConfig(), key)
        return max(param.choices or (param.high,)) if param.value is None else param.value

    @property
    def ranges(self) -> frozenset[str]:
        """Names of the training params sampled from a numeric range (not a finite choice)."""
        return frozenset(p.name for p in self.train
                         if p.choices is None and p.low is not None and p.high is not None)

    def size(self, limit: int) -> int:
        """The number of points of a finite space, counted rule by rule (layers of different
        rules and training params are sampled independently), up to just past ``limit``."""
        total = 1
        for rule in self.rules:
            seen: set[LayerSpec] = set()
            path: list[int] | None = []
            while path is not None and len(seen) <= limit:
                suggester = PathSuggester(path, self.source, self.ranges)
                layer = rule.sample(rule.names(rule.indices[0]), suggester)
                seen.add(dataclasses.replace(layer, heads=merge_groups(layer.heads)))
                path = _next_path(suggester.decisions)
            total *= len(seen) ** (1 if rule.shared else len(rule.indices))
            if total > limit:
                return limit + 1
        for param in self.train:
            total *= len(param.choices) if param.choices is not None else 1
        return min(total, limit + 1)

    def grid(self, *, limit: int | None = None, free: frozenset[str] = frozenset()
             ) -> list[dict[str, Any]]:
        """Every point of a finite space, as params (raises ``SpaceError`` on a float range,
        and past ``limit`` points). Params named in ``free`` (e.g. ``ranges``) are left out of
        the points. Head groups are sampled in any order, so one model can have several
        parametrisations (``2x32 + 1x64`` and ``1x64 + 2x32``, ``1x32 + 3x32`` and
        ``4x32``): only the first of each is a grid point."""
        points: list[dict[str, Any]] = []
        seen: set[str] = set()
        path: list[int] = []
        if limit is not None and self.size(limit) > limit:
            raise SpaceError(f"{self.source}: space {self.name!r} has more than {limit} points")
        while True:
            if limit is not None and len(points) > limit:
                raise SpaceError(f"{self.source}: space {self.name!r} has more than {limit} "
                                 "points")
            suggester = PathSuggester(path, self.source, free)
            arch, train = self.sample(suggester, PROBE_IO)
            canonical = dataclasses.replace(arch, layers=tuple(
                dataclasses.replace(layer, heads=merge_groups(layer.heads))
                for layer in arch.layers))
            key = canonical.to_json() + json.dumps(train, sort_keys=True, default=str)
            if key not in seen:
                seen.add(key)
                points.append(suggester.params)
            next_path = _next_path(suggester.decisions)
            if next_path is None:
                return points
            path = next_path

    def encode(self, arch: ArchConfig, train: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Params that make ``sample`` return ``arch`` (its input/output fields aside).

        Raises:
            SpaceError: ``arch`` is not in this space (the message says which field is not).
        """
        problems = [] if arch.d_model == self.budget else [
            f"d_model = {arch.d_model}: the space's budget is {self.budget}"]
        if arch.n_layers != self.depth:
            problems.append(f"{arch.n_layers} layers: the space has depth {self.depth}")
        for key, value in self.model.items():
            if getattr(arch, key) != value:
                problems.append(f"{key} = {getattr(arch, key)!r}: the space fixes {value!r}")
        params: dict[str, Any] = {}
        for i, layer in enumerate(arch.layers[: self.depth]):
            rule = self.rule(i)
            names = rule.names(i)
            if names[0] < i:
                if layer != arch.layers[names[0]]:
                    problems.append(f"layers[{i}] = {layer.attention} {layer.heads_str}: the "
                                    f"space shares layer {names[0]}'s configuration")
                continue
            problems += rule.problems(layer, f"layers[{i}]")
            params.update(codec.encode_layer(layer, names, group_count=rule.max_groups > 1))
            if rule.kv_heads is not None:  # sampled, so recorded even when not grouped
                params.update({codec.group_key(names, j, "kv_heads"): g.kv_heads
                               for j, g in enumerate(layer.heads)})
        params.update({f"train.{key}": value for key, value in (train or {}).items()})
        if problems:
            raise SpaceError(f"{self.source}: architecture not in space {self.name!r}: "
                             + "; ".join(problems))
        return params


def _next_path(decisions: list[tuple[int, int]]) -> list[int] | None:
    """The odometer's next path after ``decisions`` ((choice, options) per decision), or None
    when every path was taken."""
    decisions = list(decisions)
    while decisions and decisions[-1][0] + 1 >= decisions[-1][1]:
        decisions.pop()
    if not decisions:
        return None
    return [d[0] for d in decisions[:-1]] + [decisions[-1][0] + 1]


# --- feasibility of several head groups ----------------------------------------------------


def min_group_widths(dims: tuple[int, ...], max_groups: int, budget: int,
                     unit: int = 1) -> list[str]:
    """Why groups of these dims could fail to fill ``budget`` (empty: they always can), when
    every head count is a multiple of ``unit`` (``LayerRule.kv_unit``). Every dim times
    ``unit`` must divide the budget, and the widest minimal layer -- ``max_groups - 1`` groups
    of ``unit * lcm(dim, last)`` and one of ``unit * last`` -- must fit."""
    per = "" if unit == 1 else f" x {unit} (the kv_heads choices' least common multiple)"
    problems = [f"head_dim {d}{per} does not divide the layer budget {budget}" for d in dims
                if budget % (unit * d)]
    for last in dims:
        widest = unit * ((max_groups - 1) * max(math.lcm(d, last) for d in dims) + last)
        if not problems and widest > budget:
            problems.append(f"{max_groups} groups ending with head_dim {last} need a width of "
                            f"{widest} > budget {budget}; lower groups.max or drop large dims")
    return problems


def neighbourhood(plan_dims: set[int], width: int, most: int,
                  unit: int = 1) -> tuple[int, list[int]]:
    """``(groups, dims)`` around a plan: the plan's head dims with their halves and doubles that
    divide ``width``, dropping the largest extra dims, then groups (from ``most`` down), until
    any choice of that many groups of those dims (head counts in multiples of ``unit``) can
    fill the width."""
    extra = {d * f for d in plan_dims for f in (0.5, 2)} - plan_dims
    for groups in range(max(1, most), 0, -1):
        candidates = sorted(int(d) for d in extra
                            if d == int(d) and width % (unit * int(d)) == 0)
        while True:
            dims = sorted(plan_dims | set(candidates))
            if not min_group_widths(tuple(dims), groups, width, unit):
                return groups, dims
            if not candidates:
                break
            candidates.pop()
    return 1, sorted(plan_dims)  # reported by the loader's checks
