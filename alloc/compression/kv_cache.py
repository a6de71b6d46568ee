"""A plan under a KV cache fraction instead of a tolerance (docs/theory.md §10.3):
``plan_for_kv_cache`` chooses every head group's ``qk_dim`` again so that the student caches at
most a fraction of the teacher's key and value units per token, by dynamic programming over the
groups."""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable, Mapping, Sequence

from alloc.compression.forms import DEFAULT_FORM, Rule, StudentForm
from alloc.compression.planner import student_arch
from alloc.compression.schema import CompressionPlan
from alloc.errors import CompressionError
from arch import ArchConfig
from common.errors import Problem


def kv_cache_floor(teacher: ArchConfig, align: int, values: bool = False,
                   form: StudentForm = DEFAULT_FORM, rope_dim: int = 0) -> float:
    """The smallest KV cache a plan of ``form`` for ``teacher`` at ``align`` can reach, as a
    fraction of the teacher's: every layer as the form's smallest plan makes it
    (``StudentForm.smallest``; ``values``: the values are planned too, ``rope_dim``: a latent
    form's decoupled RoPE part per key/value head). It follows from the architecture alone, so
    a fraction below it is refused before measuring."""
    smallest = [form.smallest(teacher, layer, align, values, rope_dim) for layer in teacher.layers]
    return sum(x.kv_width for x in smallest) / teacher.kv_width


def check_kv_cache(teacher: ArchConfig, align: int, fraction: float, values: bool = False,
                   form: StudentForm = DEFAULT_FORM, rope_dim: int = 0) -> None:
    """Refuse a KV cache fraction (``kv_cache``) no plan of ``form`` for ``teacher`` at
    ``align`` can meet.

    Raises:
        CompressionError: ``fraction`` outside ``[kv_cache_floor, 1]``.
    """
    floor = kv_cache_floor(teacher, align, values, form, rope_dim)
    if not floor - 1e-12 <= fraction <= 1:
        raise CompressionError.of([_outside(fraction, floor, form.kept(values),
                                            f" ({{align}} {align})")])


def _outside(fraction: float, floor: float, kept: str, how: str = "") -> Problem:
    return Problem("kv_cache", f"{fraction:g}", f"must be in [{floor:.3g}, 1]: {kept}{how} "
                   f"take {floor:.3g} of the teacher's KV cache")


def plan_for_kv_cache(plan: CompressionPlan, fraction: float) -> CompressionPlan:
    """The plan's per-group ``qk_dim`` (and, where the values were measured, ``v_dim``) chosen
    again under a KV cache fraction instead of a tolerance: the student caches at most
    ``fraction`` of the teacher's key and value units per token, spent where the plan's rule
    says a cut costs most. With ``rule="loss"`` the sum of the loss increases of every key and
    value cut is minimised (each measured alone: additive to first order), otherwise the
    largest error (minimax, keys only); exactly, by dynamic programming over the choices
    (docs/theory.md §10.3).

    Raises:
        CompressionError: a fraction below what the smallest candidates take, or above 1.
    """
    if plan.form.latent:
        return _latent_for_kv_cache(plan, fraction)
    groups = [g for layer in plan.layers for g in layer.groups]
    if not groups:
        raise CompressionError.of([Problem("kv_cache", f"{fraction:g}", "the model has no "
                                           "query-key heads to cut (mssa and mixit layers "
                                           "only)")])
    # each choice: a group's keys, or its values where they were measured, with its candidates
    choices = [(g.key_heads, dict(g.errors(plan.rule))) for g in groups]
    valued = [g for g in groups if plan.rule == "loss" and g.value_losses]
    choices += [(g.key_heads, dict(g.value_losses or {})) for g in valued]
    # what no plan changes: the layers without query-key heads, and unmeasured values
    fixed = plan.student.kv_width - sum(g.key_heads * g.reduced_qk_dim for g in groups) - sum(
        g.key_heads * g.student_v_dim for g in valued)
    teacher_kv = fixed + sum(g.key_heads * g.qk_dim for g in groups) + sum(
        g.key_heads * g.v_dim for g in valued)
    allowed = _units(fraction, choices, fixed, teacher_kv, plan.form.kept(bool(valued)))
    chosen = _choose_within(choices, allowed, plan.rule)
    keys, values = iter(chosen[:len(groups)]), iter(chosen[len(groups):])
    layers = tuple(dataclasses.replace(layer, groups=tuple(
        dataclasses.replace(g, reduced_qk_dim=next(keys),
                            reduced_v_dim=next(values) if g in valued else g.reduced_v_dim)
        for g in layer.groups)) for layer in plan.layers)
    worst = max((g.errors(plan.rule)[g.reduced_qk_dim] for layer in layers
                 for g in layer.groups), default=0.0)
    student = student_arch(plan.student, layers)
    return dataclasses.replace(plan, layers=layers, student=student, tolerance=worst,
                               kv_cache=fraction)


