"""The fixed head-count rules practitioners use, the baselines a plan is judged against: one
registry keyed by name (``HEURISTICS``), each a rule from the width ``D`` to the number of heads
of every layer, each head ``D / heads`` wide (queries, keys and values), so that every rule has
the same attention parameters at one width.

* ``head-dim-64``: heads of 64 (``D / 64`` heads; one head of ``D`` below 64), as GPT-2, BERT and
  Llama do (the allocator's own baseline, ``alloc.plan.baseline_head``).
* ``head-dim-32``: one head per 32 dimensions.
* ``uniform-1`` ... ``uniform-8``: the same head count in every layer, whatever the width.

A plan is calibrated against these rules (``rule_archs``: the plan and every rule at its shape)
and its later layers' rule checked against its ``twin_arch`` (its first layer in every layer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from alloc.errors import PlanError
from alloc.plan import BASELINE_HEAD_DIM
from arch import ArchConfig, HeadGroup


@dataclass(frozen=True)
class Heuristic:
    """A fixed rule: ``heads(width)`` heads of ``width / heads`` in every layer."""

    name: str
    rule: str  # the rule in words
    heads: Callable[[int], int]


def _head_dim(dim: int) -> Callable[[int], int]:
    return lambda width: max(1, width // dim)


def _uniform(count: int) -> Callable[[int], int]:
    return lambda width: count


HEURISTICS: dict[str, Heuristic] = {h.name: h for h in (
    Heuristic("head-dim-64", f"heads of {BASELINE_HEAD_DIM} (D / {BASELINE_HEAD_DIM} heads)",
              _head_dim(BASELINE_HEAD_DIM)),
    Heuristic("head-dim-32", "one head per 32 dimensions (D / 32 heads)", _head_dim(32)),
    *(Heuristic(f"uniform-{k}", f"{k} head{'s' if k > 1 else ''} in every layer", _uniform(k))
      for k in (1, 2, 4, 8)),
)}


def heuristic(name: str) -> Heuristic:
    """The registered rule ``name``.

    Raises:
        PlanError: no such rule (the line lists the registered names).
    """
    if name not in HEURISTICS:
        raise PlanError(f"heuristic {name!r}: not a registered rule; choose from "
                        f"{', '.join(HEURISTICS)}")
    return HEURISTICS[name]


def heuristic_arch(template: ArchConfig, name: str) -> ArchConfig:
    """``template`` (e.g. a plan's architecture) with every layer's heads replaced by rule
    ``name``'s, all else (attention kind, MLP, role, the model's global fields) kept.

    Raises:
        PlanError: the rule's head count does not divide the width.
    """
    width = template.d_model
    count = heuristic(name).heads(width)
    if width % count:
        raise PlanError(f"heuristic {name!r}: {count} heads do not divide the width {width}")
    group = HeadGroup(count, width // count)
    return dataclasses.replace(template, layers=tuple(
        dataclasses.replace(layer, heads=(group,)) for layer in template.layers))


PLAN = "plan"  # the label of the plan among the rules (``rule_archs``)


def rule_archs(plan: ArchConfig) -> dict[str, ArchConfig]:
    """``plan`` and every fixed rule at its width, depth and MLP, by label (``PLAN`` first,
    then each rule's name): what a calibration trains.

    Raises:
        PlanError: a rule's head count does not divide the width.
    """
    return {PLAN: plan, **{name: heuristic_arch(plan, name) for name in HEURISTICS}}


def twin_arch(plan: ArchConfig) -> ArchConfig:
    """``plan`` with its first layer's heads in every layer, all else kept: the plan without
    what the later layers' rule (docs/theory.md §4, §4.1) chose."""
    first = plan.layers[0].heads
    return dataclasses.replace(plan, layers=tuple(dataclasses.replace(layer, heads=first)
                                                  for layer in plan.layers))
