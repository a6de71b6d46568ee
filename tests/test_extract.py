"""Early-layer allocation: the DP against brute force, the uniform variant, the U-curve."""

from __future__ import annotations

import dataclasses
import math
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from alloc.extract import (
    ErrorModel,
    ExtractProblem,
    GroupChoice,
    solve_brute_force,
    solve_exact,
    solve_uniform,
    uniform_options,
)
from arch.kernels import parse_kernel
from tests.helpers.instances import random_problem


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def feasible(problem: ExtractProblem, groups: tuple[GroupChoice, ...]) -> bool:
    dims_ok = all(g.dim % problem.align == 0 and 1 <= g.dim <= problem.dims[-1]
                  and g.count >= 1 for g in groups)
    return dims_ok and sum(g.count * g.dim for g in groups) <= problem.budget


@pytest.mark.parametrize("seed", range(120))
def test_exact_equals_brute_force(seed: int, tmp_path: Path) -> None:
    problem = random_problem(np.random.default_rng(seed), tmp_path)
    exact, brute = solve_exact(problem), solve_brute_force(problem)
    assert feasible(problem, exact.groups)
    assert close(exact.objective, brute.objective), (exact, brute)
    assert close(exact.objective, problem.evaluate(exact.groups).objective)


@pytest.mark.parametrize("seed", range(60))
def test_uniform_equals_brute_force_over_divisors(seed: int, tmp_path: Path) -> None:
    problem = random_problem(np.random.default_rng(1000 + seed), tmp_path, aligned_budget=True)
    divisors = [d for d in problem.dims.tolist() if problem.budget % d == 0]
    brute = min(solve_brute_force(problem, np.array([d])).objective for d in divisors)
    best = solve_uniform(problem)
    assert close(best.objective, brute)
    assert best.count * best.dim == problem.budget
    assert all(g.dim == best.dim for g in best.allocation.groups)
    assert best.allocation.heads <= best.count
    # Pruning only skips divisors that cannot win.
    assert close(min(o.objective for o in uniform_options(problem)), best.objective)


def test_exact_never_worse_than_uniform() -> None:
    problem = ExtractProblem(parse_kernel("exp:0.3", 64), 256, 8, ErrorModel(64))
    assert solve_exact(problem).objective <= solve_uniform(problem).objective + 1e-12


def test_objective_terms_match_the_formula() -> None:
    model = ErrorModel(16, c_proj=0.5, c_head=2.0, order=2.0, alpha=0.1, norm_bound=3.0)
    rho = np.array([0.0, -2.0, 0.5])  # offset 1 has no weight; offset 2 is negative
    problem = ExtractProblem(rho, 64, 4, model)
    alloc = problem.evaluate([GroupChoice(2, 3, 8)])
    comp = 2.0 * 0.5 * math.sqrt(16 - 8)
    extr = 2.0 * 2.0 * 3.0 * math.exp(0.1 * 3 * 2) / 3**2
    trunc = 3.0 * 0.5  # offset 3 skipped
    assert close(alloc.compression, comp) and close(alloc.extraction, extr)
    assert close(alloc.truncation, trunc) and close(alloc.objective, comp + extr + trunc)
    assert list(problem.offsets) == [2, 3]  # sorted by |rho|, zero weights dropped


def single_group_curve(d_in: int, budget: int, c_proj: float, c_head: float, order: float,
                       alpha: float) -> tuple[list[int], list[float], ExtractProblem]:
    model = ErrorModel(d_in, c_proj=c_proj, c_head=c_head, order=order, alpha=alpha)
    problem = ExtractProblem(parse_kernel("ngram:1", 8), budget, 1, model)
    options = uniform_options(problem)
    return [o.count for o in options], [o.objective for o in options], problem


def test_single_group_reproduces_the_paper_curve() -> None:
    heads, errors, problem = single_group_curve(512, 512, 1.0, 1.0, 2.0, 0.01)
    b = math.sqrt(512) * math.exp(0.01 * 3)
    for h, e in zip(heads, errors):
        formula = math.sqrt(max(512 - 512 / h, 0)) + b / h**2
        assert close(e, min(formula, problem.model.bound))
    best = heads[int(np.argmin(errors))]
    assert best == 4 and heads[0] < best < heads[-1]  # interior minimum: U-shaped