def _latent_for_kv_cache(plan: CompressionPlan, fraction: float) -> CompressionPlan:
    """``plan_for_kv_cache`` of a latent plan: each latent layer's width chosen so that the
    summed loss increase is least and the student caches at most ``fraction`` of the
    teacher's units per token (the other layers are kept whole)."""
    latent = [layer for layer in plan.layers if layer.latent_dim]
    choices = [(1, dict(layer.latent_losses or {})) for layer in latent]
    # what no choice changes: the layers kept whole, and the latent layers' RoPE parts
    fixed = plan.student.kv_width - sum(layer.latent_dim for layer in latent)
    whole = plan.student.kv_width - sum(plan.student.layers[layer.index].kv_width
                                        for layer in latent)
    teacher_kv = whole + sum(layer.teacher_kv_units for layer in latent)
    allowed = _units(fraction, choices, fixed, teacher_kv, plan.form.kept(False))
    widths = dict(zip((layer.index for layer in latent),
                      _choose_within(choices, allowed, "loss")))
    layers = tuple(dataclasses.replace(layer, latent_dim=widths[layer.index])
                   if layer.index in widths else layer for layer in plan.layers)
    worst = max((layer.latent_loss or 0.0 for layer in layers), default=0.0)
    return dataclasses.replace(plan, layers=layers, student=student_arch(plan.student, layers),
                               tolerance=worst, kv_cache=fraction)


Choice = tuple[int, Mapping[int, float]]  # (cost of one unit, candidate -> its error)


def _units(fraction: float, choices: Sequence[Choice], fixed: int, teacher_kv: int,
           kept: str) -> int:
    """The units per token the ``choices`` may spend under ``fraction`` of the teacher's
    ``teacher_kv`` (``fixed`` of them no choice changes).

    Raises:
        CompressionError: ``fraction`` above 1, or below every choice at its smallest candidate.
    """
    floor = fixed + sum(cost * min(errors) for cost, errors in choices)
    allowed = math.floor(fraction * teacher_kv + 1e-9) - fixed
    if not 0 < fraction <= 1 or allowed + fixed < floor:
        raise CompressionError.of([_outside(fraction, floor / teacher_kv, kept)])
    return allowed


def _choose_within(choices: Sequence[Choice], allowed: int, rule: Rule) -> list[int]:
    """Per choice a candidate with ``sum cost * candidate <= allowed`` minimising the sum
    (rule ``loss``) or the maximum (otherwise; among those, the sum) of the errors."""
    errors = [{r: max(e, 0.0) for r, e in es.items()} for _, es in choices]
    costs = [cost for cost, _ in choices]
    if rule != "loss":  # the least achievable maximum first, then the least sum under it
        worst = _best_choices(costs, errors, allowed, combine=max)[0]
        errors = [{r: e for r, e in es.items() if e <= worst} for es in errors]
    return _best_choices(costs, errors, allowed, combine=operator.add)[1]


def _best_choices(costs: Sequence[int], errors: Sequence[Mapping[int, float]],
                  allowed: int, combine: Callable[[float, float], float]
                  ) -> tuple[float, list[int]]:
    """Dynamic programming over the choices: the least ``combine``-d error of candidates that
    fit ``allowed`` units, and the candidates."""
    best: dict[int, tuple[float, list[int]]] = {0: (0.0, [])}  # units used -> best so far
    for cost, candidates in zip(costs, errors):
        step: dict[int, tuple[float, list[int]]] = {}
        for used, (value, chosen) in best.items():
            for r, error in candidates.items():
                spent = used + cost * r
                total = combine(value, error)
                if spent <= allowed and (spent not in step or total < step[spent][0]):
                    step[spent] = (total, [*chosen, r])
        best = step
    # ties go to the plan that keeps more dims (a cut that costs nothing measurable is no gain)
    most = max(best, key=lambda spent: (-best[spent][0], spent))
    return best[most]


def plan_for_allocation(plans: Mapping[int, CompressionPlan], latent_dims: Sequence[int],
                        rope_dims: Sequence[int], kv_cache: float) -> CompressionPlan:
    """The latent plan whose layer ``i`` caches ``latent_dims[i]`` units beside a RoPE part of
    ``rope_dims[i]`` per key/value head: each layer taken from ``plans[rope_dims[i]]`` (the
    plans of one measurement at each RoPE part, every width priced: ``align`` 1), its width
    set (what a search's trial measures and ``studies export`` writes).

    Raises:
        CompressionError: a RoPE part with no plan, or a width that plan did not price.
    """
    first = plans[min(plans)]
    layers = []
    for layer in first.layers:
        if not layer.latent_dim:
            layers.append(layer)
            continue
        rope, width = rope_dims[layer.index], latent_dims[layer.index]
        if rope not in plans:
            raise CompressionError.of([Problem(f"rope_dims[{layer.index}]", rope,
                                               f"must be one of {sorted(plans)}")])
        chosen = plans[rope].layers[layer.index]
        if width not in (chosen.latent_losses or {}):
            raise CompressionError.of([Problem(f"latent_dims[{layer.index}]", width,
                                               "is not a width its plan priced")])
        layers.append(dataclasses.replace(chosen, latent_dim=width))
    worst = max((layer.latent_loss or 0.0 for layer in layers), default=0.0)
    return dataclasses.replace(first, layers=tuple(layers),
                               student=student_arch(first.student, layers), tolerance=worst,
                               kv_cache=kv_cache)


def aligned(plan: CompressionPlan, align: int) -> CompressionPlan:
    """``plan`` with each latent layer's priced widths kept at multiples of ``align`` (and its
    full rank): the candidates a plan at ``align`` chooses from."""
    layers = []
    for layer in plan.layers:
        losses = layer.latent_losses
        if not layer.latent_dim or not losses:
            layers.append(layer)
            continue
        kept = {c: v for c, v in losses.items() if c % align == 0 or c == max(losses)}
        width = layer.latent_dim if layer.latent_dim in kept else max(kept)
        layers.append(dataclasses.replace(layer, latent_losses=kept, latent_dim=width))
    return dataclasses.replace(plan, layers=tuple(layers), align=align,
                               student=student_arch(plan.student, layers))
