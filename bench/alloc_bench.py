"""python -m bench.alloc_bench [--smoke-test] [--format table|json|yaml]

The exact allocator's DP against two independent solvers on the same instances: brute-force
enumeration (small instances) and a mixed-integer programme solved by ``scipy.optimize.milp``
(HiGHS): a multiple-choice knapsack with one binary per (offset, heads, dim) choice,

    min  sum_m B|rho_m| + sum_{m,p} (cost_mp - B|rho_m|) x_mp
    s.t. sum_p x_mp <= 1 per offset m (none chosen = truncated),  sum_{m,p} H_p d_p x_mp <= D.

Prints each solver's objective and time, and time ratios measured in the same run. Also times the
whole ``python -m alloc.solve --budget 512`` command (interpreter start included).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_array

from alloc import ErrorModel, ExtractProblem, GroupChoice, solve_brute_force, solve_exact
from arch import parse_kernel
from common.cli import Parser, add_format, dump, render_table

# (kernel, seq_len, budget, align, input_dim, brute force feasible)
FULL = [
    ("poly:1.0", 3, 16, 1, 8, True),
    ("exp:0.5", 3, 24, 2, 8, True),
    ("ngram:4", 4, 16, 2, 8, True),
    ("poly:1.0", 256, 512, 8, 64, False),
    ("poly:1.0", 256, 2048, 8, 64, False),
    ("exp:0.05", 256, 2048, 8, 64, False),
    ("ngram:4", 256, 2048, 8, 64, False),
]
SMOKE = [FULL[0], ("poly:1.0", 32, 256, 8, 64, False)]
MILP_TIME_LIMIT = 600.0


def undominated(cost: np.ndarray, width: np.ndarray, skip: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """(group, choice) pairs that no other choice of the group beats with no more width.

    The textbook multiple-choice-knapsack reduction: without it HiGHS needs over 24 GB at
    D = 2048 (178k binaries). A choice no better than truncation is dominated too.
    """
    order = np.argsort(width, kind="stable")
    rows, cols = [], []
    for g in range(cost.shape[0]):
        best = skip[g]
        for p in order.tolist():  # by width: keep a choice only if it beats every narrower one
            if cost[g, p] < best:
                best = cost[g, p]
                rows.append(g)
                cols.append(p)
    return np.array(rows, dtype=int), np.array(cols, dtype=int)


def solve_milp(problem: ExtractProblem) -> tuple[float, tuple[GroupChoice, ...]]:
    """Multiple-choice knapsack over every (offset, heads, dim), solved by HiGHS."""
    m = problem.model
    dims = problem.dims
    count = np.concatenate([np.arange(1, problem.budget // d + 1) for d in dims.tolist()])
    dim = np.concatenate([np.full(problem.budget // d, d) for d in dims.tolist()])
    skip = problem.weights * m.bound
    # (M, P) error of every choice; only choices better than truncation can be optimal.
    cost = problem.weights[:, None] * (m.compression(dim)[None, :] + m.head_constant(
        problem.offsets)[:, None] * count[None, :] ** -m.order)
    rows, cols = undominated(cost, count * dim, skip)
    n = len(rows)
    gain = cost[rows, cols] - skip[rows]
    width = (count * dim)[cols]
    groups = len(problem.offsets)
    one_per_group = csr_array((np.ones(n), (rows, np.arange(n))), shape=(groups, n))
    constraints = [LinearConstraint(one_per_group, 0, 1),
                   LinearConstraint(width[None, :], 0, problem.budget)]
    result = milp(gain, constraints=constraints, integrality=np.ones(n), bounds=Bounds(0, 1),
                  options={"mip_rel_gap": 0.0, "time_limit": MILP_TIME_LIMIT})
    if not result.success:
        raise RuntimeError(f"milp failed: {result.message}")
    chosen = np.flatnonzero(result.x > 0.5)
    picks = tuple(GroupChoice(int(problem.offsets[rows[i]]), int(count[cols[i]]),
                              int(dim[cols[i]])) for i in chosen)
    return problem.evaluate(picks).objective, picks


def timed(fn: Callable[[], Any], repeat: int) -> tuple[Any, float]:
    """Result of ``fn`` and its best wall time over ``repeat`` runs."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return result, best