@pytest.mark.parametrize("seed", range(40))
def test_single_group_curve_is_u_shaped_where_theory_says(seed: int) -> None:
    # Theory: dE/dH = H^-(n+1) [c_proj D H^(n-1) / (2 sqrt(d_in - D/H)) - n b]; for n >= 1 and
    # D < 2 d_in / 3 the bracket increases in H, so E falls then rises, with one minimum.
    rng = np.random.default_rng(seed)
    d_in = int(rng.integers(96, 1025))
    budget = int(2 ** rng.integers(4, int(np.log2(2 * d_in / 3)) + 1))
    order = float(rng.choice([1.0, 2.0, 3.0]))
    # Stay in the theorem's regime E < B (no truncation): c_proj < 1 and b below the margin.
    c_proj = float(rng.uniform(0.2, 0.9))
    margin = math.sqrt(d_in) * (1 - c_proj)
    one_head = math.sqrt(d_in) * math.exp(0.01 * (order + 1))  # B e^{alpha (n+1)}
    c_head = float(rng.uniform(0.05, 0.95)) * margin / one_head
    heads, errors, problem = single_group_curve(d_in, budget, c_proj, c_head, order, 0.01)
    assert max(errors) < problem.model.bound
    k = int(np.argmin(errors))
    assert all(a > b for a, b in pairwise(errors[: k + 1]))
    assert all(a < b for a, b in pairwise(errors[k:]))
    # The discrete minimum brackets the continuous stationary point.
    b = c_head * problem.model.bound * math.exp(0.01 * (order + 1))

    def slope(h: float) -> float:
        return c_proj * budget * h ** (order - 1) / (2 * math.sqrt(d_in - budget / h)) - order * b

    lo, hi = heads[max(k - 1, 0)], heads[min(k + 1, len(heads) - 1)]
    assert (slope(lo) <= 0 or k == 0) and (slope(hi) >= 0 or k == len(heads) - 1)


def test_default_budget_gives_eight_heads_of_64() -> None:
    problem = ExtractProblem(parse_kernel("poly:1.0", 256), 512, 8, ErrorModel(64))
    exact, uniform = solve_exact(problem), solve_uniform(problem)
    assert (uniform.count, uniform.dim) == (8, 64)
    assert exact.heads == 8 and {g.dim for g in exact.groups} == {64}


def test_larger_input_dim_moves_the_choice() -> None:
    problem = ExtractProblem(parse_kernel("poly:1.0", 256), 512, 8, ErrorModel(512))
    uniform = solve_uniform(problem)
    assert (uniform.count, uniform.dim) != (8, 64)


# --- heads that average a block of offsets (docs/theory.md §2.2) ---------------------------------


@pytest.mark.parametrize("seed", range(80))
def test_exact_with_blocks_equals_brute_force(seed: int, tmp_path: Path) -> None:
    problem = random_problem(np.random.default_rng(5000 + seed), tmp_path, max_budget=12,
                             max_seq_len=4, max_block=4)
    exact, brute = solve_exact(problem), solve_brute_force(problem)
    assert feasible(problem, exact.groups)
    assert close(exact.objective, brute.objective), (exact, brute)
    assert close(exact.objective, problem.evaluate(exact.groups).objective)
    # Blocks only add choices: never worse than the one-offset optimum.
    single = solve_exact(dataclasses.replace(problem, max_block=1))
    assert exact.objective <= single.objective + 1e-12


@pytest.mark.parametrize("seed", range(40))
def test_uniform_with_blocks_equals_brute_force(seed: int, tmp_path: Path) -> None:
    problem = random_problem(np.random.default_rng(7000 + seed), tmp_path, aligned_budget=True,
                             max_budget=12, max_seq_len=4, max_block=4)
    divisors = [d for d in problem.dims.tolist() if problem.budget % d == 0]
    brute = min(solve_brute_force(problem, np.array([d])).objective for d in divisors)
    assert close(solve_uniform(problem).objective, brute)


def test_block_terms_match_the_formula() -> None:
    model = ErrorModel(16, c_proj=0.5, c_head=2.0, order=2.0, alpha=0.1, norm_bound=3.0)
    rho = np.array([1.0, 0.5, 0.3, 0.2])
    problem = ExtractProblem(rho, 64, 4, model, max_block=3)
    alloc = problem.evaluate([GroupChoice(1, 2, 8, span=3)])  # offsets 1-3 averaged by 2 heads
    mean = 0.6
    assert close(alloc.compression, 1.8 * 0.5 * math.sqrt(16 - 8))
    assert close(alloc.extraction, 1.8 * 2.0 * 3.0 * math.exp(0.1 * 3 * 3) / 2**2)  # far edge
    assert close(alloc.averaging, 3.0 * (0.4 + 0.1 + 0.3))
    assert close(alloc.truncation, 3.0 * 0.2)  # offset 4 is left out
    assert close(alloc.objective, alloc.compression + alloc.extraction + alloc.averaging
                 + alloc.truncation) and mean == pytest.approx(rho[:3].mean())
    with pytest.raises(ValueError, match="overlaps"):
        problem.evaluate([GroupChoice(1, 1, 8, span=2), GroupChoice(2, 1, 8)])


