"""python -m bench.search_efficiency --replay [--smoke-test] [--seeds N] [--target F] [--out DIR]

How many trials each search strategy needs to come within 2% (``--target``) of the best
validation loss: the
allocator-seeded TPE the launcher runs, plain TPE, random search, and the grid in random order,
each with ASHA (Optuna's successive-halving pruner on the recorded learning curves) and without.
A tabular benchmark, as NAS-Bench-201 and HPOBench do it: every point of a finite space is
trained once, through ``workers.search``, into a study (the table; built if absent, resumed if
interrupted), then each strategy is replayed against the table for many seeds in seconds.
Writes ``search_efficiency.csv`` (one row per benchmark, strategy and seed) and
``search_efficiency.png`` (best-so-far vs trials, median over seeds).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from arch import ModelIO
from common.cli import Parser, add_format, dump, fail, int_in, number, render_table
from common.errors import TransformerAllocError, UsageError
from common.files import write_csv
from common.plots import new_figure, write_figure
from search_spaces import SearchSpace, parse_space
from workers.search.searcher import ASHA_REDUCTION, asha_grace_period

TARGET = 0.02  # within 2% of the best value of the table
STRATEGIES = ("seeded-tpe", "tpe", "random", "grid")


@dataclass(frozen=True)
class Bench:
    """A finite space on a task: the table's rows."""

    name: str
    task: str
    space: dict[str, Any]
    task_params: dict[str, Any] = field(default_factory=dict)


def _space(name: str, budget: int, depth: int, rules: list[dict[str, Any]],
           train: dict[str, Any], model: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "budget": budget, "depth": depth, "sampler": "grid", "model": model,
            "layers": rules, "train": train}


FULL = (
    Bench("ngram", "ngram", _space(
        "eff-ngram", 256, 1, [{"layers": "all", "heads": [1, 2, 4, 8, 16, 32, 64],
                               "mlp_ratio": [0, 2]}],
        {"steps": 1000, "eval_every": 50, "batch_size": 32, "lr": [1.0e-3, 3.0e-3]},
        {"positional": "sinusoidal"})),
    Bench("lm", "lm", _space(
        "eff-lm", 128, 2, [{"layers": 0, "heads": [1, 2, 4, 8], "role": "extract",
                            "mlp_ratio": [2]},
                           {"layers": 1, "heads": [1, 2, 4, 8], "mlp_ratio": [2],
                            "qk_dim": {"min": 32, "step": 32}}],
        {"steps": 600, "eval_every": 50, "batch_size": 32, "lr": 3.0e-3},
        {"positional": "learned"}), {"length": 64}),
)
SMOKE = (
    Bench("ngram", "ngram", _space(
        "eff-ngram-smoke", 32, 1, [{"layers": "all", "heads": [1, 2, 4, 8]}],
        {"steps": 40, "eval_every": 10, "batch_size": 16, "lr": [1.0e-3, 1.0e-2]},
        {"positional": "sinusoidal"})),
    Bench("lm", "lm", _space(
        "eff-lm-smoke", 32, 1, [{"layers": "all", "heads": [1, 2, 4, 8]}],
        {"steps": 40, "eval_every": 10, "batch_size": 16, "lr": [3.0e-3, 1.0e-2]},
        {"positional": "learned"})),
)


@dataclass(frozen=True)
class Entry:
    """One trained point of the table."""

    value: float
    curve: dict[int, float]


def key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


# --- the table ----------------------------------------------------------------------------------


def build_table(bench: Bench, space: SearchSpace, task: Any, points: int, url: str,
                results: Path) -> None:
    """Train every point of the space once into the study ``table-NAME`` (resumed if there)."""
    from workers.experiments import harness

    harness.search(space, task, points, url, f"table-{bench.name}", results)


def load_table(url: str, study: str) -> dict[str, Entry]:
    """Final value and learning curve of every complete trial, by its params."""
    trials = optuna.load_study(study_name=study, storage=url).get_trials(
        states=(optuna.trial.TrialState.COMPLETE,))
    return {key(t.params): Entry(float(t.value), dict(t.intermediate_values))
            for t in trials if t.value is not None}


# --- replaying a strategy -----------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What one replayed trial cost and found."""

    value: float | None  # None: pruned before the full budget
    steps: int


