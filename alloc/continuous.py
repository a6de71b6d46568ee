"""The continuous relaxation of the early-layer allocation, solved through its KKT conditions.

Relax ``H_m >= 1`` and ``align <= d_m <= d_max`` to reals and price width at ``lam`` per unit.
Each group then answers independently (the Lagrangian separates):

* for fixed ``H`` the error is concave in ``d`` (the compression term
  ``sqrt(d_in (1 - (d/d_in)^k))`` is, for every order k), so ``d`` sits at a corner, ``align``
  or ``d_max`` (with a measured input spectrum, or a width order ``m > 0`` whose
  ``(d/d_in)^-m`` is convex in ``d``, it need not be, and ``d`` is searched over the aligned
  dims);
* for fixed ``d`` it is convex in ``H``; stationarity ``n w K_d H^{-(n+1)} = lam d`` with
  ``K_d = K (d/d_in)^-m`` gives the trade-off law ``H* = (n w K_d / (lam d))^{1/(n+1)}``: heads
  grow like
  ``(|rho_m| e^{alpha (n+1) s_m})^{1/(n+1)}``: with the weight of an offset, and exponentially
  with its distance;
* or the group is skipped (truncation).

The budget multiplier ``lam*`` is the root of ``width(lam) = D`` (bisection on ``log lam``;
``width`` is non-increasing). Where a group switches answers at ``lam*`` the width jumps, and the
convexified optimum mixes the two answers with shares summing to one. The objective is the
Lagrangian dual value, a lower bound of the integer optimum (weak duality).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from alloc.extract import ExtractProblem


@dataclass(frozen=True)
class ContinuousGroup:
    """Real-valued answer of one group; ``share`` < 1 only for a group mixed at ``lam*``."""

    offset: int
    count: float
    dim: float
    share: float = 1.0

    @property
    def width(self) -> float:
        return self.share * self.count * self.dim


@dataclass(frozen=True)
class ContinuousAllocation:
    """Continuous optimum: per-group reals, the multiplier, and the dual objective."""

    objective: float  # dual value: a lower bound of the integer optimum
    primal: float  # error of the (mixed) groups; equals objective up to bisection tolerance
    multiplier: float
    groups: tuple[ContinuousGroup, ...]

    @property
    def width(self) -> float:
        return sum(g.width for g in self.groups)


@dataclass(frozen=True)
class _Responses:
    """Every group's best answer at one price: count and dim (0 when skipped), error, width."""

    count: np.ndarray
    dim: np.ndarray
    error: np.ndarray

    @property
    def width(self) -> np.ndarray:
        return self.count * self.dim


def group_error(problem: ExtractProblem, count: np.ndarray, dim: np.ndarray) -> np.ndarray:
    """Per-group error for real ``count``/``dim`` (broadcast against the groups' axis, the
    last); ``count == 0`` means skipped."""
    m, w = problem.model, problem.weights
    safe = np.where(count > 0, count, 1.0)
    inside = w * (m.compression(dim) + m.extraction(problem.offsets, safe, dim))
    return np.where(count > 0, inside, w * m.bound)


def corner_dims(problem: ExtractProblem) -> tuple[float, ...]:
    """The candidate head dimensions of the relaxation: ``align`` and ``d_max`` (the error is
    concave in ``d`` for isotropic tokens and ``m = 0``); every aligned one for a measured input
    spectrum or a width order ``m > 0``, where it need not be (the relaxation then keeps ``d``
    on the aligned grid)."""
    if problem.model.input_variance is not None or problem.model.width_order > 0:
        return tuple(float(d) for d in problem.dims)
    return float(problem.dims[0]), float(problem.dims[-1])


def stationary_count(problem: ExtractProblem, lam: float, dim: np.ndarray | float) -> np.ndarray:
    """``H*(lam, d) = max(1, (n w K_d / (lam d))^{1/(n+1)})`` per group: (groups,) for one
    ``dim``, (dims, groups) for a column of dims (dims, 1)."""
    m = problem.model
    wk = problem.weights * m.head_constant(problem.offsets) * m.width_factor(dim)
    return np.maximum(1.0, (m.order * wk / (lam * np.asarray(dim, float))) ** (1.0 / (m.order
                                                                                      + 1.0)))


def best_responses(problem: ExtractProblem, lam: float) -> _Responses:
    """Each group's minimiser of ``error + lam * width`` over skip and the corner dims (every
    corner at once: with a width order all aligned dims up to the budget are corners)."""
    n = len(problem.offsets)
    corners = np.array(corner_dims(problem))[:, None]  # (dims, 1)
    stationary = stationary_count(problem, lam, corners)  # (dims, groups)
    count = np.vstack([np.zeros(n), stationary])  # row 0: skip
    dim = np.vstack([np.zeros(n), np.broadcast_to(corners, stationary.shape)])
    error = np.vstack([problem.weights * problem.model.bound,
                       group_error(problem, stationary, corners)])
    pick = np.argmin(error + lam * count * dim, axis=0)  # ties: skip, then the small corner
    cols = np.arange(n)
    return _Responses(count[pick, cols], dim[pick, cols], error[pick, cols])


def dual_value(problem: ExtractProblem, lam: float) -> float:
    """Lagrangian dual ``sum_m min(error + lam width) - lam D``: a lower bound for every lam."""
    r = best_responses(problem, lam)
    return float((r.error + lam * r.width).sum() - lam * problem.budget)


def solve_continuous(problem: ExtractProblem, iterations: int = 200) -> ContinuousAllocation:
    """Root of ``width(lam) = D`` by bisection on ``log lam``, then the primal mix at the root."""
    budget = problem.budget
    lo, hi = 1e-12, 1.0
    if best_responses(problem, lo).width.sum() <= budget:  # budget never binds: lam* = 0
        only = best_responses(problem, lo)
        return _assemble(problem, (lo, lo), only, only, 0.0)
    while best_responses(problem, hi).width.sum() > budget:
        hi *= 10.0
    for _ in range(iterations):
        mid = math.sqrt(lo * hi)
        if best_responses(problem, mid).width.sum() > budget:
            lo = mid
        else:
            hi = mid
    wide, narrow = best_responses(problem, lo), best_responses(problem, hi)
    w_wide, w_narrow = wide.width.sum(), narrow.width.sum()
    # Share of the wide answer that spends the budget exactly (convex hull at the jump).
    theta = 0.0 if w_wide <= w_narrow else (budget - w_narrow) / (w_wide - w_narrow)
    return _assemble(problem, (lo, hi), wide, narrow, float(np.clip(theta, 0.0, 1.0)))


def _assemble(problem: ExtractProblem, lams: tuple[float, float], wide: _Responses,
              narrow: _Responses, theta: float) -> ContinuousAllocation:
    """Groups from the narrow answers, with the ones that differ at the root mixed in."""
    groups = []
    primal = 0.0
    for i, s in enumerate(problem.offsets.tolist()):
        answers = [(narrow, 1.0)]
        if not np.isclose(wide.width[i], narrow.width[i], rtol=1e-6):
            answers = [(wide, theta), (narrow, 1.0 - theta)]
        for r, share in answers:
            primal += share * float(r.error[i])
            if r.count[i] > 0 and share > 0:
                groups.append(ContinuousGroup(s, float(r.count[i]), float(r.dim[i]), share))
    # Every multiplier gives a lower bound; the two ends of the bracket are the tightest.
    objective = max(dual_value(problem, lam) for lam in lams)
    return ContinuousAllocation(objective, primal, lams[1], tuple(groups))