def test_a_flat_block_is_averaged_by_one_group() -> None:
    # ngram:4 (four equal offsets), d_in 64, D 256: the one-offset bound gives two heads of 64
    # to each of two offsets and truncates the other two; with blocks, the four heads average
    # offsets 1-4 together, and the bound falls because every head now serves all four.
    single = ExtractProblem(parse_kernel("ngram:4", 64), 256, 8, ErrorModel(64))
    block = dataclasses.replace(single, max_block=8)
    old, new = solve_exact(single), solve_exact(block)
    assert [(g.offset, g.span, g.count, g.dim) for g in old.groups] == [
        (1, 1, 2, 64), (2, 1, 2, 64)]
    assert old.truncation == 2 * 8  # offsets 3 and 4, B = 8 each
    assert [(g.offset, g.span, g.count, g.dim) for g in new.groups] == [(1, 4, 4, 64)]
    assert new.averaging == 0 and new.objective < old.objective / 8
    # A decaying kernel is not averaged where its variation costs more than a head saves.
    steep = ExtractProblem(parse_kernel("exp:2.0", 64), 256, 8, ErrorModel(64), max_block=8)
    assert all(g.span == 1 for g in solve_exact(steep).groups)


# --- what a wider head buys: the width order m (docs/theory.md §2.3) ----------------------------


@pytest.mark.parametrize("seed", range(60))
def test_exact_with_width_order_equals_brute_force(seed: int, tmp_path: Path) -> None:
    problem = random_problem(np.random.default_rng(9000 + seed), tmp_path, max_budget=12,
                             max_seq_len=3, max_block=3, width_order=True)
    exact, brute = solve_exact(problem), solve_brute_force(problem)
    assert feasible(problem, exact.groups)
    assert close(exact.objective, brute.objective), (exact, brute)
    assert close(exact.objective, problem.evaluate(exact.groups).objective)


@pytest.mark.parametrize("seed", range(40))
def test_uniform_with_width_order_equals_brute_force(seed: int, tmp_path: Path) -> None:
    problem = random_problem(np.random.default_rng(9500 + seed), tmp_path, aligned_budget=True,
                             max_budget=12, max_seq_len=3, max_block=3, width_order=True)
    divisors = [d for d in problem.dims.tolist() if problem.budget % d == 0]
    brute = min(solve_brute_force(problem, np.array([d])).objective for d in divisors)
    assert close(solve_uniform(problem).objective, brute)
    assert close(min(o.objective for o in uniform_options(problem)),
                 solve_uniform(problem).objective)


def test_width_order_term_matches_the_formula() -> None:
    model = ErrorModel(16, c_proj=0.5, c_head=2.0, order=2.0, alpha=0.1, norm_bound=3.0,
                       width_order=1.5)
    rho = np.array([0.0, -2.0, 0.5])
    problem = ExtractProblem(rho, 64, 4, model)
    alloc = problem.evaluate([GroupChoice(2, 3, 8)])
    assert close(alloc.extraction, 2.0 * 2.0 * 3.0 * math.exp(0.1 * 3 * 2) / 3**2
                 * (8 / 16) ** -1.5)
    wide = problem.evaluate([GroupChoice(2, 1, 32)])  # wider than d_in: no compression
    assert wide.compression == 0
    assert close(wide.extraction, 2.0 * 2.0 * 3.0 * math.exp(0.1 * 3 * 2) * 2.0 ** -1.5)
    assert problem.dims[-1] == 64  # m > 0: dims up to the budget
    assert ExtractProblem(rho, 64, 4, ErrorModel(16)).dims[-1] == 16  # m = 0: up to d_in


@pytest.mark.parametrize("kernel", ["poly:1.0", "exp:0.3", "ngram:4"])
@pytest.mark.parametrize("budget", [64, 256, 512])
def test_width_order_zero_is_the_bound_without_it(kernel: str, budget: int) -> None:
    # m = 0 exactly: the same dims offered, the same allocations (the default changes nothing).
    base = ExtractProblem(parse_kernel(kernel, 64), budget, 8, ErrorModel(64), max_block=8)
    zero = dataclasses.replace(base, model=dataclasses.replace(base.model, width_order=0.0))
    assert list(zero.dims) == list(base.dims)
    assert solve_exact(zero) == solve_exact(base)
    assert solve_uniform(zero) == solve_uniform(base)


@pytest.mark.parametrize(("order", "width_order", "heads"), [
    (2.0, 0.0, 4), (2.0, 1.0, 4), (1.0, 1.5, 1), (2.0, 3.0, 1), (1.0, 0.5, 4)])
def test_ngram_uniform_layer_follows_the_sign_of_m_minus_n(order: float, width_order: float,
                                                          heads: int) -> None:
    # ngram:4 at D = 256, d_in 64 (the ngram table): every layer with heads of at least d_in has
    # no compression and H heads of D/H extract the block at K (D/d_in)^-m H^(m-n), so the
    # uniform layer is 4x64 (the widest heads that compress nothing, no fewer) while m < n
    # and one head of 256 once m > n.
    model = ErrorModel(64, c_proj=0.1, c_head=0.5, order=order, width_order=width_order,
                       product_order=2)
    problem = ExtractProblem(parse_kernel("ngram:4", 64), 256, 8, model, max_block=8)
    best = solve_uniform(problem)
    assert (best.count, best.dim) == (heads, 256 // heads)