def replay(space: SearchSpace, io: ModelIO, table: dict[str, Entry], strategy: str,
           seed: int, asha: bool, trials: int, starts: list[dict[str, Any]],
           maximize: bool) -> list[Outcome]:
    """``trials`` trials of ``strategy`` against ``table``."""
    steps, every = int(space.fixed_train("steps")), int(space.fixed_train("eval_every"))
    pruner = (optuna.pruners.SuccessiveHalvingPruner(
        min_resource=asha_grace_period(steps, every), reduction_factor=ASHA_REDUCTION)
              if asha else optuna.pruners.NopPruner())
    if strategy == "grid":
        order = list(table)
        random.Random(seed).shuffle(order)
        ask: Callable[[optuna.Study], optuna.trial.Trial] = _fixed(order, space, io)
        sampler: optuna.samplers.BaseSampler = optuna.samplers.RandomSampler(seed=seed)
    else:
        ask = _sampled(space, io)
        sampler = (optuna.samplers.RandomSampler(seed=seed) if strategy == "random"
                   else optuna.samplers.TPESampler(seed=seed))
    study = optuna.create_study(sampler=sampler, pruner=pruner,
                                direction="maximize" if maximize else "minimize")
    for params in starts if strategy == "seeded-tpe" else []:
        study.enqueue_trial(params, skip_if_exists=True)  # as the launcher: once per point
    return [_run(study, ask, table, steps) for _ in range(trials)]


def _sampled(space: SearchSpace, io: ModelIO) -> Callable[[optuna.Study], optuna.trial.Trial]:
    def ask(study: optuna.Study) -> optuna.trial.Trial:
        trial = study.ask()
        space.sample(trial, io)
        return trial
    return ask


def _fixed(order: list[str], space: SearchSpace, io: ModelIO
           ) -> Callable[[optuna.Study], optuna.trial.Trial]:
    def ask(study: optuna.Study) -> optuna.trial.Trial:
        study.enqueue_trial(json.loads(order[len(study.trials) % len(order)]))
        trial = study.ask()
        space.sample(trial, io)
        return trial
    return ask


def _run(study: optuna.Study, ask: Callable[[optuna.Study], optuna.trial.Trial],
         table: dict[str, Entry], steps: int) -> Outcome:
    trial = ask(study)
    entry = table.get(key(trial.params))
    if entry is None:  # a point whose training failed: it costs a trial and finds nothing
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        return Outcome(None, steps)
    for step, value in sorted(entry.curve.items()):
        trial.report(value, step)
        if step < steps and trial.should_prune():
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return Outcome(None, step)
    study.tell(trial, entry.value)
    return Outcome(entry.value, steps)


def to_target(outcomes: list[Outcome], target: float, maximize: bool, steps: int
              ) -> tuple[float, float]:
    """(trials, full-training equivalents) until a fully trained trial reaches ``target``;
    ``inf`` if it never does."""
    spent = 0
    for n, o in enumerate(outcomes, start=1):
        spent += o.steps
        if o.value is not None and (o.value >= target if maximize else o.value <= target):
            return float(n), spent / steps
    return math.inf, math.inf


# --- the benchmark ------------------------------------------------------------------------------


def run_bench(bench: Bench, args: argparse.Namespace) -> list[dict[str, Any]]:
    from workers.search.driver import training_budget
    from workers.search.seeding import plan_settings, seeds
    from workers.tasks import make_task

    task = make_task(bench.task, "smoke" if args.smoke_test else "paper", 0, **bench.task_params)
    space = training_budget(parse_space(bench.space, f"<{bench.name}>"))
    url = f"sqlite:///{(args.out / 'tables.db').resolve()}"
    points = len(space.grid())
    build_table(bench, space, task, points, url, args.out / "ray_results")
    table = load_table(url, f"table-{bench.name}")
    if not table:
        raise UsageError(f"table-{bench.name}: no trained point in {args.out / 'tables.db'}")
    if len(table) < points:
        print(f"table-{bench.name}: {points - len(table)} of {points} points failed to train; "
              "a strategy that samples one pays a trial for nothing", file=sys.stderr)
    values = [e.value for e in table.values()]
    best = max(values) if task.higher_is_better else min(values)
    target = best * (1 - args.target if task.higher_is_better else 1 + args.target)
    starts = [dict(s.params) for s in seeds(space, plan_settings(space.budget, space.depth,
                                                                 task))]
    steps = int(space.fixed_train("steps"))
    rows = []
    for strategy in STRATEGIES:
        for asha in (False, True):
            for seed in range(args.seeds):
                outcomes = replay(space, task.io, table, strategy, seed, asha, len(table) * 3,
                                  starts, task.higher_is_better)
                trials, cost = to_target(outcomes, target, task.higher_is_better, steps)
                rows.append({"bench": bench.name, "strategy": strategy, "asha": asha,
                             "seed": seed, "trials_to_target": trials,
                             "full_trainings_to_target": cost, "table_size": len(table),
                             "best": best, "target": target,
                             "curve": json.dumps(_best_so_far(outcomes, task.higher_is_better))})
    return rows


