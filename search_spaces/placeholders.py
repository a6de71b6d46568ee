"""``allocator`` in a space: a rule whose ``head_dim`` or ``budget`` is ``allocator`` takes the
allocator's plan for the space's budget and depth, as a neighbourhood of its head dims (their
halves and doubles that fit)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from arch.checks import add, is_int
from search_spaces.rules import neighbourhood
from search_spaces.schema import ALLOCATOR, Planner, layer_indices


def uses_allocator(data: Mapping[str, Any]) -> bool:
    """Whether a space's rules take values from the allocator's plan."""
    rules = data.get("layers")
    return isinstance(rules, list) and any(
        isinstance(r, dict) and ALLOCATOR in (r.get("head_dim"), r.get("budget")) for r in rules)


def resolve_allocator(problems: list[str], rules: Any, budget: int, depth: int,
                       planner: Planner | None) -> Any:
    """``rules`` with ``allocator`` placeholders replaced by the plan's widths and dims."""
    if planner is None:
        add(problems, "layers", ALLOCATOR, "this space takes head dims or budgets from the "
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
        indices = layer_indices(problems, f"{where}.layers", item.get("layers", "all"), depth)
        layers = [plan.layers[i] for i in indices]
        widths = {layer.width for layer in layers}
        if len(widths) != 1:
            add(problems, f"{where}.budget", ALLOCATOR, f"the plan's widths differ over its layers "
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
