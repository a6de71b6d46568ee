"""Reading and validating search-space YAML files into ``SearchSpace`` objects.

    name: aot_vs_standard
    budget: 64                    # the width budget D: d_model and every layer's width cap
    depth: 2
    model: {positional: learned}  # global ArchConfig fields
    layers:
      - layers: all               # all | 3 | 1-5 | [0, 2]; the rules partition the depth
        attention: [mhsa, mssa, mixit, frozen_qk]
        mlp_ratio: [0, 4]
        heads: [1, 2, 4, 8]       # one head group: a count from this list ...
        head_dim: derived         # ... of dim budget / count, or a list of dims
        qk_dim: same              # same | reduced | {min: 8, step: 8}
        kv_heads: [1, 2]          # optional: key/value heads per head group (grouped-query
                                  # attention); each must divide every head count sampled
        shared: false             # true: the rule's layers all take one sampled configuration
      - layers: 2
        groups: {max: 3}          # up to 3 head groups filling the layer budget exactly,
        head_dim: [16, 32, 64]    # each of one of these dims (every dim divides the budget)
    train: {steps: 200, eval_every: 20, lr: {low: 3.0e-4, high: 3.0e-3, log: true}}
    data: corpus/                 # optional: the data searched when no --task/--data is given

``head_dim: allocator`` and ``budget: allocator`` in a rule take the allocator's plan for the
space's budget and depth (a ``planner`` passed to ``load_space``): the rule's budget becomes the
plan's width for its layers, and its head dims the plan's dims with their halves and doubles
(those that divide the width and keep every sample feasible, with ``groups.max`` lowered where
that many groups could not fit; a plan whose layers share key/value heads passes its groups'
``kv_heads`` on to a rule without the key). The loader rejects unknown keys,
empty choices, rules that leave layers uncovered and choices that could break the budget,
naming the file, the key and the rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from arch import (
    ATTENTION_KINDS,
    MAX_DEPTH,
    MAX_WIDTH,
    SINGLE_WIDTH_KINDS,
    ArchConfig,
    HeadGroup,
    LayerSpec,
)
from arch.checks import ConfigError, is_int, is_number
from arch.training import TrainConfig
from common.errors import excerpt
from common.files import read_yaml
from search_spaces.errors import SpaceError
from search_spaces.rules import LayerRule, QkRule, TrainParam, min_group_widths, neighbourhood
from search_spaces.space import PROBE_IO, SearchSpace
from userdata import DataError, DataSpec

SPACES_DIR = Path(__file__).resolve().parent
TRAIN_KEYS = TrainConfig.experiment_fields()
FIXED_TRAIN_KEYS = ("steps", "eval_every")  # the scheduler needs one budget per study
MODEL_KEYS = ("positional", "norm", "mlp", "causal", "tie_embeddings", "seed")
SAMPLERS = ("tpe", "grid", "random", "prior")
REDUCED = {"min": 8, "step": 8}
ALLOCATOR = "allocator"
_TOP_KEYS = ("name", "description", "budget", "depth", "model", "layers", "train", "sampler",
             "data")
_DATA_KEYS = ("path", "format", "dtype", "vocab_size")
_RULE_KEYS = ("layers", "attention", "mlp_ratio", "heads", "head_dim", "qk_dim", "budget",
              "role", "eta", "freeze_mlp", "shared", "groups", "kv_heads")
# The allocator's plan for (budget, depth): what resolves ``allocator`` placeholders.
Planner = Callable[[int, int], ArchConfig]


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
            raise SpaceError(f"{path}: must be a mapping with keys {', '.join(_TOP_KEYS)}")
        return cls(data, str(path))

    def load(self, budget: int | None = None, planner: Planner | None = None) -> SearchSpace:
        """The validated space (``budget`` overrides the file's; ``planner`` resolves
        ``allocator`` placeholders)."""
        data = dict(self.data) if budget is None else {**self.data, "budget": budget}
        return parse_space(data, self.source, planner)

    def data_source(self) -> DataSpec | None:
        """The file's ``data:`` (what it searches when no task is given)."""
        check = _Checker(self.source)
        spec = _parse_data(check, self.data.get("data"), self.source)
        check.raise_if_any()
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


