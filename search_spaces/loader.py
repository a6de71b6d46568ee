"""Reading and validating search-space YAML files into ``SearchSpace`` objects.

    name: aot_vs_standard
    budget: 64                    # the width budget D: d_model and every layer's width cap
    depth: 2
    model: {positional: learned}  # global ArchConfig fields
    layers:
      - layers: all               # all | 3 | 1-5 | [0, 2]; the rules partition the depth
        attention: [mhsa, mssa, mixit, frozen_qk]
        mlp_ratio: [0, 4]
        heads: [1, 2, 4, 8]       # one head group: a count from this list (or explicit
                                  # groups, one set per choice: ["4x16", "2x32+4x8/16"]) ...
        head_dim: derived         # ... of dim budget / count, or a list of dims
        qk_dim: same              # same | reduced | {min: 8, step: 8}
        kv_heads: [1, 2]          # optional: key/value heads per head group (grouped-query
                                  # attention); each must divide every head count sampled
        latent_dim: [16, 32]      # with attention latent: the latent cached per token
        rope_dim: [0, 8]          # with attention latent: RoPE dims per key/value head (0)
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

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from arch import (
    ATTENTION_KINDS,
    MAX_DEPTH,
    MAX_WIDTH,
    ArchConfig,
    ConfigError,
    HeadGroup,
    LayerSpec,
    TrainConfig,
    kind_traits,
    kinds_text,
    kinds_where,
)
from arch.checks import add, is_int, is_number, need_choices, need_int, need_keys
from search_spaces.errors import SpaceError
from search_spaces.placeholders import resolve_allocator, uses_allocator
from search_spaces.rules import (
    LayerRule,
    QkRule,
    TrainParam,
    heads_text,
    min_group_widths,
    parse_heads,
)
from search_spaces.schema import (
    DATA_KEYS,
    FIXED_TRAIN_KEYS,
    MODEL_KEYS,
    REDUCED,
    RULE_KEYS,
    SAMPLER_KINDS,
    SAMPLERS,
    TOP_KEYS,
    TRAIN_KEYS,
    Planner,
    layer_indices,
)
from search_spaces.space import PROBE_IO, SearchSpace
from userdata import DataError, DataSpec


def raise_if_any(problems: list[str], source: str) -> None:
    if problems:
        raise SpaceError(f"{source}: " + "; ".join(problems))


def parse_space(data: Mapping[str, Any], source: str = "<space>",
                planner: Planner | None = None) -> SearchSpace:
    """Validate a space given as a dict (what ``load_space`` read from YAML)."""
    problems: list[str] = []
    if not need_keys(problems, dict(data), TOP_KEYS, ""):
        raise_if_any(problems, source)
    budget: Any = data.get("budget")
    depth: Any = data.get("depth", 1)
    name = data.get("name") or Path(source).stem
    budget_ok = need_int(problems, "budget", budget, 1, MAX_WIDTH)
    depth_ok = need_int(problems, "depth", depth, 1, MAX_DEPTH)
    sampler = data.get("sampler", "tpe")
    if sampler not in SAMPLERS:
        add(problems, "sampler", sampler, f"must be one of {', '.join(SAMPLERS)}")
    model: Any = data.get("model") or {}
    model = ({k: v for k, v in model.items() if k in MODEL_KEYS}
             if need_keys(problems, model, MODEL_KEYS, "model") else {})
    rules_data = data.get("layers")
    if budget_ok and depth_ok and uses_allocator(data):
        rules_data = resolve_allocator(problems, rules_data, budget, depth, planner)
    rules = _parse_rules(problems, rules_data, budget if budget_ok else 1,
                         depth if depth_ok else 0)
    train = _parse_train(problems, data.get("train") or {})
    source_data = parse_data(problems, data.get("data"), source)
    raise_if_any(problems, source)
    space = SearchSpace(str(name), str(data.get("description", "")), budget, depth, model,
                        tuple(rules), tuple(train), sampler, source,
                        {**data, "layers": rules_data}, source_data)
    _check_constructible(space)
    if SAMPLER_KINDS[sampler].enumerates:
        space.grid()  # raises if a range makes the space infinite
    return space


def parse_data(problems: list[str], value: Any, source: str) -> DataSpec | None:
    """``data: PATH`` or ``data: {path, format, dtype, vocab_size}``; a relative path is
    relative to the space file."""
    if value is None:
        return None
    if isinstance(value, str):
        value = {"path": value}
    if not need_keys(problems, value, DATA_KEYS, "data") or not isinstance(value.get("path"), str):
        if isinstance(value, dict):
            add(problems, "data.path", value.get("path"), "must be a file or folder path")
        return None
    path = Path(value["path"])
    if not path.is_absolute() and Path(source).exists():
        path = Path(source).parent / path
    try:
        return DataSpec(str(path), value.get("format"), value.get("dtype", "uint16"),
                        value.get("vocab_size")).resolved()
    except DataError as err:
        add(problems, "data", value, str(err).split(": ", 1)[-1])
        return None


def _parse_rules(problems: list[str], data: Any, budget: int, depth: int) -> list[LayerRule]:
    if not isinstance(data, list) or not data:
        add(problems, "layers", data, "must be a non-empty list of layer rules")
        return []
    rules: list[LayerRule] = []
    owner: dict[int, int] = {}
    for r, item in enumerate(data):
        where = f"layers[{r}]"
        if not need_keys(problems, item, RULE_KEYS, where):
            continue
        rule = _parse_rule(problems, where, item, budget, depth)
        if rule is None:
            continue
        for i in rule.indices:
            if i in owner:
                add(problems, f"{where}.layers", item.get("layers", "all"),
                          f"layer {i} is already covered by layers[{owner[i]}]")
            owner[i] = r
        rules.append(rule)
    missing = [i for i in range(depth) if i not in owner]
    if missing and not problems:
        add(problems, "layers", [r.indices for r in rules], f"no rule covers layers {missing}")
    return rules


def _parse_rule(problems: list[str], where: str, item: dict[str, Any], budget: int,
                depth: int) -> LayerRule | None:
    n = len(problems)
    indices = layer_indices(problems, f"{where}.layers", item.get("layers", "all"), depth)
    rule_budget = item.get("budget", budget)
    need_int(problems, f"{where}.budget", rule_budget, 1)
    attention = need_choices(problems, f"{where}.attention", item.get("attention", ["mhsa"]),
                              lambda v: v in ATTENTION_KINDS, f"must be from {ATTENTION_KINDS}")
    mlp = need_choices(problems, f"{where}.mlp_ratio", item.get("mlp_ratio", [0]),
                        lambda v: is_number(v) and v >= 0, "must be numbers >= 0 (0 = no MLP)")
    max_groups = _parse_groups(problems, f"{where}.groups", item.get("groups", {"max": 1}))
    heads: tuple[Any, ...] = ()
    value = item.get("heads")
    named = isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)
    sets = _parse_head_sets(problems, f"{where}.heads", item, budget) if named else ()
    if max_groups == 1 and not named:
        heads = need_choices(problems, f"{where}.heads", item.get("heads"),
                             lambda v: is_int(v) and v >= 1,
                             "must be head counts (integers >= 1)")
    elif "heads" in item and not named:
        add(problems, f"{where}.heads", item["heads"], "not used with groups.max > 1: the counts "
                  "are sampled to fill the layer budget")
    head_dim_data = item.get("head_dim", "derived")
    derived = (head_dim_data == "derived" and max_groups == 1) or bool(sets)
    head_dim = None if derived else need_choices(problems,
        f"{where}.head_dim", head_dim_data, lambda v: is_int(v) and v >= 1,
        "must be a list of integers >= 1" + ("" if max_groups > 1 else
                                              " or 'derived' (budget / heads)"))
    qk = _parse_qk(problems, f"{where}.qk_dim", item.get("qk_dim", "same"))
    kv_heads = _parse_kv_heads(problems, f"{where}.kv_heads", item.get("kv_heads"), attention)
    latent_dims, rope_dims = _parse_latent(problems, where, item, attention)
    role, eta = item.get("role", "process"), item.get("eta", 1.0)
    shared = item.get("shared", False)
    if not isinstance(shared, bool):
        add(problems, f"{where}.shared", shared, "must be true or false")
    if len(problems) > n:
        return None
    return LayerRule(indices, attention, tuple(float(m) for m in mlp), heads, head_dim, qk,
                     rule_budget, role, eta, item.get("freeze_mlp", False), shared, max_groups,
                     kv_heads, latent_dims, rope_dims, sets)


def _parse_head_sets(problems: list[str], key: str, item: dict[str, Any],
                     budget: int) -> tuple[tuple[HeadGroup, ...], ...]:
    """``heads: ["4x16", "2x32+4x8/16"]``: explicit head groups, one set per choice. A set
    fixes every group's dims, so ``head_dim``, ``qk_dim``, ``groups`` and ``kv_heads`` are
    refused beside it, and its width must fit the budget."""
    sets = []
    for text in item["heads"]:
        try:
            sets.append(parse_heads(text))
        except (ValueError, ConfigError) as err:
            add(problems, key, text, f"must be head groups like 2x64+4x16/64 ({err})")
    for other in ("head_dim", "qk_dim", "groups", "kv_heads"):
        if other in item:
            add(problems, f"{key.rsplit('.', 1)[0]}.{other}", item[other],
                "not used with explicit head groups (heads: [\"4x16\", ...] fixes them)")
    width = item.get("budget", budget)
    for heads in sets:
        if is_int(width) and sum(g.width for g in heads) > width:
            add(problems, key, heads_text(heads), f"width {sum(g.width for g in heads)} "
                f"exceeds the layer budget {width}")
    return tuple(dict.fromkeys(sets))


def _parse_latent(problems: list[str], where: str, item: dict[str, Any],
                  attention: tuple[Any, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A rule's latent widths (required with ``attention: latent``) and RoPE parts (default
    none); both refused by name without latent layers."""
    if not kinds_where(lambda t: t.latent, attention):
        for key in ("latent_dim", "rope_dim"):
            if key in item:
                add(problems, f"{where}.{key}", item[key], "only with attention latent")
        return (), (0,)
    dims = need_choices(problems, f"{where}.latent_dim", item.get("latent_dim"),
                        lambda v: is_int(v) and 1 <= v <= MAX_WIDTH,
                        f"must be latent widths (integers in 1..{MAX_WIDTH:,}): what a latent "
                        "layer caches per token")
    ropes = need_choices(problems, f"{where}.rope_dim", item.get("rope_dim", [0]),
                         lambda v: is_int(v) and v >= 0 and v % 2 == 0,
                         "must be even integers >= 0 (RoPE dims per key/value head)")
    return tuple(sorted(set(dims))), tuple(sorted(set(ropes)))


