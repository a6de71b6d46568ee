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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from arch import ArchConfig, HeadGroup, LayerSpec, ModelIO, TrainConfig, codec, merge_groups
from search_spaces.errors import SpaceError
from search_spaces.rules import LayerRule, TrainParam
from search_spaces.suggest import PathSuggester, Suggester, next_path
from userdata import DataSpec

# Input/output of no task: enumerating a grid and validating a rule's choices need an
# ArchConfig, and the layers' validity does not depend on the task.
PROBE_IO = ModelIO(max_seq_len=1, vocab_size=1)


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
            heads = (max(sum(g.count for g in h) for h in rule.head_sets) if rule.head_sets
                     else max(rule.heads) if rule.heads else rule.budget // min(
                         rule.head_dim or (1,)))
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
            power = 1 if rule.shared else len(rule.indices)
            seen: set[LayerSpec] = set()
            path: list[int] | None = []
            # Only as far as the product passes the limit: after a first rule of 72 layers, a
            # rule of two free layers needs 6 of its layers counted (72 x 6^2 > 2,000), not
            # 2,001 (0.45 s of a prior search's start).
            while path is not None and total * len(seen) ** power <= limit:
                suggester = PathSuggester(path, self.source, self.ranges)
                layer = rule.sample(rule.names(rule.indices[0]), suggester)
                seen.add(dataclasses.replace(layer, heads=merge_groups(layer.heads)))
                path = next_path(suggester.decisions)
            total *= len(seen) ** power
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
        return [params for params, _ in self.grid_chances(limit=limit, free=free)]

    def grid_chances(self, *, limit: int | None = None, free: frozenset[str] = frozenset()
                     ) -> list[tuple[dict[str, Any], float]]:
        """``grid``'s points, each with the chance that random search (every decision uniform
        over its options, as Optuna's ``RandomSampler`` and ``RandomSuggester`` draw) lands on
        it: the product of ``1 / options`` over its decisions, summed over its
        parametrisations. The chances sum to 1."""
        points: dict[str, tuple[dict[str, Any], float]] = {}
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
            chance = math.prod(1 / options for _, options in suggester.decisions)
            params, total = points.get(key, (suggester.params, 0.0))
            points[key] = (params, total + chance)
            following = next_path(suggester.decisions)
            if following is None:
                return list(points.values())
            path = following

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
            sets = bool(rule.head_sets)
            params.update(codec.encode_layer(layer, names,
                                             group_count=rule.max_groups > 1 or sets))
            if sets:
                params[codec.layer_key(names, "heads")] = layer.heads_str
            if rule.kv_heads is not None:  # sampled, so recorded even when not grouped
                params.update({codec.group_key(names, j, "kv_heads"): g.kv_heads
                               for j, g in enumerate(layer.heads)})
            if layer.kind.latent:  # sampled, so recorded even at its default
                params[codec.layer_key(names, "rope_dim")] = layer.rope_dim
        params.update({f"train.{key}": value for key, value in (train or {}).items()})
        if problems:
            raise SpaceError(f"{self.source}: architecture not in space {self.name!r}: "
                             + "; ".join(problems))
        return params
