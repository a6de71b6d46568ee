"""Early layers: split a width budget between heads and head dimension (docs/theory.md §2-§3).

The layer extracts offsets ``s`` of the kernel ``rho``; group ``m`` gives ``H_m`` heads of dimension
``d_m`` to offset ``s_m`` (``sum H_m d_m <= D``, ``d_m`` a multiple of ``align``, ``<= d_in``), or
skips it. The error bound, per group, in units of token norm::

    |rho_m| * (c_proj * sqrt(d_in) * sqrt(1 - min(d_m/d_in, 1)^k)   # compression
               + c_head * B * exp(alpha*(n+1)*s_m) * H_m^-n)          # position extraction
    B * |rho_m|                                                     # if skipped (truncation)

where ``k`` is the order of the products of extracted tokens the layer's output feeds: 1 for an
attention-only layer (the compression term is then ``c_proj * sqrt(max(d_in - d_m, 0))``), 2
when an MLP follows (§2.1).

``solve_exact`` is the integer optimum (min-plus DP over groups and budget), ``solve_uniform`` the
best layer of equal heads, ``solve_brute_force`` the enumeration the tests compare them with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class ErrorModel:
    """Constants of the bound; ``norm_bound`` (B) defaults to ``sqrt(input_dim)``;
    ``product_order`` is k of the compression term (1: linear read-out of the extracted
    tokens; 2: an MLP forms their products)."""

    input_dim: int
    c_proj: float = 1.0
    c_head: float = 1.0
    order: float = 2.0
    alpha: float = 0.01
    norm_bound: float | None = None
    product_order: int = 1
    # The measured covariance eigenvalues of the tokens (decreasing; §9.2); None: isotropic.
    input_variance: tuple[float, ...] | None = None

    @property
    def bound(self) -> float:
        return math.sqrt(self.input_dim) if self.norm_bound is None else self.norm_bound

    @cached_property
    def _kept(self) -> np.ndarray:
        """Share of the input's variance in its first ``i`` principal directions, i = 0..d."""
        assert self.input_variance is not None
        variance = np.clip(np.asarray(self.input_variance, dtype=np.float64), 0, None)
        return np.r_[0.0, np.cumsum(variance) / max(variance.sum(), 1e-300)]

    def kept_share(self, dim: np.ndarray | float) -> np.ndarray:
        """Share of a token's variance a ``dim``-dimensional head keeps: ``dim / d_in`` for
        isotropic tokens, the top ``dim`` principal directions' share of a measured spectrum."""
        d = np.asarray(dim, float)
        if self.input_variance is None:
            return np.minimum(d / self.input_dim, 1.0)
        return np.interp(d, np.arange(len(self._kept)), self._kept)

    def compression(self, dim: np.ndarray | float) -> np.ndarray:
        """Residual of a ``dim``-dimensional projection of a token, per unit weight: of the token
        itself (k = 1: ``sqrt(d_in - dim)`` for isotropic tokens), or of its k-fold product (its
        share of the product's norm, times ``B``: ``sqrt(d_in^k - dim^k) / d_in^((k-1)/2)``)."""
        kept = np.clip(self.kept_share(dim), 0.0, 1.0)  # a cumulative share may round past 1
        return self.c_proj * np.sqrt(self.input_dim * (1.0 - kept ** self.product_order))

    def head_constant(self, offset: np.ndarray | int) -> np.ndarray:
        """``K(s) = c_head * B * exp(alpha (n+1) s)``: extraction error of one head at offset s."""
        s = np.asarray(offset, float)
        return self.c_head * self.bound * np.exp(self.alpha * (self.order + 1) * s)

    def extraction(self, offset: np.ndarray | int, count: np.ndarray | float) -> np.ndarray:
        """Error of ``count`` heads approximating a delta at ``offset``, per unit weight."""
        return self.head_constant(offset) * np.asarray(count, float) ** -self.order


@dataclass(frozen=True)
class GroupChoice:
    """``count`` heads of dimension ``dim`` extract offset ``offset``."""

    offset: int
    count: int
    dim: int


@dataclass(frozen=True)
class Allocation:
    """A feasible allocation and its error bound, split into the three terms."""

    objective: float
    compression: float
    extraction: float
    truncation: float
    groups: tuple[GroupChoice, ...]

    @property
    def width(self) -> int:
        return sum(g.count * g.dim for g in self.groups)

    @property
    def heads(self) -> int:
        return sum(g.count for g in self.groups)