def _parse_kv_heads(problems: list[str], key: str, value: Any,
                    attention: tuple[Any, ...]) -> tuple[int, ...] | None:
    """The key/value head choices of a rule (None: one per query head, nothing sampled)."""
    if value is None:
        return None
    choices = need_choices(problems, key, value, lambda v: is_int(v) and v >= 1,
                            "must be key/value head counts per head group (integers >= 1)")
    single = [kind for kind in attention if not kind_traits(kind).grouped_kv]
    if choices and single:
        grouped = kinds_text(lambda t: t.grouped_kv)
        add(problems, key, value, f"grouped key/value heads are for {grouped} layers; "
                  f"attention also allows {', '.join(single)} (no separate keys and values)")
        return None
    return tuple(sorted(set(choices))) or None


def _parse_groups(problems: list[str], key: str, value: Any) -> int:
    if isinstance(value, dict) and set(value) == {"max"} and need_int(problems,
            f"{key}.max", value["max"], 1):
        return int(value["max"])
    if not (isinstance(value, dict) and set(value) == {"max"}):
        add(problems, key, value, "must be {max: G}, the most head groups a layer may have")
    return 1


def _parse_qk(problems: list[str], key: str, value: Any) -> QkRule:
    if value == "same":
        return QkRule()
    if value == "reduced":
        value = REDUCED
    if isinstance(value, dict) and set(value) <= {"min", "step"}:
        low, step = value.get("min", REDUCED["min"]), value.get("step", REDUCED["step"])
        if need_int(problems, f"{key}.min", low, 1) and need_int(problems, f"{key}.step", step, 1):
            return QkRule(True, low, step)
        return QkRule()
    add(problems, key, value, "must be 'same', 'reduced' or {min: 8, step: 8}")
    return QkRule()