def run_instance(spec: tuple[str, int, int, int, int, bool], repeat: int) -> dict[str, Any]:
    kernel, seq_len, budget, align, input_dim, brute = spec
    problem = ExtractProblem(parse_kernel(kernel, seq_len), budget, align, ErrorModel(input_dim))
    exact, t_dp = timed(lambda: solve_exact(problem), repeat)
    (milp_obj, _), t_milp = timed(lambda: solve_milp(problem), 1)
    row: dict[str, Any] = {
        "kernel": kernel, "seq_len": seq_len, "budget": budget, "align": align,
        "input_dim": input_dim, "dp_objective": exact.objective, "dp_s": t_dp,
        "milp_objective": milp_obj, "milp_s": t_milp, "milp_over_dp": t_milp / t_dp,
        "same_objective": bool(np.isclose(exact.objective, milp_obj, rtol=1e-9, atol=1e-12)),
    }
    if brute:
        bf, t_bf = timed(lambda: solve_brute_force(problem), 1)
        row.update(brute_objective=bf.objective, brute_s=t_bf, brute_over_dp=t_bf / t_dp)
        row["same_objective"] &= bool(np.isclose(exact.objective, bf.objective, rtol=1e-9))
    return row


def time_cli(repeat: int) -> float:
    """Best wall time of the whole ``python -m alloc.solve --budget 512`` process."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "alloc.solve", "--budget", "512"], check=True,
                       capture_output=True)
        best = min(best, time.perf_counter() - start)
    return best


def time_large(repeat: int) -> dict[str, float]:
    problem = ExtractProblem(parse_kernel("poly:1.0", 256), 8192, 8, ErrorModel(64))
    _, seconds = timed(lambda: solve_exact(problem), repeat)
    return {"exact_8192_align8_s": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="bench.alloc_bench", description=__doc__.split("\n\n")[1])
    parser.add_argument("--smoke-test", action="store_true", help="two small instances only")
    parser.add_argument("--repeat", type=int, default=3, help="DP timing repeats (best of)")
    add_format(parser)
    args = parser.parse_args(argv)
    rows = []
    for spec in SMOKE if args.smoke_test else FULL:
        rows.append(run_instance(spec, args.repeat))
        r = rows[-1]
        print(f"{spec[0]} N={spec[1]} D={spec[2]}: DP {r['dp_s']:.3f}s, milp {r['milp_s']:.3f}s",
              file=sys.stderr, flush=True)
    extra = {"cli_budget_512_s": time_cli(1 if args.smoke_test else args.repeat)}
    if not args.smoke_test:
        extra.update(time_large(args.repeat))
    if args.format != "table":
        print(dump({"instances": rows, **extra}, args.format))
        return 0 if all(r["same_objective"] for r in rows) else 1
    table = [[f"{r['kernel']} N={r['seq_len']}", r["budget"], r["align"],
              f"{r['dp_objective']:.6f}", f"{r['milp_objective']:.6f}",
              f"{r['brute_objective']:.6f}" if "brute_objective" in r else "-",
              "yes" if r["same_objective"] else "NO", f"{r['dp_s'] * 1e3:.1f}",
              f"{r['milp_s'] * 1e3:.1f}", f"{r['milp_over_dp']:.1f}x",
              f"{r['brute_over_dp']:.1f}x" if "brute_over_dp" in r else "-"] for r in rows]
    print(render_table(["instance", "D", "align", "DP", "milp", "brute", "same", "DP ms",
                        "milp ms", "milp/DP", "brute/DP"], table,
                       right=[False] + [True] * 10))
    for key, value in extra.items():
        print(f"{key}: {value:.3f}")
    return 0 if all(r["same_objective"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