@dataclass(frozen=True, eq=False)
class ExtractProblem:
    """One instance: kernel values ``rho[s-1]`` for offsets ``s = 1..len(rho)``, budget, align."""

    rho: np.ndarray
    budget: int
    align: int
    model: ErrorModel

    @cached_property
    def offsets(self) -> np.ndarray:
        """Offsets with non-zero weight, most informative first (ties: nearer first)."""
        weights = np.abs(self.rho)
        nonzero = np.flatnonzero(weights > 0)
        order = np.lexsort((nonzero, -weights[nonzero]))
        return nonzero[order] + 1

    @property
    def weights(self) -> np.ndarray:
        return np.abs(self.rho[self.offsets - 1])

    @cached_property
    def dims(self) -> np.ndarray:
        """Allowed head dimensions: multiples of ``align`` up to ``min(d_in, budget)``."""
        top = min(self.model.input_dim, self.budget)
        return np.arange(self.align, top + 1, self.align)

    def evaluate(self, groups: tuple[GroupChoice, ...] | list[GroupChoice]) -> Allocation:
        """Error bound of an allocation; offsets without a group are truncated."""
        chosen = {g.offset: g for g in groups}
        comp = extr = trunc = 0.0
        for s, w in zip(self.offsets.tolist(), self.weights.tolist()):
            g = chosen.get(s)
            if g is None:
                trunc += w * self.model.bound
            else:
                comp += w * float(self.model.compression(g.dim))
                extr += w * float(self.model.extraction(s, g.count))
        ordered = tuple(sorted(groups, key=lambda g: g.offset))
        return Allocation(comp + extr + trunc, comp, extr, trunc, ordered)