def _best_so_far(outcomes: list[Outcome], maximize: bool) -> list[float | None]:
    best: float | None = None
    out = []
    for o in outcomes:
        if o.value is not None and (best is None or (o.value > best if maximize
                                                     else o.value < best)):
            best = o.value
        out.append(best)
    return out


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median and IQR of trials (and full trainings) to the target, per bench and strategy."""
    out = []
    for bench in dict.fromkeys(r["bench"] for r in rows):
        for strategy in STRATEGIES:
            for asha in (False, True):
                mine = [r for r in rows if (r["bench"], r["strategy"], r["asha"]) ==
                        (bench, strategy, asha)]
                trials = np.array([r["trials_to_target"] for r in mine])
                cost = np.array([r["full_trainings_to_target"] for r in mine])
                out.append({"bench": bench, "strategy": strategy, "asha": asha,
                            "seeds": len(mine), "table_size": mine[0]["table_size"],
                            "median_trials": float(np.median(trials)),
                            "iqr_trials": _iqr(trials), "median_cost": float(np.median(cost)),
                            "iqr_cost": _iqr(cost),
                            "reached": int(np.isfinite(trials).sum())})
    return out


def _iqr(values: np.ndarray) -> list[float]:
    # inverted_cdf picks observed values, so "never" (inf) stays inf instead of inf - inf = nan
    return [float(np.percentile(values, q, method="inverted_cdf")) for q in (25, 75)]


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    benches = list(dict.fromkeys(r["bench"] for r in rows))
    fig, axes = new_figure(len(benches), (6 * len(benches), 4.2))
    axes = np.atleast_1d(axes)
    for ax, bench in zip(axes, benches):
        target = next(r["target"] for r in rows if r["bench"] == bench)
        for i, strategy in enumerate(STRATEGIES):
            curves = [json.loads(r["curve"]) for r in rows
                      if (r["bench"], r["strategy"], r["asha"]) == (bench, strategy, False)]
            length = min(len(c) for c in curves)
            data = np.array([[math.nan if v is None else v for v in c[:length]]
                             for c in curves])
            x = np.arange(1, length + 1)
            ax.plot(x, np.nanmedian(data, 0), color=f"C{i}", label=strategy)
            ax.fill_between(x, np.nanpercentile(data, 25, 0), np.nanpercentile(data, 75, 0),
                            color=f"C{i}", alpha=0.15)
        ax.axhline(target, color="k", ls=":", label="the target (near the table's best)")
        ax.set_xscale("log")
        ax.set_xlabel("trials (fully trained, ASHA off)")
        ax.set_ylabel("best validation value so far (median, IQR over seeds)")
        size = next(r["table_size"] for r in rows if r["bench"] == bench)
        ax.set_title(f"{bench}: a table of {size} trained points")
        ax.legend(fontsize=8)
    write_figure(fig, path)


def render(summary: list[dict[str, Any]]) -> str:
    def fmt(x: float) -> str:
        return "never" if math.isinf(x) else f"{x:g}"

    return render_table(
        ["bench", "strategy", "asha", "median trials", "IQR", "median full trainings", "IQR",
         "reached"],
        [[s["bench"], s["strategy"], "on" if s["asha"] else "off", fmt(s["median_trials"]),
          "-".join(fmt(v) for v in s["iqr_trials"]), f"{s['median_cost']:.3g}",
          "-".join(f"{v:.3g}" for v in s["iqr_cost"]), f"{s['reached']}/{s['seeds']}"]
         for s in summary], right=[False, False, False, True, True, True, True, True])


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m bench.search_efficiency", description=__doc__.split("\n\n")[1])
    p.add_argument("--replay", action="store_true",
                   help="replay the strategies against the trained table (required: the only "
                        "mode; live searches per strategy and seed would cost seeds x "
                        "strategies full searches)")
    p.add_argument("--smoke-test", action="store_true", help="tiny tables: under a minute")
    p.add_argument("--target", type=number(0, strict=True), default=TARGET,
                   help="reach within this fraction of the table's best value (a table whose "
                        "points are mostly that close says nothing: tighten it)")
    p.add_argument("--seeds", type=int_in(1), default=20, help="replays per strategy")
    p.add_argument("--out", type=Path, default=Path("results/search_efficiency"),
                   help="folder for the tables' study, the CSV and the PNG")
    add_format(p)
    args = p.parse_args(argv)
    if not args.replay:
        return fail(p.prog, "--replay: required (the benchmark replays each strategy against "
                            "a trained table; live searches per strategy and seed are not "
                            "offered)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from workers.experiments import harness
    from workers.search import tune

    try:
        harness.prepare(args)
        with tune.session():
            rows = [row for bench in (SMOKE if args.smoke_test else FULL)
                    for row in run_bench(bench, args)]
    except TransformerAllocError as err:
        return fail(p.prog, str(err))
    write_csv(args.out / "search_efficiency.csv", rows)
    plot(rows, args.out / "search_efficiency.png")
    summary = summarise(rows)
    print(render(summary) if args.format == "table" else dump(summary, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
