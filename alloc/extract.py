"""Early layers: split a width budget between heads and head dimension (docs/theory.md §2-§3).

The layer extracts offsets ``s`` of the kernel ``rho``; group ``m`` gives ``H_m`` heads of dimension
``d_m`` to offset ``s_m`` (``sum H_m d_m <= D``, ``d_m`` a multiple of ``align``, ``<= d_in``), or
skips it. The error bound, per group, in units of token norm::

    |rho_m| * (c_proj * sqrt(d_in) * sqrt(1 - min(d_m/d_in, 1)^k)   # compression
               + c_head * B * exp(alpha*(n+1)*s_m)
                 * H_m^-n * (d_m/d_in)^-m)                          # position extraction
    B * |rho_m|                                                     # if skipped (truncation)

where ``k`` is the order of the products of extracted tokens the layer's output feeds: 1 for an
attention-only layer (the compression term is then ``c_proj * sqrt(max(d_in - d_m, 0))``), 2
when an MLP follows (§2.1); ``m >= 0`` (``width_order``) prices a wider query-key map's sharper
positional score (§2.3): 0 is the paper's bound, where head dimensions above ``d_in`` only spend
width and are never offered; with ``m > 0`` they are, up to the budget.

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
    # m of the extraction term's (d / d_in)^-m (§2.3): what a wider query-key map buys in
    # positional selectivity; 0: nothing (the paper's bound).
    width_order: float = 0.0

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

    def width_factor(self, dim: np.ndarray | float) -> np.ndarray:
        """``(dim / d_in)^-m``: the extraction rate of heads of dimension ``dim`` relative to
        heads as wide as a token (§2.3); 1 everywhere at ``m = 0``."""
        if self.width_order == 0:
            return np.ones_like(np.asarray(dim, float))
        return (np.asarray(dim, float) / self.input_dim) ** -self.width_order

    def extraction(self, offset: np.ndarray | int, count: np.ndarray | float,
                   dim: np.ndarray | float) -> np.ndarray:
        """Error of ``count`` heads of dimension ``dim`` approximating a delta at ``offset``, per
        unit weight: ``K(s) H^-n (d / d_in)^-m``."""
        return (self.head_constant(offset) * np.asarray(count, float) ** -self.order
                * self.width_factor(dim))


def max_head_dim(input_dim: int, budget: int, width_order: float) -> int:
    """The widest head dimension the solvers offer: ``min(d_in, D)`` when a wider head buys
    nothing (``m = 0``: compression is already zero at ``d_in``), else the whole budget."""
    return budget if width_order > 0 else min(input_dim, budget)


@dataclass(frozen=True)
class GroupChoice:
    """``count`` heads of dimension ``dim`` extract the offsets ``offset .. offset + span - 1``:
    one offset (``span`` 1, the bound's construction), or a block they average with a flat
    positional score (§2.2)."""

    offset: int
    count: int
    dim: int
    span: int = 1

    @property
    def last(self) -> int:
        return self.offset + self.span - 1


@dataclass(frozen=True)
class Allocation:
    """A feasible allocation and its error bound, split into its terms (``averaging``: what the
    block groups' flat average loses where the kernel varies inside a block)."""

    objective: float
    compression: float
    extraction: float
    truncation: float
    groups: tuple[GroupChoice, ...]
    averaging: float = 0.0

    @property
    def width(self) -> int:
        return sum(g.count * g.dim for g in self.groups)

    @property
    def heads(self) -> int:
        return sum(g.count for g in self.groups)


@dataclass(frozen=True)
class BlockTerms:
    """Per block of offsets ``start .. start + span - 1`` (arrays over blocks): the read-out
    weight ``|sum rho|``, the averaging loss ``B * sum |rho(s) - mean rho|``, and the loss of
    truncating the block instead, ``B * sum |rho(s)|``."""

    start: np.ndarray
    span: int
    weight: np.ndarray
    averaging: np.ndarray
    truncation: np.ndarray

    @property
    def last(self) -> np.ndarray:
        return self.start + self.span - 1

    def cost(self, model: ErrorModel, count: np.ndarray | float, dim: np.ndarray | float
             ) -> np.ndarray:
        """(blocks, pairs): each block's error with ``count`` heads of ``dim`` (arrays of the
        pairs, or one pair): §2.2's ``E_ab``."""
        count, dim = np.atleast_1d(count).astype(float), np.atleast_1d(dim)
        rate = count ** -model.order * model.width_factor(dim)  # (pairs,)
        return self.weight[:, None] * (model.compression(dim)[None, :]
                                       + model.head_constant(self.last)[:, None]
                                       * rate[None, :]) + self.averaging[:, None]


@dataclass(frozen=True, eq=False)
class ExtractProblem:
    """One instance: kernel values ``rho[s-1]`` for offsets ``s = 1..len(rho)``, budget, align;
    ``max_block``: the longest block of consecutive offsets one head group may average (1: the
    bound's one-offset groups only)."""

    rho: np.ndarray
    budget: int
    align: int
    model: ErrorModel
    max_block: int = 1

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
        """Allowed head dimensions: multiples of ``align`` up to ``max_head_dim`` (``min(d_in,
        budget)``, or the budget when wider heads extract better, ``m > 0``)."""
        top = max_head_dim(self.model.input_dim, self.budget, self.model.width_order)
        return np.arange(self.align, top + 1, self.align)

    @cached_property
    def reach(self) -> int:
        """The farthest offset with non-zero weight (0 if none): nothing beyond it matters."""
        nonzero = np.flatnonzero(self.rho)
        return int(nonzero[-1]) + 1 if len(nonzero) else 0

    def blocks(self, span: int) -> BlockTerms:
        """Every block of ``span`` consecutive offsets within ``1 .. reach``."""
        rho = np.asarray(self.rho[:self.reach], float)
        windows = np.lib.stride_tricks.sliding_window_view(rho, span)  # (blocks, span)
        mean = windows.mean(axis=1, keepdims=True)
        bound = self.model.bound
        return BlockTerms(np.arange(1, len(windows) + 1), span, np.abs(windows.sum(axis=1)),
                          bound * np.abs(windows - mean).sum(axis=1),
                          bound * np.abs(windows).sum(axis=1))

    def evaluate(self, groups: tuple[GroupChoice, ...] | list[GroupChoice]) -> Allocation:
        """Error bound of an allocation; offsets no group covers are truncated.

        Raises:
            ValueError: two groups cover one offset, or a block reaches past the kernel.
        """
        covered: set[int] = set()
        comp = extr = avg = 0.0
        for g in groups:
            span = range(g.offset, g.last + 1)
            if covered.intersection(span) or g.last > len(self.rho) or g.offset < 1:
                raise ValueError(f"group {g} overlaps another or leaves offsets 1..{len(self.rho)}")
            covered.update(span)
            block = np.asarray(self.rho[g.offset - 1:g.last], float)
            weight = abs(float(block.sum()))
            comp += weight * float(self.model.compression(g.dim))
            extr += weight * float(self.model.extraction(g.last, g.count, g.dim))
            avg += self.model.bound * float(np.abs(block - block.mean()).sum())
        trunc = sum(w * self.model.bound for s, w in zip(self.offsets.tolist(),
                                                         self.weights.tolist()) if s not in covered)
        ordered = tuple(sorted(groups, key=lambda g: g.offset))
        return Allocation(comp + extr + trunc + avg, comp, extr, trunc, ordered, avg)


def _pairs(problem: ExtractProblem, dims: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All ``(count, dim)`` with ``count * dim <= budget``, sorted by width."""
    counts = [np.arange(1, problem.budget // d + 1) for d in dims.tolist()]
    count = np.concatenate(counts)
    dim = np.concatenate([np.full(len(c), d) for c, d in zip(counts, dims.tolist())])
    order = np.argsort(count * dim, kind="stable")
    return count[order], dim[order]


@dataclass(frozen=True)
class Breakpoints:
    """Every block's useful choices, flat over blocks: the widths (in align units) where a
    block's best cost strictly drops below truncating it, with that cost, the ``(count, dim)``
    pair's index, and the block's last offset (``end``) and ``span``."""

    end: np.ndarray
    span: np.ndarray
    units: np.ndarray
    cost: np.ndarray
    pair: np.ndarray

    @staticmethod
    def concat(parts: list[Breakpoints]) -> Breakpoints:
        """One set, ordered by end offset, then as ``parts`` came (by span), then by width."""
        end = np.concatenate([b.end for b in parts])
        order = np.argsort(end, kind="stable")
        return Breakpoints(*(np.concatenate([getattr(b, name) for b in parts])[order]
                             for name in ("end", "span", "units", "cost", "pair")))


def _breakpoints(problem: ExtractProblem, blocks: BlockTerms, count: np.ndarray,
                 dim: np.ndarray) -> Breakpoints:
    """The breakpoints of each block of ``blocks``. Only these matter in the DP: between two of
    them a block's cost is flat while the budget left to the other offsets shrinks."""
    units = (count * dim) // problem.align  # (pairs,), non-decreasing
    cost = blocks.cost(problem.model, count, dim)  # (blocks, pairs)
    best = np.minimum.accumulate(cost, axis=1)  # best cost using any pair up to each width
    drop = np.ones_like(best, dtype=bool)
    drop[:, 1:] = best[:, 1:] < best[:, :-1]
    drop &= best < blocks.truncation[:, None]
    # Several drops at one width: keep the last, cheapest one. Per width (its pairs are
    # consecutive), the last drop up to its last pair, if that drop is of this width.
    ends = np.flatnonzero(np.diff(units, append=-1) != 0)  # (widths,) each width's last pair
    firsts = np.concatenate(([0], ends[:-1] + 1))
    pairs = np.arange(units.size)
    last = np.maximum.accumulate(np.where(drop, pairs, -1), axis=1)[:, ends]  # (blocks, widths)
    block, width = np.nonzero(last >= firsts)  # by block, then width
    pick = last[block, width]
    return Breakpoints(blocks.last[block], np.full(block.size, blocks.span), units[pick],
                       cost[block, pick], pick)


def _solve_dp(problem: ExtractProblem, dims: np.ndarray) -> Allocation:
    """Min-plus DP over offsets in order and the budget (§3.1)::

        F_p(b) = min( F_{p-1}(b) + B |rho(p)|,                         # offset p truncated
                      min_{L, k} F_{p-L}(b - u_k) + c_k )              # a block ending at p

    ``(u_k, c_k)`` over the breakpoints of the block of the ``L <= max_block`` offsets ending
    at ``p``; ``F_p(b)`` is the best error of offsets ``1..p`` within width ``b`` (align
    units). Ties go to truncation, then the shorter block, then the narrower breakpoint.
    """
    count, dim = _pairs(problem, dims)
    top = problem.budget // problem.align
    reach = problem.reach
    spans = range(1, min(problem.max_block, reach) + 1)
    brk = Breakpoints.concat([_breakpoints(problem, problem.blocks(L), count, dim)
                              for L in spans])
    at = np.searchsorted(brk.end, np.arange(reach + 2))  # offset p's breakpoints: at[p]:at[p+1]
    budget = np.arange(top + 1)
    # best[p, top+1+b] = F_p(b); the first top+1 columns are +inf (widths below zero).
    best = np.full((reach + 1, 2 * (top + 1)), np.inf)
    best[0, top + 1:] = 0.0
    flat = best.reshape(-1)  # a view: F_{p-L}(b - u_k) is flat[start_k + b]
    start = (brk.end - brk.span) * best.shape[1] + (top + 1) - brk.units
    pick = np.full((reach + 1, top + 1), -1, dtype=np.intp)  # breakpoint taken (-1: truncated)
    trunc = problem.blocks(1).truncation  # per offset 1..reach
    for p in range(1, reach + 1):
        current = best[p - 1, top + 1:] + trunc[p - 1]
        lo, hi = at[p], at[p + 1]
        if hi > lo:
            # (K, top+1): error if breakpoint k's block ends at p and the offsets before it
            # get b - u_k.
            cand = flat[start[lo:hi, None] + budget[None, :]] + brk.cost[lo:hi, None]
            k = np.argmin(cand, axis=0)
            value = cand[k, budget]
            better = value < current
            current = np.where(better, value, current)
            pick[p] = np.where(better, lo + k, -1)
        best[p, top + 1:] = current
    groups, b, p = [], top, reach  # back from the last offset at the full budget
    while p > 0:
        i = int(pick[p, b])
        if i < 0:
            p -= 1
            continue
        span, pair = int(brk.span[i]), int(brk.pair[i])
        groups.append(GroupChoice(p - span + 1, int(count[pair]), int(dim[pair]), span))
        b, p = b - int(brk.units[i]), p - span
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
    """Error of the uniform layer if every block could have all ``budget/dim`` heads: the
    offsets' DP without the budget (each block's cost only falls with more heads)."""
    heads = problem.budget // dim
    trunc = problem.blocks(1).truncation  # per offset 1..reach
    best = np.zeros(problem.reach + 1)
    costs = {}
    for L in range(1, min(problem.max_block, problem.reach) + 1):
        b = problem.blocks(L)
        costs[L] = np.minimum(b.truncation, b.cost(problem.model, heads, dim)[:, 0])
    for p in range(1, problem.reach + 1):
        best[p] = min([best[p - 1] + trunc[p - 1]]
                      + [best[p - L] + costs[L][p - L] for L in costs if p >= L])
    return float(best[-1])


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
    """Enumerate every assignment: each offset in order either truncated or the start of a block
    of up to ``max_block`` offsets given any fitting ``(count, dim)``; small instances only."""
    count, dim = _pairs(problem, problem.dims if dims is None else dims)
    pairs = list(zip(count.tolist(), dim.tolist()))
    n = len(problem.rho)
    nothing = problem.evaluate([]).objective
    # Per block (start, span) and pair: its width and the error it saves over truncation.
    gain = {(s, L): [(h * d, problem.evaluate([GroupChoice(s, h, d, L)]).objective - nothing)
                     for h, d in pairs]
            for s in range(1, n + 1) for L in range(1, min(problem.max_block, n - s + 1) + 1)}
    best: tuple[float, tuple[GroupChoice, ...]] = (0.0, ())
    stack: list[tuple[int, int, float, tuple[GroupChoice, ...]]] = [(1, 0, 0.0, ())]
    while stack:  # depth-first over offsets: truncated, or the first of a block
        s, used, delta, chosen = stack.pop()
        if s > n:
            best = min(best, (delta, chosen), key=lambda b: b[0])
            continue
        stack.append((s + 1, used, delta, chosen))
        for L in range(1, min(problem.max_block, n - s + 1) + 1):
            for (h, d), (width, saved) in zip(pairs, gain[(s, L)]):
                if used + width <= problem.budget:
                    stack.append((s + L, used + width, delta + saved,
                                  (*chosen, GroupChoice(s, h, d, L))))
    return problem.evaluate(best[1])
