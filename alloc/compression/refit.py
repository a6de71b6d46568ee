"""The latent plan taught by measured students: ``fit_depth_scales`` and ``rescaled``.

A latent plan prices each layer's widths with a second-order estimate of the loss increase of
that layer's cut alone (docs/theory.md §10.6) and spends the KV budget where the summed estimate
is least. Measured students of SmolLM2-135M say the estimate is right in shape but wrong in its
depth: the later layers' cuts cost several times more than their estimate says, relative to the
early layers' (docs/results/student-search.md). So the held-out loss of a student with widths
``w`` is modelled as

    loss(w) = teacher_loss + sum_g  s_g * sum_{i in group g} estimate_i(w_i)

over ``groups`` contiguous groups of the planned layers (first, middle and last third by
default), and the scales ``s_g >= 0`` are fitted by non-negative least squares to the students a
search measured. ``rescaled`` multiplies each layer's priced widths by its group's scale, so
``plan_for_kv_cache`` then spends the budget where the measured cost is least.

A fit is only trusted where the depth model predicts a left-out student better than one scale
for every layer does (leave-one-out): with few students, or students that all spend the budget
alike (a search's first trials, drawn around the plan), the per-group scales chase noise, and a
plan made from them can lose a nat to the plan it came from (measured on SmolLM2-135M: a fit to
8 students gave the last third a scale of 0.6 and starved it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from alloc.compression.schema import CompressionPlan, LayerPlan

DEPTH_GROUPS = 3  # first, middle and last third of the planned layers
MIN_EXTRA = 2  # observations beyond one per scale before a fit is trusted


@dataclass(frozen=True)
class Observation:
    """A measured student: per planned layer the latent width it kept and the RoPE part the
    width was priced at, and its held-out loss."""

    widths: Mapping[int, int]  # layer index -> latent width
    ropes: Mapping[int, int]  # layer index -> RoPE part per key/value head (0: none)
    loss: float


@dataclass(frozen=True)
class DepthFit:
    """Per depth group the scale on the plan's loss estimates, the layers of each group, and
    how well the model explains the observations (R², on the loss above the teacher's)."""

    scales: tuple[float, ...]
    groups: tuple[tuple[int, ...], ...]
    r2: float
    observations: int
    loo_error: float  # root mean square error predicting each student left out
    loo_single: float  # the same for one scale on every layer (what the plan assumes)

    @property
    def trusted(self) -> bool:
        """Whether the depth model predicts left-out students better than one scale does."""
        return self.loo_error < self.loo_single

    def scale_of(self, layer: int) -> float:
        return next(s for s, g in zip(self.scales, self.groups) if layer in g)

    def to_dict(self) -> dict[str, object]:
        return {"scales": list(self.scales), "groups": [list(g) for g in self.groups],
                "r2": self.r2, "observations": self.observations, "loo_error": self.loo_error,
                "loo_single": self.loo_single}


def depth_groups(plan: CompressionPlan, groups: int = DEPTH_GROUPS) -> tuple[tuple[int, ...], ...]:
    """The planned latent layers' indices in ``groups`` contiguous parts, as equal as can be."""
    planned = [layer.index for layer in plan.layers if layer.latent_dim]
    parts = np.array_split(np.array(planned, dtype=int), min(groups, len(planned)))
    return tuple(tuple(int(i) for i in part) for part in parts if len(part))


def fit_depth_scales(plans: Mapping[int, CompressionPlan], observed: Sequence[Observation],
                     teacher_loss: float, groups: int = DEPTH_GROUPS) -> DepthFit | None:
    """The scales of each depth group's loss estimates that best explain ``observed`` (non-
    negative least squares); None with too few observations to fit them (one per scale and
    ``MIN_EXTRA`` more).

    ``plans``: the plans each width was priced in, by RoPE part (a ``latent`` form has one, at
    0); an observation whose width a plan did not price is left out.
    """
    from scipy.optimize import nnls

    base = plans[min(plans)]
    parts = depth_groups(base, groups)
    rows, targets = [], []
    for seen in observed:
        try:
            per_group = [sum(_estimate(plans, seen, i) for i in part) for part in parts]
        except KeyError:
            continue
        rows.append(per_group)
        targets.append(seen.loss - teacher_loss)
    if len(rows) < len(parts) + MIN_EXTRA:
        return None
    a, b = np.asarray(rows, dtype=float), np.asarray(targets, dtype=float)
    scales, _ = nnls(a, b)
    residual = float(((b - a @ scales) ** 2).sum())
    total = float(((b - b.mean()) ** 2).sum())
    return DepthFit(tuple(float(s) for s in scales), parts,
                    1.0 - residual / total if total > 0 else 0.0, len(rows),
                    _left_out_error(a, b), _left_out_error(a.sum(axis=1, keepdims=True), b))


def _left_out_error(a: np.ndarray, b: np.ndarray) -> float:
    """Root mean square error of predicting each row of ``b`` from the fit to the others."""
    from scipy.optimize import nnls

    errors = []
    for k in range(len(b)):
        keep = np.arange(len(b)) != k
        scales, _ = nnls(a[keep], b[keep])
        errors.append(float(a[k] @ scales - b[k]) ** 2)
    return float(np.sqrt(np.mean(errors)))


def _estimate(plans: Mapping[int, CompressionPlan], seen: Observation, layer: int) -> float:
    """The plan's loss estimate of ``layer`` cut to the observation's width (KeyError: not
    priced)."""
    losses = plans[seen.ropes.get(layer, 0)].layers[layer].latent_losses
    if losses is None:
        raise KeyError(layer)
    return float(losses[seen.widths[layer]])


def rescaled(plan: CompressionPlan, fit: DepthFit) -> CompressionPlan:
    """``plan`` with each planned layer's priced widths multiplied by its depth group's scale
    (the widths it keeps unchanged: ``plan_for_kv_cache`` chooses them again)."""
    layers: list[LayerPlan] = []
    for layer in plan.layers:
        if not layer.latent_dim or not layer.latent_losses:
            layers.append(layer)
            continue
        scale = fit.scale_of(layer.index)
        layers.append(dataclasses.replace(layer, latent_losses={
            w: scale * v for w, v in layer.latent_losses.items()}))
    return dataclasses.replace(plan, layers=tuple(layers))
