"""The rules a search space samples with: a layer range's ``LayerRule`` (attention kinds, MLP
ratios, head counts or several head groups filling its width, ``qk_dim`` by ``QkRule``, key/value
heads), a training hyper-parameter's ``TrainParam``, and the feasibility of several head groups
(``min_group_widths``, ``neighbourhood``)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from arch import AttentionKind, HeadGroup, LayerSpec, Role, codec, kind_traits
from search_spaces.suggest import Suggester


@dataclass(frozen=True)
class QkRule:
    """How a group's ``qk_dim`` is chosen: equal to ``v_dim``, or reduced on a grid below it."""

    reduced: bool = False
    low: int = 8
    step: int = 8

    def range(self, kind: str, v_dim: int) -> tuple[int, int, int]:
        """``(low, high, step)`` of the integer param; one point when the kind has one width."""
        if not self.reduced or kind_traits(kind).single_width or v_dim <= self.low:
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
    latent_dim: tuple[int, ...] = ()  # a latent layer's latent widths (with attention latent)
    rope_dim: tuple[int, ...] = (0,)  # a latent layer's RoPE dims per key/value head
    # Explicit head groups, one set per choice (``heads: ["4x16", "2x32+4x8/16"]``): a layer
    # is one of these sets as given (qk_dim and kv_heads too), chosen by ``L{i}.heads``.
    head_sets: tuple[tuple[HeadGroup, ...], ...] = ()

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
        heads = (self._sample_head_set(layers, trial) if self.head_sets
                 else self._sample_heads(kind, layers, trial))
        fixed = self.fixed_fields(mlp_ratio)
        for name, value in fixed.items():  # recorded, so the params decode to this layer
            if value != codec.DEFAULTS[name]:
                trial.suggest_categorical(codec.layer_key(layers, name), (value,))
        latent, rope = self._sample_latent(layers, trial) if kind_traits(kind).latent else (0, 0)
        return LayerSpec(kind, tuple(heads), mlp_ratio=float(mlp_ratio), **fixed,
                         latent_dim=latent, rope_dim=rope)

    def _sample_heads(self, kind: str, layers: tuple[int, ...], trial: Suggester
                      ) -> tuple[HeadGroup, ...]:
        """One head group, or several filling the budget, each with its ``qk_dim`` (and
        ``kv_heads`` where the rule samples them)."""
        widths = (self._sample_groups(layers, trial) if self.max_groups > 1
                  else [self._sample_one_group(layers, trial)])
        heads = []
        for j, (count, v_dim) in enumerate(widths):
            low, high, step = self.qk.range(kind, v_dim)
            qk_dim = trial.suggest_int(codec.group_key(layers, j, "qk_dim"), low, high, step=step)
            kv = 0 if self.kv_heads is None else trial.suggest_categorical(
                codec.group_key(layers, j, "kv_heads"), self.kv_heads)
            heads.append(HeadGroup(count, qk_dim, v_dim, kv))
        return tuple(heads)

    def _sample_head_set(self, layers: tuple[int, ...], trial: Suggester
                         ) -> tuple[HeadGroup, ...]:
        """One of ``head_sets``, chosen by its heads string; its groups' fields recorded too
        (one-point ranges), so the params read as any layer's (``codec.decode``)."""
        sets = {heads_text(s): s for s in self.head_sets}
        heads = sets[trial.suggest_categorical(codec.layer_key(layers, "heads"), tuple(sets))]
        count = len(heads)
        trial.suggest_int(codec.layer_key(layers, codec.GROUP_COUNT), count, count)
        for j, group in enumerate(heads):
            for name, value in group.to_dict().items():
                trial.suggest_int(codec.group_key(layers, j, name), value, value)
        return heads

    def _sample_latent(self, layers: tuple[int, ...], trial: Suggester) -> tuple[int, int]:
        """A latent layer's latent width and RoPE dims."""
        return (trial.suggest_categorical(codec.layer_key(layers, "latent_dim"), self.latent_dim),
                trial.suggest_categorical(codec.layer_key(layers, "rope_dim"), self.rope_dim))

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
        if layer.kind.latent:
            problems += [f"{where}.{name} = {value}: allowed {list(allowed)}"
                         for name, value, allowed in (
                             ("latent_dim", layer.latent_dim, self.latent_dim),
                             ("rope_dim", layer.rope_dim, self.rope_dim)) if value not in allowed]
            if layer.rotate_latent:
                problems.append(f"{where}.rotate_latent = True: the space samples latent parts "
                                "without RoPE")
        if self.head_sets:
            if layer.heads not in self.head_sets:
                problems.append(f"{where}.heads = {layer.heads_str}: allowed "
                                f"{[heads_text(s) for s in self.head_sets]}")
            return problems
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


_GROUP = re.compile(r"^(\d+)x(\d+)(?:/(\d+))?(?:kv(\d+))?$")


def heads_text(heads: tuple[HeadGroup, ...]) -> str:
    """Head groups as ``LayerSpec.heads_str`` writes them: ``2x64+4x16/64``."""
    return "+".join(str(g) for g in heads)


def parse_heads(text: str) -> tuple[HeadGroup, ...]:
    """The head groups ``heads_text`` wrote (``2x64+4x16/64``, ``8x16kv2``).

    Raises:
        ValueError: not head groups in that form.
    """
    groups = []
    for part in text.replace(" ", "").split("+"):
        match = _GROUP.match(part)
        if match is None:
            raise ValueError(f"{part!r} is not COUNTxDIM, COUNTxQK/V or either with kvK")
        count, qk, v, kv = (int(x) if x else 0 for x in match.groups())
        groups.append(HeadGroup(count, qk, v, kv))
    return tuple(groups)


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