def _parse_train(problems: list[str], data: Any) -> list[TrainParam]:
    if not need_keys(problems, data, TRAIN_KEYS, "train"):
        return []
    data = {"steps": 200, "eval_every": 20, **data}
    params = []
    for key in TRAIN_KEYS:
        if key not in data:
            continue
        value, where = data[key], f"train.{key}"
        if isinstance(value, list):
            if key in FIXED_TRAIN_KEYS or not value:
                add(problems, where, value, "must be one value" if value else "must not be empty")
                continue
            params.append(TrainParam(key, choices=tuple(value)))
        elif isinstance(value, dict):
            low: Any = value.get("low")
            high: Any = value.get("high")
            if (key in FIXED_TRAIN_KEYS or set(value) - {"low", "high", "log"}
                    or not (is_number(low) and is_number(high) and 0 < low <= high)):
                add(problems, where, value, "must be a value, a list of choices or "
                          "{low, high, log} with 0 < low <= high" +
                          (" (and fixed: the scheduler needs it)" if key in FIXED_TRAIN_KEYS
                           else ""))
                continue
            params.append(TrainParam(key, low=low, high=high, log=bool(value.get("log")),
                                     integer=is_int(low) and is_int(high)))
        else:
            if key in FIXED_TRAIN_KEYS and not need_int(problems, where, value, 1):
                continue
            params.append(TrainParam(key, value=value))
    for param in params:
        problems += _train_value_problems(param)
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
        problems += _latent_problems(space, rule, where)
        if problems:
            continue
        count = rule.heads[0] if rule.heads else 1
        probes = rule.head_sets or ((HeadGroup(count, rule.v_dims(count)[0]),),)
        # the rest is ArchConfig's own validation, on extremes (and on every explicit set)
        for kind, heads in ((k, h) for k in rule.attention for h in probes):
            for ratio in rule.mlp_ratio:
                latent = kind_traits(kind).latent  # at its widest latent and RoPE part
                sizes = (max(rule.latent_dim, default=0) * latent, max(rule.rope_dim) * latent)
                try:
                    layer = LayerSpec(kind, heads, ratio, rule.role, eta=rule.eta,
                                      latent_dim=sizes[0], rope_dim=sizes[1])
                    ArchConfig(d_model=space.budget, layers=(layer,),
                               **{**space.model, **PROBE_IO.fields(True)})
                except (ConfigError, TypeError) as err:
                    problems.append(f"{where} (attention {kind}, mlp_ratio {ratio:g}): {err}")
    if problems:
        raise SpaceError(f"{space.source}: " + "; ".join(problems))


def _latent_problems(space: SearchSpace, rule: LayerRule, where: str) -> list[str]:
    """A latent rule's RoPE parts must fit the narrowest head it samples, and need RoPE."""
    latent = kinds_where(lambda t: t.latent, rule.attention)
    if not latent or not any(rule.rope_dim):
        return []
    dims = rule.head_dim or tuple(d for count in rule.heads for d in rule.v_dims(count))
    narrowest = min(rule.qk.range(latent[0], d)[0] for d in dims)
    widest = max(rule.rope_dim)
    if space.model.get("positional") != "rope":
        return [f"{where}.rope_dim = {widest}: needs model positional: rope"]
    if widest > narrowest:
        return [f"{where}.rope_dim = {widest}: exceeds the narrowest qk_dim the rule samples "
                f"({narrowest})"]
    return []
