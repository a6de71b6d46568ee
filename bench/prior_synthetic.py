"""python -m bench.prior_synthetic [--table lm] [--table-seed 0] [--seeds 100] [--format table]

The prior sampler against a wrong, a middling and a right prior, and random search, on a
synthetic table over a shipped table's space: no training. The values are known
(``additive_values``: a random effect per param value, summed, plus noise, scaled so that the
worst point is 5% above the best), the space is real (``bench/tables/NAME.yaml``: its points
and random search's chances of each), and the replay is ``bench.search_efficiency``'s (each
point trained once, as the launcher does it; ASHA off). Prints, per strategy, the median trials
to within 1% of the best with IQR and mean, and the ratio to random search's median.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np
import optuna

from alloc import PlanSettings, candidates, point_key
from arch import ModelIO
from bench.search_efficiency import (
    GRADED,
    TABLES,
    Entry,
    Priors,
    make_strategy,
    replay,
    to_target,
)
from common.cli import Parser, add_format, dump, int_in, render_table
from search_spaces import SearchSpace, load_space

IO = ModelIO(max_seq_len=16, vocab_size=12)  # the replay samples architectures only
STRATEGIES = (*GRADED, "random")
TARGET = 0.01
NAMES = tuple(sorted(path.stem for path in TABLES.glob("*.yaml")))  # the shipped tables


def additive_values(space: SearchSpace, seed: int) -> dict[str, float]:
    """Known values over ``space``'s points: a random effect per param value, summed, plus
    noise of half an effect's SD, scaled to [1.0, 1.05] (lower is better)."""
    rng = np.random.default_rng(seed)
    effects: dict[tuple[str, str], float] = {}
    points = space.grid(free=space.ranges)
    raw = np.array([sum(effects.setdefault((k, json.dumps(v)), float(rng.normal()))
                        for k, v in sorted(p.items())) + 0.5 * rng.normal() for p in points])
    scaled = 1.0 + 0.05 * (raw - raw.min()) / (raw.max() - raw.min())
    return {point_key(p): float(v) for p, v in zip(points, scaled)}


def measure(name: str, table_seed: int, seeds: int) -> dict[str, Any]:
    """Trials to within 1% per strategy over ``seeds`` replays of the synthetic table."""
    space = load_space(TABLES / f"{name}.yaml")
    values = additive_values(space, table_seed)
    steps = int(space.fixed_train("steps"))
    table = {k: Entry(v, {steps: v}) for k, v in values.items()}
    cands = candidates(space)
    priors = Priors(cands, PlanSettings(budget=space.budget, layers=space.depth, seq_len=64),
                    np.array([values[point_key(p)] for p in cands.params]), None)
    goal = (1 + TARGET) * min(values.values())
    out: dict[str, Any] = {"table": f"{name}, synthetic {table_seed}", "points": len(values),
                           "within": sum(v <= goal for v in values.values())}
    clock = time.perf_counter()
    for strategy in STRATEGIES:
        trials = np.array([to_target(replay(space, IO, table, make_strategy(
            strategy, seed, priors, [], list(table), False), False, len(table), False, seed),
            goal, False, steps)[0] for seed in range(seeds)])
        out[strategy] = {"median": float(np.median(trials)), "mean": float(trials.mean()),
                         "iqr": [float(np.percentile(trials, q, method="inverted_cdf"))
                                 for q in (25, 75)]}
    out["seconds"] = time.perf_counter() - clock
    return out


def render(result: dict[str, Any]) -> str:
    rnd = result["random"]["median"]
    rows = [[s, f"{result[s]['median']:g}", "-".join(f"{v:g}" for v in result[s]["iqr"]),
             f"{result[s]['mean']:.2f}", f"{result[s]['median'] / rnd:.2f}x"]
            for s in STRATEGIES]
    head = (f"{result['table']}: {result['points']} points, {result['within']} within 1%, "
            f"{result['seconds']:.0f} s")
    return head + "\n" + render_table(
        ["strategy", "median trials to 1%", "IQR", "mean", "/ random"], rows,
        right=[False, True, True, True, True])


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m bench.prior_synthetic", description=__doc__.split("\n\n")[1])
    p.add_argument("--table", choices=NAMES, default="lm", help="whose space (default: lm)")
    p.add_argument("--table-seed", type=int_in(0), default=0, help="the values' seed")
    p.add_argument("--seeds", type=int_in(1), default=100, help="replays per strategy")
    add_format(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    result = measure(args.table, args.table_seed, args.seeds)
    print(render(result) if args.format == "table" else dump(result, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