def load_space(name: str | Path, budget: int | None = None,
               planner: Planner | None = None) -> SearchSpace:
    """Read and validate a space file (``budget`` overrides the file's; ``planner`` resolves
    ``allocator`` placeholders)."""
    return SpaceFile.read(name).load(budget, planner)


def uses_allocator(data: Mapping[str, Any]) -> bool:
    """Whether a space's rules take values from the allocator's plan."""
    rules = data.get("layers")
    return isinstance(rules, list) and any(
        isinstance(r, dict) and ALLOCATOR in (r.get("head_dim"), r.get("budget")) for r in rules)


class _Checker:
    """Collects problems as ``source: key = value: rule`` and raises them together."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[str] = []

    def add(self, key: str, value: Any, rule: str) -> None:
        self.problems.append(f"{key} = {excerpt(value)}: {rule}")

    def keys(self, data: Any, valid: tuple[str, ...], where: str) -> bool:
        if not isinstance(data, dict):
            self.add(where, data, f"must be a mapping with keys {', '.join(valid)}")
            return False
        for key in sorted(set(data) - set(valid)):
            self.add(f"{where}.{key}" if where else key, data[key],
                     f"unknown key; valid: {', '.join(valid)}")
        return True

    def int_between(self, key: str, value: Any, low: int, high: int) -> bool:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.add(key, value, f"must be an integer between {low} and {high:,}")
            return False
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


def parse_space(data: Mapping[str, Any], source: str = "<space>",
                planner: Planner | None = None) -> SearchSpace:
    """Validate a space given as a dict (what ``load_space`` read from YAML)."""
    check = _Checker(source)
    if not check.keys(dict(data), _TOP_KEYS, ""):
        check.raise_if_any()
    budget: Any = data.get("budget")
    depth: Any = data.get("depth", 1)
    name = data.get("name") or Path(source).stem
    budget_ok = check.int_between("budget", budget, 1, MAX_WIDTH)
    depth_ok = check.int_between("depth", depth, 1, MAX_DEPTH)
    sampler = data.get("sampler", "tpe")
    if sampler not in SAMPLERS:
        check.add("sampler", sampler, f"must be one of {', '.join(SAMPLERS)}")
    model: Any = data.get("model") or {}
    model = ({k: v for k, v in model.items() if k in MODEL_KEYS}
             if check.keys(model, MODEL_KEYS, "model") else {})
    rules_data = data.get("layers")
    if budget_ok and depth_ok and uses_allocator(data):
        rules_data = _resolve_allocator(check, rules_data, budget, depth, planner)
    rules = _parse_rules(check, rules_data, budget if budget_ok else 1,
                         depth if depth_ok else 0)
    train = _parse_train(check, data.get("train") or {})
    source_data = _parse_data(check, data.get("data"), source)
    check.raise_if_any()
    space = SearchSpace(str(name), str(data.get("description", "")), budget, depth, model,
                        tuple(rules), tuple(train), sampler, source,
                        {**data, "layers": rules_data}, source_data)
    _check_constructible(space)
    if sampler == "grid":
        space.grid()  # raises if a range makes the space infinite
    return space


def _parse_data(check: _Checker, value: Any, source: str) -> DataSpec | None:
    """``data: PATH`` or ``data: {path, format, dtype, vocab_size}``; a relative path is
    relative to the space file."""
    if value is None:
        return None
    if isinstance(value, str):
        value = {"path": value}
    if not check.keys(value, _DATA_KEYS, "data") or not isinstance(value.get("path"), str):
        if isinstance(value, dict):
            check.add("data.path", value.get("path"), "must be a file or folder path")
        return None
    path = Path(value["path"])
    if not path.is_absolute() and Path(source).exists():
        path = Path(source).parent / path
    try:
        return DataSpec(str(path), value.get("format"), value.get("dtype", "uint16"),
                        value.get("vocab_size")).resolved()
    except DataError as err:
        check.add("data", value, str(err).split(": ", 1)[-1])
        return None


def _layer_indices(check: _Checker, key: str, value: Any, depth: int) -> tuple[int, ...]:
    if value in (None, "all"):
        return tuple(range(depth))
    if is_int(value):
        value = [value]
    elif isinstance(value, str) and "-" in value:
        first, _, last = value.partition("-")
        if first.strip().isdigit() and last.strip().isdigit():
            value = list(range(int(first), int(last) + 1))
    if not isinstance(value, list) or not value or not all(is_int(v) for v in value):
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
                        lambda v: is_number(v) and v >= 0, "must be numbers >= 0 (0 = no MLP)")
    max_groups = _parse_groups(check, f"{where}.groups", item.get("groups", {"max": 1}))
    heads: tuple[Any, ...] = ()
    if max_groups == 1:
        heads = check.choices(f"{where}.heads", item.get("heads"), lambda v: is_int(v) and v >= 1,
                              "must be head counts (integers >= 1)")
    elif "heads" in item:
        check.add(f"{where}.heads", item["heads"], "not used with groups.max > 1: the counts "
                  "are sampled to fill the layer budget")
    head_dim_data = item.get("head_dim", "derived")
    head_dim = None if head_dim_data == "derived" and max_groups == 1 else check.choices(
        f"{where}.head_dim", head_dim_data, lambda v: is_int(v) and v >= 1,
        "must be a list of integers >= 1" + ("" if max_groups > 1 else
                                              " or 'derived' (budget / heads)"))
    qk = _parse_qk(check, f"{where}.qk_dim", item.get("qk_dim", "same"))
    kv_heads = _parse_kv_heads(check, f"{where}.kv_heads", item.get("kv_heads"), attention)
    role, eta = item.get("role", "process"), item.get("eta", 1.0)
    shared = item.get("shared", False)
    if not isinstance(shared, bool):
        check.add(f"{where}.shared", shared, "must be true or false")
    if len(check.problems) > n:
        return None
    return LayerRule(indices, attention, tuple(float(m) for m in mlp), heads, head_dim, qk,
                     rule_budget, role, eta, item.get("freeze_mlp", False), shared, max_groups,
                     kv_heads)


def _parse_kv_heads(check: _Checker, key: str, value: Any,
                    attention: tuple[Any, ...]) -> tuple[int, ...] | None:
    """The key/value head choices of a rule (None: one per query head, nothing sampled)."""
    if value is None:
        return None
    choices = check.choices(key, value, lambda v: is_int(v) and v >= 1,
                            "must be key/value head counts per head group (integers >= 1)")
    single = [kind for kind in attention if kind in SINGLE_WIDTH_KINDS]
    if choices and single:
        check.add(key, value, f"grouped key/value heads are for mhsa and frozen_qk layers; "
                  f"attention also allows {', '.join(single)} (no separate keys and values)")
        return None
    return tuple(sorted(set(choices))) or None


def _parse_groups(check: _Checker, key: str, value: Any) -> int:
    if isinstance(value, dict) and set(value) == {"max"} and check.int_at_least(
            f"{key}.max", value["max"], 1):
        return int(value["max"])
    if not (isinstance(value, dict) and set(value) == {"max"}):
        check.add(key, value, "must be {max: G}, the most head groups a layer may have")
    return 1


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
                    or not (is_number(low) and is_number(high) and 0 < low <= high)):
                check.add(where, value, "must be a value, a list of choices or "
                          "{low, high, log} with 0 < low <= high" +
                          (" (and fixed: the scheduler needs it)" if key in FIXED_TRAIN_KEYS
                           else ""))
                continue
            params.append(TrainParam(key, low=low, high=high, log=bool(value.get("log")),
                                     integer=is_int(low) and is_int(high)))
        else:
            if key in FIXED_TRAIN_KEYS and not check.int_at_least(where, value, 1):
                continue
            params.append(TrainParam(key, value=value))
    for param in params:
        check.problems += _train_value_problems(param)
    return params


def _train_value_problems(param: TrainParam) -> list[str]:
    """What ``TrainConfig`` says of every value the parameter can take (its fixed value, each
    choice, or both ends of its range)."""
    values = ([param.value] if param.low is None and param.choices is None
              else list(param.choices or ()) or [param.low, param.high])
    return sorted({p for v in values for p in TrainConfig.problems({param.key: v}, "train")})


def _check_constructible(space: SearchSpace) -> None:
    """Every choice a rule allows must make a valid layer: budget, divisibility, ArchConfig."""
    problems = []
    for r, rule in enumerate(space.rules):
        where = f"layers[{r}]"
        if rule.max_groups > 1:
            assert rule.head_dim is not None
            problems += [f"{where}: {p}" for p in min_group_widths(rule.head_dim,
                                                                    rule.max_groups,
                                                                    rule.budget, rule.kv_unit)]
        for kv in rule.kv_heads or ():
            counts = [c for c in rule.heads if c % kv]
            if counts:  # Optuna keeps a categorical param's choices fixed: none may fail
                problems.append(f"{where}.kv_heads = {kv}: must divide every head count the "
                                f"rule samples (heads = {counts[0]})")
        for count in rule.heads:
            widest = max(rule.v_dims(count)) * count
            if rule.head_dim is None and rule.budget % count:
                problems.append(f"{where}.heads = {count}: head_dim 'derived' needs the count to "
                                f"divide the budget {rule.budget}")
            elif widest > rule.budget:
                problems.append(f"{where}.heads = {count}: {count} x {max(rule.v_dims(count))} "
                                f"= {widest} exceeds the width budget {rule.budget}")
        if rule.budget > space.budget:
            problems.append(f"{where}.budget = {rule.budget}: exceeds the space's budget "
                            f"{space.budget}")
        if problems:
            continue
        count = rule.heads[0] if rule.heads else 1
        dim = rule.v_dims(count)[0]
        for kind in rule.attention:  # the rest is ArchConfig's own validation, on extremes
            for ratio in rule.mlp_ratio:
                try:
                    layer = LayerSpec(kind, (HeadGroup(count, dim),), ratio, rule.role,
                                      eta=rule.eta)
                    ArchConfig(d_model=space.budget, layers=(layer,),
                               **{**space.model, **PROBE_IO.fields(True)})
                except (ConfigError, TypeError) as err:
                    problems.append(f"{where} (attention {kind}, mlp_ratio {ratio:g}): {err}")
    if problems:
        raise SpaceError(f"{space.source}: " + "; ".join(problems))


# --- the allocator's plan as a neighbourhood ------------------------------------------------


def _resolve_allocator(check: _Checker, rules: Any, budget: int, depth: int,
                       planner: Planner | None) -> Any:
    """``rules`` with ``allocator`` placeholders replaced by the plan's widths and dims."""
    if planner is None:
        check.add("layers", ALLOCATOR, "this space takes head dims or budgets from the "
                  "allocator's plan; load it through the search launcher (a planner)")
        return rules
    plan = planner(budget, depth)
    resolved = []
    for r, item in enumerate(rules):
        if not isinstance(item, dict) or ALLOCATOR not in (item.get("head_dim"),
                                                         item.get("budget")):
            resolved.append(item)
            continue
        where = f"layers[{r}]"
        indices = _layer_indices(check, f"{where}.layers", item.get("layers", "all"), depth)
        layers = [plan.layers[i] for i in indices]
        widths = {layer.width for layer in layers}
        if len(widths) != 1:
            check.add(f"{where}.budget", ALLOCATOR, f"the plan's widths differ over its layers "
                      f"({sorted(widths)}); split the rule")
            resolved.append(item)
            continue
        (width,) = widths
        item = {**item, "budget": width if item.get("budget") == ALLOCATOR else item["budget"]}
        kv = sorted({g.kv_heads for layer in layers for g in layer.heads})
        if "kv_heads" not in item and any(g.grouped for layer in layers for g in layer.heads):
            item["kv_heads"] = kv  # the plan shares key/value heads: so do its neighbours
        if item.get("head_dim") == ALLOCATOR:
            groups = item.get("groups", {"max": 1})
            most = groups.get("max", 1) if isinstance(groups, dict) else 1
            plan_dims = {g.v_dim for layer in layers for g in layer.heads}
            unit = _kv_unit(item.get("kv_heads"))
            max_groups, dims = neighbourhood(plan_dims, item["budget"], most, unit)
            item = {**item, "head_dim": dims, "groups": {"max": max_groups}}
            if max_groups == 1:  # one group: the rule samples a head count, dim = width / count
                item.update(heads=sorted({item["budget"] // d for d in dims
                                          if item["budget"] // d % unit == 0} or
                                         {item["budget"] // d for d in dims}),
                            head_dim="derived")
        resolved.append(item)
    return resolved


def _kv_unit(value: Any) -> int:
    """The least common multiple of a rule's ``kv_heads`` choices as written (1 when absent or
    not yet valid: the rule's own checks report it)."""
    items = value if isinstance(value, list) else [value]
    if value is None or not items or not all(is_int(v) and v >= 1 for v in items):
        return 1
    return math.lcm(*items)
