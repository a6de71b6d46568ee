"""A plan under a KV cache budget instead of a tolerance (docs/theory.md §10.3):
``plan_for_kv_cache`` chooses every head group's ``qk_dim`` again so that the student caches at
most a fraction of the teacher's key and value units per token, by dynamic programming over the
groups."""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable, Mapping, Sequence

from alloc.compression.planner import candidate_dims, student_arch
from alloc.compression.schema import CompressionPlan, GroupPlan, Rule
from alloc.errors import CompressionError
from arch import ArchConfig
from arch.names import SINGLE_WIDTH_KINDS


def kv_cache_floor(teacher: ArchConfig, align: int) -> float:
    """The smallest KV cache a plan of ``teacher`` at ``align`` can reach, as a fraction of the
    teacher's: the values and every query-key group at its smallest candidate ``qk_dim``. It
    follows from the architecture alone, so a budget below it is refused before measuring."""
    cut = sum(g.kv_heads * (g.qk_dim - candidate_dims(g.qk_dim, align)[0])
              for layer in teacher.layers if layer.attention not in SINGLE_WIDTH_KINDS
              for g in layer.heads)
    return (teacher.kv_width - cut) / teacher.kv_width


def check_kv_cache(teacher: ArchConfig, align: int, fraction: float) -> None:
    """Refuse a ``--kv-cache`` budget no plan of ``teacher`` at ``align`` can meet.

    Raises:
        CompressionError: ``fraction`` outside ``[kv_cache_floor, 1]``.
    """
    floor = kv_cache_floor(teacher, align)
    if not floor - 1e-12 <= fraction <= 1:
        raise CompressionError(f"--kv-cache {fraction:g}: must be in [{floor:.3g}, 1]: the "
                               f"values and the smallest candidate keys (--align {align}) take "
                               f"{floor:.3g} of the teacher's KV cache")


def plan_for_kv_cache(plan: CompressionPlan, fraction: float) -> CompressionPlan:
    """The plan's per-group ``qk_dim`` chosen again under a KV cache budget instead of a
    tolerance: the student caches at most ``fraction`` of the teacher's key and value units per
    token, spent where the plan's rule says a cut costs most. With ``rule="loss"`` the sum of
    the groups' loss increases is minimised (each group measured alone: additive to first
    order), otherwise the largest error (minimax); exactly, by dynamic programming over the
    groups (docs/theory.md §10.3).

    Raises:
        CompressionError: a fraction below what the values alone take with the smallest
            candidate keys, or above 1.
    """
    groups = [g for layer in plan.layers for g in layer.groups]
    if not groups:
        raise CompressionError(f"--kv-cache {fraction:g}: the model has no query-key heads to "
                               "cut (mssa and mixit layers only)")
    # what no plan changes: the values, and the layers without query-key heads
    fixed = plan.student.kv_width - sum(g.key_heads * g.reduced_qk_dim for g in groups)
    teacher_kv = fixed + sum(g.key_heads * g.qk_dim for g in groups)
    floor = fixed + sum(g.key_heads * min(g.error_bounds) for g in groups)
    budget = math.floor(fraction * teacher_kv + 1e-9) - fixed
    if not 0 < fraction <= 1 or budget + fixed < floor:
        raise CompressionError(f"--kv-cache {fraction:g}: must be in [{floor / teacher_kv:.3g}, "
                               "1]: the values and the smallest candidate keys take "
                               f"{floor / teacher_kv:.3g} of the teacher's KV cache")
    chosen = _budget_choice(groups, budget, plan.rule)
    it = iter(chosen)
    layers = tuple(dataclasses.replace(layer, groups=tuple(
        dataclasses.replace(g, reduced_qk_dim=next(it)) for g in layer.groups))
        for layer in plan.layers)
    worst = max((g.errors(plan.rule)[g.reduced_qk_dim] for layer in layers
                 for g in layer.groups), default=0.0)
    student = student_arch(plan.student, layers)
    return dataclasses.replace(plan, layers=layers, student=student, tolerance=worst,
                               kv_cache=fraction)


def _budget_choice(groups: Sequence[GroupPlan], budget: int, rule: Rule) -> list[int]:
    """Per group a candidate ``qk_dim`` with ``sum key_heads * qk_dim <= budget`` minimising the
    sum (rule ``loss``) or the maximum (otherwise; among those, the sum) of the groups'
    errors."""
    errors = [{r: max(e, 0.0) for r, e in g.errors(rule).items()} for g in groups]
    if rule != "loss":  # the least achievable maximum first, then the least sum under it
        worst = _best_choices(groups, errors, budget, combine=max)[0]
        errors = [{r: e for r, e in es.items() if e <= worst} for es in errors]
    return _best_choices(groups, errors, budget, combine=operator.add)[1]


def _best_choices(groups: Sequence[GroupPlan], errors: Sequence[Mapping[int, float]],
                  budget: int, combine: Callable[[float, float], float]
                  ) -> tuple[float, list[int]]:
    """Dynamic programming over the groups: the least ``combine``-d error of choices that fit
    ``budget`` key units, and the choices."""
    best: dict[int, tuple[float, list[int]]] = {0: (0.0, [])}  # key units used -> best so far
    for g, candidates in zip(groups, errors):
        step: dict[int, tuple[float, list[int]]] = {}
        for used, (value, choices) in best.items():
            for r, error in candidates.items():
                spent = used + g.key_heads * r
                total = combine(value, error)
                if spent <= budget and (spent not in step or total < step[spent][0]):
                    step[spent] = (total, [*choices, r])
        best = step
    # ties go to the plan that keeps more dims (a cut that costs nothing measurable is no gain)
    most = max(best, key=lambda spent: (-best[spent][0], spent))
    return best[most]

