"""Search spaces (SPEC §7): YAML files describing which per-layer configurations a search samples.

A space fixes the width budget ``D`` (the model's ``d_model`` and every layer's attention-width
cap ``sum count * v_dim <= D``), the depth, the global ``ArchConfig`` fields, one rule per layer
range and the training hyper-parameters::

    name: aot_vs_standard
    budget: 64
    depth: 2
    model: {positional: learned}
    layers:
      - layers: all               # all | 3 | 1-5 | [0, 2]; rules partition the depth
        attention: [mhsa, mssa, mixit, frozen_qk]
        mlp_ratio: [0, 4]
        heads: [1, 2, 4, 8]
        head_dim: derived         # v_dim = budget / count, or a list of dims
        qk_dim: same              # same | reduced | {min: 8, step: 8}
        shared: false             # true: the rule's layers all take one sampled configuration
    train: {steps: 200, eval_every: 20, lr: {low: 3.0e-4, high: 3.0e-3, log: true}}

Sampling is define-by-run against anything with Optuna's ``suggest_categorical`` /
``suggest_int`` / ``suggest_float`` (an Optuna trial, or ``RandomSuggester`` here), and every
sampled point is a valid ``ArchConfig`` by construction: derived values are one-point integer
ranges and the loader rejects rules whose choices could break the budget. Param names are the
study vocabulary (``L{i}.attention``, ``L{i}.g0.count``, ...; ``train.lr``). ``encode`` is the
inverse: the params that make sampling return a given architecture, so it can be enqueued.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from search_spaces.arch import (
    ATTENTION_KINDS,
    SINGLE_WIDTH_KINDS,
    ArchConfig,
    ConfigError,
    HeadGroup,
    LayerSpec,
    ModelIO,
)

SPACES_DIR = Path(__file__).resolve().parent
TRAIN_KEYS = ("steps", "eval_every", "batch_size", "lr", "optimizer", "weight_decay", "warmup",
              "min_lr", "grad_clip", "eval_batches", "seed")
FIXED_TRAIN_KEYS = ("steps", "eval_every")  # the scheduler needs one budget per study
MODEL_KEYS = ("positional", "norm", "mlp", "causal", "tie_embeddings", "seed")
_TOP_KEYS = ("name", "description", "budget", "depth", "model", "layers", "train", "sampler")
SAMPLERS = ("tpe", "grid", "random")
_RULE_KEYS = ("layers", "attention", "mlp_ratio", "heads", "head_dim", "qk_dim", "budget",
              "role", "eta", "freeze_mlp", "shared")
REDUCED = {"min": 8, "step": 8}
# Input/output of no task: enumerating a grid and validating a rule's choices need an
# ArchConfig, and the layers' validity does not depend on the task.
PROBE_IO = ModelIO(max_seq_len=1, vocab_size=1)


class SpaceError(ValueError):
    """An invalid search space; the message names the file, the key and the rule."""


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


@dataclass(frozen=True)
class QkRule:
    """How a layer's ``qk_dim`` is chosen: equal to ``v_dim``, or reduced on a grid below it."""

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
    attention: tuple[str, ...]
    mlp_ratio: tuple[float, ...]
    heads: tuple[int, ...]
    head_dim: tuple[int, ...] | None  # None: derived as budget // count
    qk: QkRule
    budget: int
    role: str = "process"
    eta: float = 1.0
    freeze_mlp: bool = False
    shared: bool = False  # every layer of the rule takes the first one's sampled configuration

    def v_dims(self, count: int) -> tuple[int, ...]:
        return (self.budget // count,) if self.head_dim is None else self.head_dim


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
    sampler: str  # tpe | random | grid (grid: every point of a finite space is enqueued)
    source: str  # where it was loaded from (for messages)
    data: Mapping[str, Any]  # the validated YAML content (hashed; rebuilt on budget override)

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
        return parse_space({**self.data, "train": {**self.data.get("train", {}), **values}},
                           self.source)

    def sample(self, trial: Suggester, io: ModelIO) -> tuple[ArchConfig, dict[str, Any]]:
        """A valid architecture wired to ``io`` (the task's length, inputs and outputs) and its
        training hyper-parameters, drawn through ``trial``."""
        layers: list[LayerSpec] = []
        for i in range(self.depth):
            rule = self.rule(i)
            first = min(rule.indices)
            layers.append(layers[first] if rule.shared and i != first
                          else _sample_layer(rule, i, trial))
        fields = {**self.model, **io.fields(self.model.get("tie_embeddings", False))}
        arch = ArchConfig(d_model=self.budget, layers=tuple(layers), **fields)
        return arch, {p.key: p.sample(trial) for p in self.train}

    def grid(self) -> list[dict[str, Any]]:
        """Every point of a finite space, as params (raises ``SpaceError`` on a float range)."""
        points: list[dict[str, Any]] = []
        path: list[int] = []
        while True:
            suggester = _PathSuggester(path, self.source)
            self.sample(suggester, PROBE_IO)
            points.append(suggester.params)
            decisions = suggester.decisions
            while decisions and decisions[-1][0] + 1 >= decisions[-1][1]:
                decisions.pop()
            if not decisions:
                return points
            path = [d[0] for d in decisions[:-1]] + [decisions[-1][0] + 1]

    def encode(self, arch: ArchConfig, train: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Params that make ``sample`` return ``arch`` (its I/O fields aside).

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
            first = min(rule.indices)
            if rule.shared and i != first:
                if layer != arch.layers[first]:
                    problems.append(f"layers[{i}] = {layer.attention} {layer.heads_str}: the "
                                    f"space shares layer {first}'s configuration")
                continue
            problems += _encode_layer(rule, i, layer, params)
        for key, value in (train or {}).items():
            params[f"train.{key}"] = value
        if problems:
            raise SpaceError(f"{self.source}: architecture not in space {self.name!r}: "
                             + "; ".join(problems))
        return params


class _PathSuggester(RandomSuggester):
    """Takes the ``path[k]``-th choice at the k-th decision (0 past the path's end), recording
    each decision's number of options: an odometer over a finite space."""

    def __init__(self, path: list[int], source: str) -> None:
        super().__init__()
        self.path, self.source = path, source
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
        return self._pick(name, list(range(low, high + 1, step)))

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float:
        if low != high:
            raise SpaceError(f"{self.source}: sampler 'grid' needs finite choices; {name} is a "
                             f"range {low:g}..{high:g} (give a list)")
        return self._pick(name, [low])


def _sample_layer(rule: LayerRule, i: int, trial: Suggester) -> LayerSpec:
    kind = trial.suggest_categorical(f"L{i}.attention", rule.attention)
    mlp_ratio = trial.suggest_categorical(f"L{i}.mlp_ratio", rule.mlp_ratio)
    count = trial.suggest_categorical(f"L{i}.g0.count", rule.heads)
    if rule.head_dim is None:  # derived: a one-point range keeps the value in the study
        v = rule.budget // count
        v_dim = trial.suggest_int(f"L{i}.g0.v_dim", v, v)
    else:
        v_dim = trial.suggest_categorical(f"L{i}.g0.v_dim", rule.head_dim)
    low, high, step = rule.qk.range(kind, v_dim)
    qk_dim = trial.suggest_int(f"L{i}.g0.qk_dim", low, high, step=step)
    return LayerSpec(kind, (HeadGroup(count, qk_dim, v_dim),), mlp_ratio=float(mlp_ratio),
                     role=rule.role, eta=rule.eta, freeze_mlp=rule.freeze_mlp and mlp_ratio > 0)


def _encode_layer(rule: LayerRule, i: int, layer: LayerSpec, params: dict[str, Any]
                  ) -> list[str]:
    where = f"layers[{i}]"
    if len(layer.heads) != 1:
        return [f"{where}.heads = {layer.heads_str}: the space samples one head group per layer"]
    g, problems = layer.heads[0], []
    checks = ((layer.attention, rule.attention, "attention"),
              (layer.mlp_ratio, rule.mlp_ratio, "mlp_ratio"), (g.count, rule.heads, "count"),
              (g.v_dim, rule.v_dims(g.count), "v_dim"))
    for value, allowed, field in checks:
        if value not in allowed:
            problems.append(f"{where}.{field} = {value!r}: allowed {list(allowed)}")
    if not rule.qk.allows(layer.attention, g.v_dim, g.qk_dim):
        low, high, step = rule.qk.range(layer.attention, g.v_dim)
        problems.append(f"{where}.qk_dim = {g.qk_dim}: allowed {low}..{high} step {step}")
    fixed = {"role": rule.role, "eta": rule.eta,
             "freeze_mlp": rule.freeze_mlp and layer.mlp_ratio > 0}
    problems += [f"{where}.{k} = {getattr(layer, k)!r}: the space fixes {v!r}"
                 for k, v in fixed.items() if getattr(layer, k) != v]
    params.update({f"L{i}.attention": layer.attention, f"L{i}.mlp_ratio": layer.mlp_ratio,
                   f"L{i}.g0.count": g.count, f"L{i}.g0.v_dim": g.v_dim,
                   f"L{i}.g0.qk_dim": g.qk_dim})
    return problems


# --- loading and validation ---------------------------------------------------------------------


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


def load_space(name: str | Path, budget: int | None = None) -> SearchSpace:
    """Read and validate a space file (``budget`` overrides the file's)."""
    path = resolve_path(name)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise SpaceError(f"{path}: cannot read YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise SpaceError(f"{path}: must be a mapping with keys {', '.join(_TOP_KEYS)}")
    if budget is not None:
        data["budget"] = budget
    return parse_space(data, str(path))


class _Checker:
    """Collects problems as ``source: key = value: rule`` and raises them together."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[str] = []

    def add(self, key: str, value: Any, rule: str) -> None:
        self.problems.append(f"{key} = {value!r}: {rule}")

    def keys(self, data: Any, valid: tuple[str, ...], where: str) -> bool:
        if not isinstance(data, dict):
            self.add(where, data, f"must be a mapping with keys {', '.join(valid)}")
            return False
        for key in sorted(set(data) - set(valid)):
            self.add(f"{where}.{key}" if where else key, data[key],
                     f"unknown key; valid: {', '.join(valid)}")
        return True

    def int_at_least(self, key: str, value: Any, minimum: int) -> bool:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.add(key, value, f"must be an integer >= {minimum}")
            return False
        return True

    def choices(self, key: str, value: Any, check: Any, rule: str) -> tuple[Any, ...]:
        items = value if isinstance(value, list) else [value]
        if not items:
            self.add(key, value, "must not be empty")
            return ()
        bad = [v for v in items if not check(v)]
        if bad:
            self.add(key, bad[0] if len(bad) == 1 else bad, rule)
            return ()
        return tuple(items)

    def raise_if_any(self) -> None:
        if self.problems:
            raise SpaceError(f"{self.source}: " + "; ".join(self.problems))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def parse_space(data: Mapping[str, Any], source: str = "<space>") -> SearchSpace:
    """Validate a space given as a dict (what ``load_space`` read from YAML)."""
    check = _Checker(source)
    if not check.keys(dict(data), _TOP_KEYS, ""):
        check.raise_if_any()
    budget: Any = data.get("budget")
    depth: Any = data.get("depth", 1)
    name = data.get("name") or Path(source).stem
    budget_ok = check.int_at_least("budget", budget, 1)
    depth_ok = check.int_at_least("depth", depth, 1)
    sampler = data.get("sampler", "tpe")
    if sampler not in SAMPLERS:
        check.add("sampler", sampler, f"must be one of {', '.join(SAMPLERS)}")
    model = dict(data.get("model") or {})
    if check.keys(model, MODEL_KEYS, "model"):
        model = {k: v for k, v in model.items() if k in MODEL_KEYS}
    rules = _parse_rules(check, data.get("layers"), budget if budget_ok else 1,
                         depth if depth_ok else 0)
    train = _parse_train(check, data.get("train") or {})
    check.raise_if_any()
    space = SearchSpace(str(name), str(data.get("description", "")), budget, depth, model,
                        tuple(rules), tuple(train), sampler, source, dict(data))
    _check_constructible(space)
    if sampler == "grid":
        space.grid()  # raises if a range makes the space infinite
    return space


def _layer_indices(check: _Checker, key: str, value: Any, depth: int) -> tuple[int, ...]:
    if value in (None, "all"):
        return tuple(range(depth))
    if _is_int(value):
        value = [value]
    elif isinstance(value, str) and "-" in value:
        first, _, last = value.partition("-")
        if first.strip().isdigit() and last.strip().isdigit():
            value = list(range(int(first), int(last) + 1))
    if not isinstance(value, list) or not value or not all(_is_int(v) for v in value):
        check.add(key, value, "must be 'all', a layer index, a range 'a-b' or a list of indices")
        return ()
    outside = [v for v in value if not 0 <= v < depth]
    if outside:
        check.add(key, value, f"layer indices must lie in 0..{depth - 1} (depth {depth})")
        return ()
    return tuple(value)


def _parse_rules(check: _Checker, data: Any, budget: int, depth: int) -> list[LayerRule]:
    if not isinstance(data, list) or not data:
        check.add("layers", data, "must be a non-empty list of layer rules")
        return []
    rules: list[LayerRule] = []
    owner: dict[int, int] = {}
    for r, item in enumerate(data):
        where = f"layers[{r}]"
        if not check.keys(item, _RULE_KEYS, where):
            continue
        rule = _parse_rule(check, where, item, budget, depth)
        if rule is None:
            continue
        for i in rule.indices:
            if i in owner:
                check.add(f"{where}.layers", item.get("layers", "all"),
                          f"layer {i} is already covered by layers[{owner[i]}]")
            owner[i] = r
        rules.append(rule)
    missing = [i for i in range(depth) if i not in owner]
    if missing and not check.problems:
        check.add("layers", [r.indices for r in rules], f"no rule covers layers {missing}")
    return rules


def _parse_rule(check: _Checker, where: str, item: dict[str, Any], budget: int,
                depth: int) -> LayerRule | None:
    n = len(check.problems)
    indices = _layer_indices(check, f"{where}.layers", item.get("layers", "all"), depth)
    rule_budget = item.get("budget", budget)
    check.int_at_least(f"{where}.budget", rule_budget, 1)
    attention = check.choices(f"{where}.attention", item.get("attention", ["mhsa"]),
                              lambda v: v in ATTENTION_KINDS, f"must be from {ATTENTION_KINDS}")
    mlp = check.choices(f"{where}.mlp_ratio", item.get("mlp_ratio", [0]),
                        lambda v: _is_number(v) and v >= 0, "must be numbers >= 0 (0 = no MLP)")
    heads = check.choices(f"{where}.heads", item.get("heads"), lambda v: _is_int(v) and v >= 1,
                          "must be head counts (integers >= 1)")
    head_dim_data = item.get("head_dim", "derived")
    head_dim = None if head_dim_data == "derived" else check.choices(
        f"{where}.head_dim", head_dim_data, lambda v: _is_int(v) and v >= 1,
        "must be 'derived' (budget / heads) or a list of integers >= 1")
    qk = _parse_qk(check, f"{where}.qk_dim", item.get("qk_dim", "same"))
    role, eta = item.get("role", "process"), item.get("eta", 1.0)
    shared = item.get("shared", False)
    if not isinstance(shared, bool):
        check.add(f"{where}.shared", shared, "must be true or false")
    if len(check.problems) > n:
        return None
    return LayerRule(indices, tuple(attention), tuple(float(m) for m in mlp), tuple(heads),
                     head_dim, qk, rule_budget, role, eta, item.get("freeze_mlp", False), shared)


def _parse_qk(check: _Checker, key: str, value: Any) -> QkRule:
    if value == "same":
        return QkRule()
    if value == "reduced":
        value = REDUCED
    if isinstance(value, dict) and set(value) <= {"min", "step"}:
        low, step = value.get("min", REDUCED["min"]), value.get("step", REDUCED["step"])
        if check.int_at_least(f"{key}.min", low, 1) and check.int_at_least(f"{key}.step", step, 1):
            return QkRule(True, low, step)
        return QkRule()
    check.add(key, value, "must be 'same', 'reduced' or {min: 8, step: 8}")
    return QkRule()


def _parse_train(check: _Checker, data: Any) -> list[TrainParam]:
    if not check.keys(data, TRAIN_KEYS, "train"):
        return []
    data = {"steps": 200, "eval_every": 20, **data}
    params = []
    for key in TRAIN_KEYS:
        if key not in data:
            continue
        value, where = data[key], f"train.{key}"
        if isinstance(value, list):
            if key in FIXED_TRAIN_KEYS or not value:
                check.add(where, value, "must be one value" if value else "must not be empty")
                continue
            params.append(TrainParam(key, choices=tuple(value)))
        elif isinstance(value, dict):
            low: Any = value.get("low")
            high: Any = value.get("high")
            if (key in FIXED_TRAIN_KEYS or set(value) - {"low", "high", "log"}
                    or not (_is_number(low) and _is_number(high) and 0 < low <= high)):
                check.add(where, value, "must be a value, a list of choices or "
                          "{low, high, log} with 0 < low <= high" +
                          (" (and fixed: the scheduler needs it)" if key in FIXED_TRAIN_KEYS
                           else ""))
                continue
            params.append(TrainParam(key, low=low, high=high, log=bool(value.get("log")),
                                     integer=_is_int(low) and _is_int(high)))
        else:
            if key in FIXED_TRAIN_KEYS and not check.int_at_least(where, value, 1):
                continue
            params.append(TrainParam(key, value=value))
    return params


def _check_constructible(space: SearchSpace) -> None:
    """Every choice a rule allows must make a valid layer: budget, divisibility, ArchConfig."""
    problems = []
    for r, rule in enumerate(space.rules):
        where = f"layers[{r}]"
        for count in rule.heads:
            widest = max(rule.v_dims(count)) * count
            if rule.head_dim is None and rule.budget % count:
                problems.append(f"{where}.heads = {count}: head_dim 'derived' needs the count to "
                                f"divide the budget {rule.budget}")
            elif widest > rule.budget:
                problems.append(f"{where}.heads = {count}: {count} x {max(rule.v_dims(count))} "
                                f"= {widest} exceeds the width budget {rule.budget}")
        if problems:
            continue
        for kind in rule.attention:  # the rest is ArchConfig's own validation, on extremes
            for ratio in rule.mlp_ratio:
                try:
                    layer = LayerSpec(kind, (HeadGroup(rule.heads[0], rule.v_dims(
                        rule.heads[0])[0]),), ratio, rule.role, eta=rule.eta)
                    ArchConfig(d_model=space.budget, layers=(layer,),
                               **{**space.model, **PROBE_IO.fields(True)})
                except (ConfigError, TypeError) as err:
                    problems.append(f"{where} (attention {kind}, mlp_ratio {ratio:g}): {err}")
    if problems:
        raise SpaceError(f"{space.source}: " + "; ".join(problems))

