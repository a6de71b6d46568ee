"""The continuous relaxation: KKT conditions hold and it lower-bounds the integer optimum."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from alloc.continuous import corner_dims, solve_continuous
from alloc.extract import ErrorModel, ExtractProblem, solve_exact
from arch.kernels import parse_kernel
from tests.helpers.instances import random_problem


def lagrangian(problem: ExtractProblem, lam: float, w: float, k: float, count: float,
               dim: float) -> float:
    m = problem.model
    comp = float(m.compression(dim))  # c_proj sqrt(d_in - d) for isotropic linear tokens
    rate = count**-m.order * float(m.width_factor(dim))  # (d / d_in)^-m: 1 at m = 0
    return w * (comp + k * rate) + lam * count * dim


def check_kkt(problem: ExtractProblem) -> None:
    cont = solve_continuous(problem)
    m, lam = problem.model, cont.multiplier
    corners = corner_dims(problem)  # align and d_max; every aligned dim with a spectrum
    n = m.order
    weights = dict(zip(problem.offsets.tolist(), problem.weights.tolist()))
    shares: dict[int, float] = {}
    for g in cont.groups:
        w = weights[g.offset]
        k = m.c_head * m.bound * math.exp(m.alpha * (n + 1) * g.offset)
        k_d = k * float(m.width_factor(g.dim))  # the extraction constant of heads of g.dim
        grad = -n * w * k_d * g.count ** -(n + 1) + lam * g.dim  # d/dH of the Lagrangian
        if g.count > 1 + 1e-9:
            assert abs(grad) <= 1e-6 * (lam * g.dim + 1e-12), g  # stationarity in H
        else:
            assert grad >= -1e-9 * (lam * g.dim + 1e-12), g  # H at its lower bound
        assert g.dim in corners  # concave in d: a corner (m > 0: every aligned dim)
        # No other answer (skip, the other corner at its stationary H) is better.
        value = lagrangian(problem, lam, w, k, g.count, g.dim)
        assert value <= w * m.bound * (1 + 1e-6) + 1e-12
        for d in corners:
            h = max(1.0, (n * w * k * float(m.width_factor(d)) / (lam * d)) ** (1 / (n + 1)))
            assert value <= lagrangian(problem, lam, w, k, h, d) * (1 + 1e-6) + 1e-12
        shares[g.offset] = shares.get(g.offset, 0.0) + g.share
    assert all(s <= 1 + 1e-9 for s in shares.values())
    if lam > 1e-9:  # complementary slackness: the budget is spent
        assert math.isclose(cont.width, problem.budget, rel_tol=1e-6)
    assert cont.width <= problem.budget * (1 + 1e-6)
    # Zero duality gap of the convexified problem: primal (mixed) error == dual value.
    assert math.isclose(cont.primal, cont.objective, rel_tol=1e-6, abs_tol=1e-9)
    assert cont.objective <= solve_exact(problem).objective + 1e-9


@pytest.mark.parametrize("seed", range(60))
def test_kkt_and_lower_bound_on_random_instances(seed: int, tmp_path: Path) -> None:
    check_kkt(random_problem(np.random.default_rng(500 + seed), tmp_path, max_budget=64,
                             max_seq_len=12))


@pytest.mark.parametrize("seed", range(40))
def test_kkt_and_lower_bound_with_a_width_order(seed: int, tmp_path: Path) -> None:
    # m > 0 makes the error convex in d through (d/d_in)^-m: no corner argument, every aligned
    # dim is searched, and the KKT conditions and the lower bound still hold.
    problem = random_problem(np.random.default_rng(800 + seed), tmp_path, max_budget=64,
                             max_seq_len=12, width_order=True)
    if problem.model.width_order > 0:
        assert corner_dims(problem) == tuple(float(d) for d in problem.dims)
    check_kkt(problem)


@pytest.mark.parametrize("kernel", ["poly:1.0", "exp:0.1", "ngram:4"])
@pytest.mark.parametrize("budget", [64, 512, 4096])
def test_kkt_and_lower_bound_at_realistic_sizes(kernel: str, budget: int) -> None:
    check_kkt(ExtractProblem(parse_kernel(kernel, 256), budget, 8, ErrorModel(64)))


def test_trade_off_law() -> None:
    # With a single corner in use, H*_m is proportional to (|rho_m| K_m)^(1/(n+1)).
    problem = ExtractProblem(parse_kernel("poly:1.0", 64), 4096, 8, ErrorModel(64))
    cont = solve_continuous(problem)
    m = problem.model
    full = [g for g in cont.groups if g.share == 1.0 and g.count > 1 and g.dim == 64]
    ratio = [g.count / ((1 / g.offset) * math.exp(m.alpha * (m.order + 1) * g.offset))
             ** (1 / (m.order + 1)) for g in full]
    assert len(full) >= 3 and np.ptp(ratio) <= 1e-6 * max(ratio)