def _pairs(problem: ExtractProblem, dims: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All ``(count, dim)`` with ``count * dim <= budget``, sorted by width."""
    counts = [np.arange(1, problem.budget // d + 1) for d in dims.tolist()]
    count = np.concatenate(counts)
    dim = np.concatenate([np.full(len(c), d) for c, d in zip(counts, dims.tolist())])
    order = np.argsort(count * dim, kind="stable")
    return count[order], dim[order]


def _group_frontiers(problem: ExtractProblem, count: np.ndarray, dim: np.ndarray
                     ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per group, the widths where its best cost strictly drops (in align units).

    Returns, per group, ``(width_units, cost, pair_index)``; index ``-1`` at width 0 = skip.
    Only these breakpoints matter in the DP: between two of them the cost is flat while the
    remaining budget of the other groups only shrinks.
    """
    units = (count * dim) // problem.align
    m = problem.model
    # (M, P) cost of every pair for every group.
    cost = problem.weights[:, None] * (m.compression(dim)[None, :]
                                       + m.head_constant(problem.offsets)[:, None]
                                       * count[None, :] ** -m.order)
    skip = problem.weights * m.bound
    best = np.minimum.accumulate(cost, axis=1)  # best cost using any pair up to each width
    drop = np.ones_like(best, dtype=bool)
    drop[:, 1:] = best[:, 1:] < best[:, :-1]
    drop &= best < skip[:, None]
    frontiers = []
    for g in range(len(problem.offsets)):
        drops = np.flatnonzero(drop[g])
        # Several drops at one width: keep the last, cheapest one.
        drops = drops[np.diff(units[drops], append=-1) != 0]
        frontiers.append((np.r_[0, units[drops]], np.r_[skip[g], cost[g][drops]],
                          np.r_[-1, drops]))
    return frontiers


def _solve_dp(problem: ExtractProblem, dims: np.ndarray) -> Allocation:
    """Min-plus DP: ``F_m(b) = min_k F_{m-1}(b - u_k) + c_k`` over each group's breakpoints."""
    count, dim = _pairs(problem, dims)
    frontiers = _group_frontiers(problem, count, dim)
    top = problem.budget // problem.align
    budget = np.arange(top + 1)
    best = np.zeros(top + 1)  # best error of the groups so far with width <= b
    choices = []
    for units, cost, _ in frontiers:
        if len(units) == 1:  # no pair beats skipping this offset
            best = best + cost[0]
            choices.append(np.zeros(top + 1, dtype=np.intp))
            continue
        padded = np.concatenate([np.full(top + 1, np.inf), best])
        # (K, top+1): error if this group takes breakpoint k and the rest get b - u_k.
        cand = padded[(top + 1) + budget[None, :] - units[:, None]] + cost[:, None]
        pick = np.argmin(cand, axis=0)
        best = cand[pick, budget]
        choices.append(pick)
    groups = []
    b = top
    for g in reversed(range(len(frontiers))):
        units, _, pair = frontiers[g]
        k = choices[g][b]
        if pair[k] >= 0:
            groups.append(GroupChoice(int(problem.offsets[g]), int(count[pair[k]]),
                                      int(dim[pair[k]])))
        b -= units[k]
    return problem.evaluate(groups)


def solve_with_dims(problem: ExtractProblem, dims: list[int]) -> Allocation:
    """Best use of the budget by heads whose dimensions come from ``dims`` (multiples of align)."""
    return _solve_dp(problem, np.array(sorted(set(dims))))


def solve_exact(problem: ExtractProblem) -> Allocation:
    """Integer optimum over groups, head counts and aligned head dimensions."""
    return _solve_dp(problem, problem.dims)


@dataclass(frozen=True)
class UniformAllocation:
    """A layer of ``count`` equal heads of dimension ``dim`` (``count * dim = budget``)."""

    count: int
    dim: int
    allocation: Allocation  # how the heads are best distributed over offsets

    @property
    def objective(self) -> float:
        return self.allocation.objective


def _uniform_lower_bound(problem: ExtractProblem, dim: int) -> float:
    """Error of the uniform layer if every offset could have all ``budget/dim`` heads."""
    m, w = problem.model, problem.weights
    heads = problem.budget // dim
    inside = w * (m.compression(dim) + m.extraction(problem.offsets, heads))
    return float(np.minimum(w * m.bound, inside).sum())


def uniform_options(problem: ExtractProblem, prune: bool = False) -> list[UniformAllocation]:
    """For every aligned divisor ``d`` of the budget (fewest heads first), the best spread of
    ``budget/d`` heads.

    With ``prune``, divisors whose lower bound cannot beat the best found so far are left out
    (exact for the minimum, and what keeps ``D = 8192`` fast: small dims lose on compression).
    """
    options: list[UniformAllocation] = []
    for d in problem.dims[::-1].tolist():  # large dims first: usually the best, so prune early
        if problem.budget % d:
            continue
        if prune and options and _uniform_lower_bound(problem, d) >= min(
                o.objective for o in options):
            continue
        options.append(UniformAllocation(problem.budget // d, d, _solve_dp(problem, np.array([d]))))
    return options  # fewest heads first


def solve_uniform(problem: ExtractProblem) -> UniformAllocation:
    """Best uniform layer (ties: fewer heads)."""
    options = uniform_options(problem, prune=True)
    if not options:
        raise ValueError(f"no aligned head dimension divides the budget {problem.budget}")
    return min(options, key=lambda u: (u.objective, u.count))


def solve_brute_force(problem: ExtractProblem, dims: np.ndarray | None = None) -> Allocation:
    """Enumerate every assignment (skip or any pair) of every group; for small instances only."""
    count, dim = _pairs(problem, problem.dims if dims is None else dims)
    pairs = list(zip(count.tolist(), dim.tolist()))
    offsets = problem.offsets.tolist()

    def cost(s: int, pair: tuple[int, int] | None) -> float:
        return problem.evaluate([GroupChoice(s, *pair)] if pair else []).objective

    # Per group: (width, error of this group alone minus its truncation when skipped).
    table = [[(h * d, cost(s, (h, d)) - cost(s, None)) for h, d in pairs] for s in offsets]
    best: tuple[float, tuple[tuple[int, int], ...]] = (0.0, ())
    stack: list[tuple[int, int, float, tuple[tuple[int, int], ...]]] = [(0, 0, 0.0, ())]
    while stack:  # depth-first over groups: each either skipped or given any fitting pair
        g, used, delta, chosen = stack.pop()
        if g == len(offsets):
            best = min(best, (delta, chosen))
            continue
        stack.append((g + 1, used, delta, chosen))
        for p, (width, gain) in enumerate(table[g]):
            if used + width <= problem.budget:
                stack.append((g + 1, used + width, delta + gain, (*chosen, (g, p))))
    groups = [GroupChoice(offsets[g], *pairs[p]) for g, p in best[1]]
    return problem.evaluate(groups)
