"""Planning a trained model's compression (docs/theory.md §10): from what its attention was
measured to use (a ``CheckpointMeasurement``), the smallest aligned ``qk_dim`` of every head
group whose attention error stays within a tolerance, by the saturation rule's bound
(``alloc.saturation``), the measured attention error or the sample's loss increase; the result
is a ``CompressionPlan``. Pure: numpy, no torch."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from alloc.compression.forms import Rule, candidate_dims, form_of, student_form
from alloc.compression.measurement import CheckpointMeasurement, HeadMeasurement, LayerMeasurement
from alloc.compression.schema import CompressionPlan, GroupPlan, HeadSpectrum, LayerPlan
from alloc.errors import CompressionError
from alloc.saturation import jacobian_bound
from arch import ArchConfig, HeadGroup
from common.errors import Problem

# Share of a head's spectrum (sum of singular values) that its effective rank may discard: a
# description of the spectrum, separate from the attention-error tolerance that sets the plan.
RANK_TAIL = 0.05


def effective_rank(sigma: Sequence[float], tolerance: float = RANK_TAIL) -> int:
    """Smallest r whose discarded singular values sum to at most ``tolerance`` of the total."""
    values = np.asarray(sigma, dtype=float)
    tail = np.concatenate([np.cumsum(values[::-1])[::-1], [0.0]])
    return int(np.argmax(tail <= tolerance * max(tail[0], 1e-300)))


def truncation_error_bound(sigma: Sequence[float], rank: int, seq_len: int, logit_bound: float,
                           norm: float) -> float:
    """Bound on the largest attention-weight change of a rank-``rank`` student of this head:
    ``||J|| * max |delta logit|`` with ``||J|| <= min(1/2, 2 e^{2R'} / N)``, ``R'`` bounding the
    teacher's and the student's logits, and ``|delta logit| <= norm^2 sum_{i>r} sigma_i``
    (docs/theory.md §4, §10)."""
    delta = norm * norm * float(np.sum(np.asarray(sigma, dtype=float)[rank:]))
    return jacobian_bound(seq_len, logit_bound + delta) * delta


def group_plan(heads: Sequence[HeadMeasurement], group: HeadGroup, seq_len: int,
               logit_bound: float, norm: float, tolerance: float, align: int,
               rule: Rule = "bound", loss_increases: Mapping[int, float] | None = None,
               value_losses: Mapping[int, float] | None = None) -> GroupPlan:
    """The smallest aligned ``qk_dim`` of the group whose error stays within ``tolerance`` for
    every head: the bound's (``rule="bound"``, docs/theory.md §4), the attention error measured
    on the data sample (``"measured"``), or the sample's loss increase (``"loss"``, the group
    alone cut); each candidate's bound and measured errors are kept. With ``"loss"`` and
    ``value_losses``, the smallest aligned ``v_dim`` within ``tolerance`` too (§10.4)."""
    candidates = candidate_dims(group.qk_dim, align)
    bounds = {r: max(truncation_error_bound(h.sigma, r, seq_len, logit_bound, norm)
                     for h in heads) for r in candidates}
    measured = None
    if all(h.measured_errors is not None for h in heads):
        measured = {r: max(h.measured_errors[r] for h in heads if h.measured_errors is not None)
                    for r in candidates}
    values = value_losses if rule == "loss" else None
    plan = GroupPlan(group.count, group.qk_dim, group.v_dim, group.qk_dim, bounds, measured,
                     loss_increases, group.kv_heads, group.v_dim if values else 0, values)
    decide = plan.errors(rule)
    chosen = next(r for r in candidates if decide[r] <= tolerance or r == group.qk_dim)
    v_dim = 0 if not values else next(v for v in sorted(values)
                                       if values[v] <= tolerance or v == group.v_dim)
    return dataclasses.replace(plan, reduced_qk_dim=chosen, reduced_v_dim=v_dim)


def plan_compression(measured: CheckpointMeasurement, tolerance: float,
                     rule: Rule | None = None, logit_bound: float | None = None
                     ) -> CompressionPlan:
    """The per-layer plan of a measured model (docs/theory.md §10).

    Args:
        measured: the model's spectra, norms and (with a sample) logit statistics and errors.
        tolerance: allowed attention error per head.
        rule: ``bound`` (the saturation rule's guarantee) or ``measured`` (the error measured
            on the sample; needs one); default: measured with a sample, else bound.
        logit_bound: assumed R without a sample (None: any logits, ``||J|| <= 1/2``).

    Raises:
        CompressionError: ``rule="measured"`` without a sample.
    """
    rule = rule or ("measured" if measured.measured else "bound")
    if rule == "measured" and not measured.measured:
        raise CompressionError.of([Problem("rule", rule, "needs a sample to measure the "
                                           "errors on ({task.data} or {task.name})")])
    form = student_form(measured.form)
    if rule == "loss" and not form.latent and not any(layer.loss_increases
                                                      for layer in measured.layers):
        raise CompressionError.of([Problem("rule", rule, "needs the loss of a token model "
                                           "on a sample ({task.data} or {task.name}), measured "
                                           "with the loss sensitivity")])
    if rule not in form.rules:
        raise CompressionError.of([Problem("rule", rule, f"a {form.name} student's widths are "
                                           "chosen by the rules " + ", ".join(form.rules))])
    layers = tuple(_layer_plan(measured, m, tolerance, rule, logit_bound)
                   for m in measured.layers)
    if form.latent:
        layers = tuple(_latent_layer_plan(layer, m.latent_losses, tolerance, measured.rope_dim)
                       for layer, m in zip(layers, measured.layers))
    return CompressionPlan(
        arch_id=measured.arch.arch_id, seq_len=measured.seq_len, tolerance=tolerance,
        align=measured.align, rule=rule, layers=layers,
        student=student_arch(measured.arch, layers), sample=measured.sample,
        checkpoint=measured.checkpoint, layout=measured.layout,
        latent_fit=measured.latent_fit if form.latent else "")


def _layer_plan(measured: CheckpointMeasurement, layer: LayerMeasurement, tolerance: float,
                rule: Rule, logit_bound: float | None) -> LayerPlan:
    spec = measured.arch.layers[layer.index]
    if layer.head_stats:
        r_bound = max(s.logit_bound for s in layer.head_stats)
    else:
        r_bound = logit_bound if logit_bound is not None else math.inf
    spectra = tuple(HeadSpectrum(h.group, h.head, h.sigma, effective_rank(h.sigma), h.pairs)
                    for h in layer.heads)
    groups: tuple[GroupPlan, ...] = ()
    if layer.heads:
        losses = layer.loss_increases or (None,) * len(spec.heads)
        values = layer.value_losses or (None,) * len(spec.heads)
        groups = tuple(group_plan([h for h in layer.heads if h.group == j], group,
                                  measured.seq_len, r_bound, layer.token_norm, tolerance,
                                  measured.align, rule, loss, value)
                       for j, (group, loss, value) in enumerate(zip(spec.heads, losses, values)))
    planned = rule == "loss" and (any(g.value_losses for g in groups)
                                  or bool(layer.latent_losses))
    return LayerPlan(layer.index, spec.attention, spec.heads_str, layer.token_norm, groups,
                     spectra, layer.head_stats, layer.input_scale if planned else ())


def _latent_layer_plan(layer: LayerPlan, losses: Mapping[int, float] | None,
                       tolerance: float, rope_dim: int) -> LayerPlan:
    """A layer of a latent plan: its groups keep their dims; a layer whose latent widths were
    measured (an mhsa layer) becomes latent at the smallest width whose loss increase stays
    within ``tolerance``; the others are kept whole."""
    groups = tuple(dataclasses.replace(g, reduced_qk_dim=g.qk_dim, reduced_v_dim=0)
                   for g in layer.groups)
    if not losses:
        return dataclasses.replace(layer, groups=groups, input_scale=())
    width = next(c for c in sorted(losses) if losses[c] <= tolerance or c == max(losses))
    return dataclasses.replace(layer, groups=groups, latent_dim=width, latent_losses=losses,
                               rope_dim=rope_dim)


def student_arch(teacher: ArchConfig, layers: Sequence[LayerPlan]) -> ArchConfig:
    """``teacher`` with each planned group's ``qk_dim`` and ``v_dim`` reduced, and each layer
    planned latent made a latent layer of its width, as its form makes it
    (``StudentForm.layer_spec``)."""
    specs = list(teacher.layers)
    for plan in layers:
        if plan.latent_dim:
            specs[plan.index] = form_of(True, plan.rope_dim).layer_spec(
                specs[plan.index], plan.latent_dim, teacher.positional, plan.rope_dim)
        elif plan.groups:
            heads = tuple(dataclasses.replace(old, qk_dim=g.reduced_qk_dim,
                                              v_dim=g.student_v_dim)
                          for old, g in zip(specs[plan.index].heads, plan.groups))
            specs[plan.index] = dataclasses.replace(specs[plan.index], heads=heads)
    return ArchConfig.from_dict({**teacher.to_dict(), "layers": [x.to_dict() for x in specs]})
