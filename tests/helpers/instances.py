"""Random small allocation instances shared by the allocator tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from alloc.extract import ErrorModel, ExtractProblem
from arch.kernels import parse_kernel


def random_kernel(rng: np.random.Generator, tmp: Path, seq_len: int) -> str:
    form = rng.choice(["ngram", "exp", "poly", "file"])
    if form == "ngram":
        return f"ngram:{rng.integers(1, seq_len + 1)}"
    if form == "exp":
        return f"exp:{rng.uniform(0, 2):.3f}"
    if form == "poly":
        return f"poly:{rng.uniform(0, 3):.3f}"
    values = rng.normal(size=seq_len + 1) * (rng.random(seq_len + 1) < 0.8)
    values[rng.integers(0, seq_len)] = 1.0  # at least one non-zero offset in range
    path = tmp / f"kernel{rng.integers(1 << 30)}.txt"
    path.write_text("# random kernel\n" + "\n".join(f"{v:.6f}" for v in values) + "\n")
    return f"file:{path}"


WIDTH_ORDERS = (0.0, 0.5, 1.0, 2.0, 3.0)  # m of docs/theory.md §2.3: below, at and above n


def random_problem(rng: np.random.Generator, tmp: Path, aligned_budget: bool = False,
                   max_budget: int = 16, max_seq_len: int = 3, max_block: int = 1,
                   width_order: bool = False) -> ExtractProblem:
    """A random instance small enough for brute-force enumeration; blocks of up to
    ``max_block`` offsets (a random cap of 1..max_block); with ``width_order`` a random width
    order m (drawn last, so the other draws are those of the same seed without it)."""
    seq_len = int(rng.integers(1, max_seq_len + 1))
    input_dim = int(rng.integers(1, 9))
    align = int(rng.choice([a for a in (1, 2, 3, 4) if a <= input_dim]))
    budget = int(rng.integers(1, max_budget // align + 1)) * align if aligned_budget else \
        int(rng.integers(align, max_budget + 1))
    model = ErrorModel(input_dim, c_proj=float(rng.uniform(0.1, 2)),
                       c_head=float(rng.uniform(0.1, 3)), order=float(rng.choice([1, 1.5, 2, 3])),
                       alpha=float(rng.uniform(0, 0.5)),
                       norm_bound=None if rng.random() < 0.5 else float(rng.uniform(0.5, 4)),
                       product_order=int(rng.choice([1, 2, 3])),
                       input_variance=None if rng.random() < 0.5 else tuple(
                           np.sort(rng.exponential(size=input_dim))[::-1].tolist()))
    rho = parse_kernel(random_kernel(rng, tmp, seq_len), seq_len)
    problem = ExtractProblem(rho, budget, align, model, int(rng.integers(1, max_block + 1)))
    if not width_order:
        return problem
    m = float(rng.choice(WIDTH_ORDERS))
    return dataclasses.replace(problem, model=dataclasses.replace(model, width_order=m))
