"""python -m bench.search_efficiency --replay [--space FILE (--task T | --data PATH)] [--smoke-test]

How many trials each search strategy needs to come within 1% and 0.5% of the best value of a
finite space: the prior sampler with the allocator's prior (``--sampler prior``), the same
sampler with priors of graded quality (centred on the best, the median and the worst of 50
random points of the table, as mf-prior-bench grades them), the allocator-seeded TPE, plain TPE,
random search and the grid in random order, each with ASHA (Optuna's successive halving on the
recorded learning curves) and without. No strategy trains a point twice (as in the launcher).
A tabular benchmark, as NAS-Bench-201 and HPOBench do it: every point of the space is trained
once through ``workers.search`` into a study (the table; built if absent, resumed if
interrupted), then each strategy is replayed against it for many seeds. A table holds one run
per point (training seed 0) and, for the points ``bench.table_noise`` retrained, runs of seeds
1..N: each replay draws one run per point with its seed (``Runs.draw``; ``--values seed0``:
seed 0's table). Every run is written to ``table-NAME.csv`` beside ``tables.db``;
``--from-csv DIR`` replays from those files (and the data's written profile) without training.
Without ``--space``, the shipped tables (``bench/tables/*.yaml``: ngram, lm, and 100 two-layer
models on the standard library's sources; ``--table`` picks some). Writes
``search_efficiency.csv`` (one row per table, strategy, ASHA and seed),
``search_efficiency_summary.csv`` (medians and IQR),
``search_efficiency.png`` (normalised regret against trials) and prints the median and IQR per
strategy with the goals' verdict.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from alloc import (
    DEFAULT_TEMPERATURE,
    Calibration,
    Candidates,
    PlanSettings,
    PriorSampler,
    allocator_prior,
    candidates,
    centred_prior,
    point_key,
)
from arch import ModelIO
from common.cli import Parser, add_format, dump, fail, fault, int_in, number, render_table
from common.errors import TransformerAllocError, UsageError
from common.files import write_csv
from common.plots import new_figure, write_figure
from common.progress import Progress
from search_spaces import SearchSpace, SpaceError, load_space
from workers.errors import SearchFaultError
from workers.search import ask_new

# The replay's early stopping: stock ASHA (Optuna's successive halving, first rung at a ninth of
# the training, a third kept), as the launcher ran before its milestones
# (workers.search.schedule); the tables' ASHA figures in docs/results.md were measured with it.
ASHA_REDUCTION = 3


def asha_grace_period(steps: int, eval_every: int) -> int:
    """The first rung: a ninth of the training, and at least one evaluation."""
    return max(eval_every, steps // 9)


TARGETS = (0.01, 0.005)  # within 1% and 0.5% of the table's best value
SEED = "train.seed"  # the training seed param of bench.table_noise's retrainings
GRADED = ("prior-best", "prior-median", "prior-worst")
STRATEGIES = ("prior", *GRADED, "seeded-tpe", "tpe", "random", "grid")
SHIPPED = ("ngram", "lm", "stdlib")  # the shipped tables, in order (bench/tables/NAME.yaml)
GRADED_FROM = 50  # graded priors are centred on points of this many random table points
TABLES = Path(__file__).resolve().parent / "tables"
CORPUS_MB = 2.0  # of the standard library's sources, for the shipped stdlib table
DOCS_MB = 1.0  # more than pydoc_data's topics (0.47 MB): all of the lm table's corpus


@dataclass(frozen=True)
class Case:
    """A finite space on a task: one table."""

    name: str
    space: SearchSpace
    task: Any  # workers.tasks.Task
    settings: PlanSettings  # the allocator's inputs (measured from the data when it is data)


@dataclass(frozen=True)
class Entry:
    """One trained point of the table."""

    value: float
    curve: dict[int, float]


# --- the table ----------------------------------------------------------------------------------


def table_url(out: Path) -> str:
    """The SQLite database of the tables (and their noise studies) in the output folder."""
    return f"sqlite:///{(out / 'tables.db').resolve()}"


def build_table(case: Case, url: str, results: Path) -> None:
    """Train every point of the space once into the study ``table-NAME`` (resumed if there)."""
    from experiments import harness

    harness.search(case.space, case.task, len(case.space.grid()), url, f"table-{case.name}",
                   results)


def load_table(url: str, study: str) -> dict[str, Entry]:
    """Final value and learning curve of every complete trial, by its point."""
    trials = optuna.load_study(study_name=study, storage=url).get_trials(
        states=(optuna.trial.TrialState.COMPLETE,))
    return {point_key(t.params): Entry(float(t.value), dict(t.intermediate_values))
            for t in trials if t.value is not None}


@dataclass(frozen=True)
class Runs:
    """Every training run of a table's points: per point (its key), per training seed, the
    run's final value and curve. Seed 0 is the table (``table-NAME``); seeds 1.. are the
    retrainings ``bench.table_noise`` adds (``noise-NAME``), for the points it retrained."""

    by_point: Mapping[str, Mapping[int, Entry]]

    def seed(self, seed: int = 0) -> dict[str, Entry]:
        """The table of one training seed (the points that have it)."""
        return {k: runs[seed] for k, runs in self.by_point.items() if seed in runs}

    def draw(self, rng: random.Random) -> dict[str, Entry]:
        """One run per point, its seed drawn uniformly from the point's seeds (a replay's
        realisation of the table: the value a search that trained the point once would see)."""
        return {k: runs[rng.choice(sorted(runs))] for k, runs in self.by_point.items()}

    def seeds_per_point(self) -> dict[int, int]:
        """How many points have 1, 2, ... seeds."""
        counts = [len(runs) for runs in self.by_point.values()]
        return {c: counts.count(c) for c in sorted(set(counts))}


def load_runs(url: str, name: str) -> Runs:
    """``table-NAME`` (seed 0) and, where ``bench.table_noise`` retrained points, their runs of
    ``noise-NAME`` (its ``train.seed`` param)."""
    from experiments import harness

    by_point: dict[str, dict[int, Entry]] = {k: {0: e} for k, e in load_table(
        url, f"table-{name}").items()}
    if harness.study_exists(url, f"noise-{name}"):
        for t in optuna.load_study(study_name=f"noise-{name}", storage=url).get_trials(
                states=(optuna.trial.TrialState.COMPLETE,)):
            key = point_key({k: v for k, v in t.params.items() if k != SEED})
            if key in by_point and t.value is not None:
                by_point[key][int(t.params[SEED])] = Entry(float(t.value),
                                                           dict(t.intermediate_values))
    return Runs(by_point)


def write_runs(path: Path, runs: Runs) -> None:
    """One row per point and seed: the point's params (JSON), the seed, the final value and the
    learning curve (JSON, step -> value), so replays need no training (``read_runs``)."""
    write_csv(path, [{"point": k, "seed": seed, "value": e.value,
                      "curve": json.dumps({str(step): v for step, v in sorted(e.curve.items())})}
                     for k, by_seed in runs.by_point.items()
                     for seed, e in sorted(by_seed.items())])


def read_runs(path: Path) -> Runs:
    """The runs ``write_runs`` wrote (``UsageError`` naming the file if unreadable)."""
    import csv

    by_point: dict[str, dict[int, Entry]] = {}
    try:
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                curve = {int(step): float(v) for step, v in json.loads(row["curve"]).items()}
                by_point.setdefault(point_key(json.loads(row["point"])), {})[
                    int(row["seed"])] = Entry(float(row["value"]), curve)
    except (OSError, KeyError, ValueError) as err:
        raise UsageError(f"--from-csv: {path}: {err} (a table CSV of bench.search_efficiency: "
                         "point, seed, value, curve)") from None
    return Runs(by_point)


# --- replaying a strategy -----------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What one replayed trial cost and found."""

    value: float | None  # None: pruned before the full budget, or failed to train
    steps: int


@dataclass(frozen=True)
class Strategy:
    """How a replay asks for trials: its sampler and the points enqueued first (in order)."""

    sampler: optuna.samplers.BaseSampler
    enqueue: Sequence[dict[str, Any]] = ()


def replay(space: SearchSpace, io: ModelIO, table: dict[str, Entry], strategy: Strategy,
           asha: bool, trials: int, maximize: bool, seed: int = 0) -> list[Outcome]:
    """``trials`` trained trials of ``strategy`` against ``table``: a proposal of a finished
    point is re-asked as the launcher does (after ``MAX_REDRAWS`` in a row, an untried point)."""
    steps, every = int(space.fixed_train("steps")), int(space.fixed_train("eval_every"))
    pruner = (optuna.pruners.SuccessiveHalvingPruner(
        min_resource=asha_grace_period(steps, every), reduction_factor=ASHA_REDUCTION)
              if asha else optuna.pruners.NopPruner())
    study = optuna.create_study(sampler=strategy.sampler, pruner=pruner,
                                direction="maximize" if maximize else "minimize")
    for params in strategy.enqueue:
        study.enqueue_trial(params, skip_if_exists=True)  # as the launcher: once per point

    def ask() -> tuple[optuna.trial.Trial, Any]:
        trial = study.ask()
        return trial, space.sample(trial, io)

    def untried() -> list[dict[str, Any]]:
        tried = {point_key(t.params) for t in study.get_trials(deepcopy=False)}
        return [json.loads(k) for k in table if k not in tried]

    rng, outcomes = random.Random(seed), []
    for _ in range(min(trials, len(table))):
        trial, _ = ask_new(study, ask, untried, rng)
        outcomes.append(_run(study, trial, table, steps))
    return outcomes


def _run(study: optuna.Study, trial: optuna.trial.Trial, table: dict[str, Entry],
         steps: int) -> Outcome:
    entry = table.get(point_key(trial.params))
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


# --- strategies ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Priors:
    """What the prior strategies of one table share: its candidates and the allocator prior."""

    candidates: Candidates
    settings: PlanSettings
    values: np.ndarray  # the table's value of each candidate (nan: failed to train)
    plan: dict[str, Any] | None  # the allocator's plan as params of the space
    temperature: float = DEFAULT_TEMPERATURE

    def graded_centre(self, grade: str, seed: int, maximize: bool) -> int:
        """The best, median or worst of ``GRADED_FROM`` random points of the table."""
        known = np.flatnonzero(np.isfinite(self.values))
        pick = random.Random(seed).sample(list(known), min(GRADED_FROM, len(known)))
        ranked = sorted(pick, key=lambda i: -self.values[i] if maximize else self.values[i])
        return int({"prior-best": ranked[0], "prior-median": ranked[len(ranked) // 2],
                    "prior-worst": ranked[-1]}[grade])


def make_strategy(name: str, seed: int, priors: Priors, starts: list[dict[str, Any]],
                  order: list[str], maximize: bool) -> Strategy:
    if name == "prior":
        prior = allocator_prior(priors.candidates, priors.settings, priors.temperature,
                                plan=priors.plan)
        return Strategy(PriorSampler(prior, seed=seed, calibration=Calibration(
            priors.settings, prior.temperature, plan=priors.plan)))
    if name in GRADED:
        centre = priors.graded_centre(name, seed, maximize)
        return Strategy(PriorSampler(centred_prior(priors.candidates, centre,
                                                   priors.temperature, name), seed=seed))
    if name == "grid":
        shuffled = list(order)
        random.Random(seed).shuffle(shuffled)
        return Strategy(optuna.samplers.RandomSampler(seed=seed),
                        [json.loads(k) for k in shuffled])
    if name == "random":
        return Strategy(optuna.samplers.RandomSampler(seed=seed))
    return Strategy(optuna.samplers.TPESampler(seed=seed),
                    starts if name == "seeded-tpe" else ())


# --- the benchmark ------------------------------------------------------------------------------


def allocator_starts(case: Case) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The launcher's starting points for ``case`` (what seeded TPE enqueues), and the one that
    breaks the allocator prior's ties, as the launcher's prior sampler takes it
    (``plan_anchor``)."""
    from workers.search import SearchPlan, plan_anchor, seeds as allocator_seeds

    seeded = allocator_seeds(case.space, SearchPlan.make(case.settings))
    anchor = plan_anchor(seeded)
    return [dict(s.params) for s in seeded], None if anchor is None else dict(anchor)


def case_runs(case: Case, out: Path, from_csv: Path | None = None) -> Runs:
    """The runs of ``case``'s table: read from ``from_csv/table-NAME.csv`` (no training), or
    built (or reused) in ``out``'s ``tables.db`` and written to ``out/table-NAME.csv``."""
    if from_csv is not None:
        return read_runs(from_csv / f"table-{case.name}.csv")
    url = table_url(out)
    build_table(case, url, out / "ray_results")
    runs = load_runs(url, case.name)
    if not runs.by_point:
        raise UsageError(f"table-{case.name}: no trained point in {out / 'tables.db'}")
    write_runs(out / f"table-{case.name}.csv", runs)
    return runs


def run_case(case: Case, runs: Runs, seeds: int, strategies: Sequence[str] = STRATEGIES,
             temperature: float = DEFAULT_TEMPERATURE, ashas: Sequence[bool] = (False, True),
             draw: bool = True) -> list[dict[str, Any]]:
    """Replay every strategy ``seeds`` times against ``case``'s table: with ``draw``, replay
    ``seed`` reads each point's value from one of its training runs drawn with that seed (the
    same draw for every strategy: paired), else every replay reads seed 0's table."""
    points = len(case.space.grid())
    if len(runs.by_point) < points:
        print(f"table-{case.name}: {points - len(runs.by_point)} of {points} points failed to "
              "train; a strategy that samples one pays a trial for nothing", file=sys.stderr)
    maximize = case.task.higher_is_better
    cands = candidates(case.space)
    starts, plan = allocator_starts(case)
    steps = int(case.space.fixed_train("steps"))
    rows = []
    with Progress(f"replay {case.name}", total=seeds, unit="seeds",
                  start=f"{len(strategies)} strategies x {len(ashas)} schedulers x {seeds} "
                        "seeds") as progress:
        for seed in range(seeds):
            table = runs.draw(random.Random(f"values {seed}")) if draw else runs.seed(0)
            priors = Priors(cands, case.settings, np.array([
                table[point_key(p)].value if point_key(p) in table else math.nan
                for p in cands.params]), plan, temperature)
            for name in strategies:
                for asha in ashas:
                    strategy = make_strategy(name, seed, priors, starts, list(table), maximize)
                    rows.append({"table": case.name, "strategy": name,
                                 "values": "drawn" if draw else "seed 0",
                                 **replay_row(case, table, strategy, asha, seed, steps)})
            progress.update()
            if (seed + 1) % 10 == 0 and seed + 1 < seeds:  # a line per tenth on a log
                progress.event()
    return rows


def replay_row(case: Case, table: dict[str, Entry], strategy: Strategy, asha: bool,
               seed: int, steps: int) -> dict[str, Any]:
    """One replay of ``strategy`` against ``table``: trials (and full trainings) to each
    target, the best-so-far curve and the sampler's cost."""
    maximize = case.task.higher_is_better
    values = [e.value for e in table.values()]
    best, worst = (max(values), min(values)) if maximize else (min(values), max(values))
    clock = time.perf_counter()
    outcomes = replay(case.space, case.task.io, table, strategy, asha, len(table), maximize,
                      seed)
    wall = time.perf_counter() - clock
    sampler_s = getattr(strategy.sampler, "seconds", None)
    row: dict[str, Any] = {
        "asha": asha, "seed": seed,
        "table_size": len(table), "best": best, "worst": worst,
        "sampler_ms_per_trial": None if sampler_s is None
        else 1000 * sampler_s / len(outcomes),
        "replay_ms_per_trial": 1000 * wall / len(outcomes),
        "curve": json.dumps(_best_so_far(outcomes, maximize))}
    for target in TARGETS:
        goal = best * (1 - target if maximize else 1 + target)
        row[f"trials_{target:g}"], row[f"cost_{target:g}"] = to_target(
            outcomes, goal, maximize, steps)
    return row


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
    """Median and IQR of trials (and full trainings) to each target, per table, strategy and
    ASHA; the regime is the median trials over the table's size."""
    out = []
    groups: dict[tuple[str, str, bool], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["table"], r["strategy"], r["asha"]), []).append(r)
    for (table, strategy, asha), mine in groups.items():
        entry: dict[str, Any] = {"table": table, "strategy": strategy, "asha": asha,
                                 "seeds": len(mine), "table_size": mine[0]["table_size"]}
        for target in TARGETS:
            trials = np.array([r[f"trials_{target:g}"] for r in mine])
            cost = np.array([r[f"cost_{target:g}"] for r in mine])
            entry[f"median_trials_{target:g}"] = float(np.median(trials))
            entry[f"iqr_trials_{target:g}"] = _iqr(trials)
            entry[f"median_cost_{target:g}"] = float(np.median(cost))
            entry[f"reached_{target:g}"] = int(np.isfinite(trials).sum())
        ms = [r["sampler_ms_per_trial"] for r in mine if r["sampler_ms_per_trial"] is not None]
        entry["sampler_ms_per_trial"] = float(np.median(ms)) if ms else None
        out.append(entry)
    return out


def _iqr(values: np.ndarray) -> list[float]:
    # inverted_cdf picks observed values, so "never" (inf) stays inf instead of inf - inf = nan
    return [float(np.percentile(values, q, method="inverted_cdf")) for q in (25, 75)]


def verdict(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The goals per table (ASHA off, within 1%): the allocator's prior at most half
    of random search's median trials, the worst-point prior at most 1.25x, the best-point prior
    at most 3 trials."""
    out = []
    for table in dict.fromkeys(s["table"] for s in summary):
        median = {s["strategy"]: s["median_trials_0.01"] for s in summary
                  if s["table"] == table and not s["asha"]}
        if not {"random", "prior", "prior-worst", "prior-best"} <= set(median):
            continue
        rnd = median["random"]
        out.append({"table": table, "random": rnd,
                    "prior": median["prior"], "prior_goal": median["prior"] <= rnd / 2,
                    "worst": median["prior-worst"], "worst_goal": median["prior-worst"]
                    <= 1.25 * rnd,
                    "best": median["prior-best"], "best_goal": median["prior-best"] <= 3})
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Normalised regret (best so far - table best) / (worst - best), median over seeds, against
    trials; ASHA off."""
    tables = list(dict.fromkeys(r["table"] for r in rows))
    fig, axes = new_figure(len(tables), (5.5 * len(tables), 4.2))
    axes = np.atleast_1d(axes)
    for ax, table in zip(axes, tables):
        for i, strategy in enumerate(dict.fromkeys(r["strategy"] for r in rows)):
            mine = [r for r in rows if (r["table"], r["strategy"], r["asha"]) ==
                    (table, strategy, False)]
            if not mine:
                continue
            best, worst = mine[0]["best"], mine[0]["worst"]
            curves = [json.loads(r["curve"]) for r in mine]
            length = min(len(c) for c in curves)
            regret = np.array([[1.0 if v is None else abs(v - best) / (abs(worst - best) or 1)
                                for v in c[:length]] for c in curves])
            x = np.arange(1, length + 1)
            style = "--" if strategy in GRADED else "-"
            ax.plot(x, np.maximum(np.median(regret, 0), 1e-4), style, color=f"C{i}",
                    label=strategy)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("trials (fully trained, ASHA off)")
        ax.set_ylabel("normalised regret (median over seeds)")
        size = next(r["table_size"] for r in rows if r["table"] == table)
        ax.set_title(f"{table}: {size} points")
        ax.legend(fontsize=7)
    write_figure(fig, path)


def render(summary: list[dict[str, Any]], verdicts: list[dict[str, Any]]) -> str:
    def fmt(x: float) -> str:
        return "never" if math.isinf(x) else f"{x:g}"

    def trials(s: dict[str, Any], target: float) -> str:
        iqr = "-".join(fmt(v) for v in s[f"iqr_trials_{target:g}"])
        return f"{fmt(s[f'median_trials_{target:g}'])} ({iqr})"

    rows = [[s["table"], s["strategy"], "on" if s["asha"] else "off", s["table_size"],
             *[trials(s, t) for t in TARGETS],
             f"{s['median_cost_0.01']:.3g}",
             "" if s["sampler_ms_per_trial"] is None else f"{s['sampler_ms_per_trial']:.1f}"]
            for s in summary]
    table = render_table(["table", "strategy", "asha", "points", "trials to 1% (IQR)",
                          "trials to 0.5% (IQR)", "full trainings to 1%", "sampler ms/trial"],
                         rows, right=[False, False, False, True, True, True, True, True])
    goals = render_table(
        ["table", "random", "allocator prior", "<= 1/2", "worst prior", "<= 1.25x",
         "best prior", "<= 3"],
        [[v["table"], fmt(v["random"]), fmt(v["prior"]), _yes(v["prior_goal"]),
          fmt(v["worst"]), _yes(v["worst_goal"]), fmt(v["best"]), _yes(v["best_goal"])]
         for v in verdicts], right=[False] + [True] * 7)
    return f"{table}\n\ngoals (median trials to within 1%, ASHA off):\n{goals}"


def _yes(ok: bool) -> str:
    return "yes" if ok else "NO"


# --- command line ---------------------------------------------------------------------------------


def add_table_args(p: argparse.ArgumentParser) -> None:
    """The flags that name the tables (``cases``): a space file and its task, or the shipped
    ones; the task seed; the smoke size."""
    from workers.taskargs import add_task_args

    p.add_argument("--space", type=Path,
                   help="a finite search space (YAML) to benchmark; default: the shipped tables")
    add_task_args(p, required=False)
    p.add_argument("--seed", type=int_in(0), default=0, help="task seed")
    p.add_argument("--table", action="append", choices=SHIPPED,
                   help="only this shipped table (repeatable; default: all, or --space's)")
    p.add_argument("--smoke-test", action="store_true",
                   help="smoke-size task and 40 training steps per point")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m bench.search_efficiency", description=__doc__.split("\n\n")[1])
    p.add_argument("--replay", action="store_true",
                   help="replay the strategies against the trained table (required: the only "
                        "mode; live searches per strategy and seed would cost seeds x "
                        "strategies full searches)")
    add_table_args(p)
    p.add_argument("--seeds", type=int_in(1), default=20, help="replays per strategy")
    p.add_argument("--strategy", action="append", choices=STRATEGIES,
                   help="only this strategy (repeatable; default: all)")
    p.add_argument("--asha", choices=("both", "off", "on"), default="both",
                   help="replay with ASHA, without, or both (default)")
    p.add_argument("--values", choices=("drawn", "seed0"), default="drawn",
                   help="drawn (default): each replay reads every point's value from one of its "
                        "training runs, drawn with the replay's seed (points with one run: "
                        "seed 0's); seed0: every replay reads seed 0's table")
    p.add_argument("--from-csv", type=Path, metavar="DIR",
                   help="read each table's runs (table-NAME.csv) and its data's profile "
                        "(profile-*.yaml) from DIR instead of training and profiling, e.g. "
                        "docs/results/search_efficiency")
    p.add_argument("--prior-temperature", type=number(0, strict=True),
                   default=DEFAULT_TEMPERATURE, help="the priors' spread")
    p.add_argument("--out", type=Path, default=Path("results/search_efficiency"),
                   help="folder for the tables' study, the CSV and the PNG")
    add_format(p)
    return p


def cases(args: argparse.Namespace) -> list[Case]:
    """The tables the flags name (``UsageError`` if bad)."""
    from workers.search import (
        SMOKE_PILOT_STEPS,
        plan_settings,
        profile_for,
        space_mlp_ratio,
        training_budget,
    )
    from workers.taskargs import task_from_args
    from workers.tasks import make_data_task, make_task

    size = "smoke" if args.smoke_test else "paper"
    profiled: dict[str, Callable[[], Any]] = {}  # a table's data as a file, to profile
    if args.table and args.space is not None:
        raise UsageError("--table: names a shipped table; --space brings its own")
    if args.space is not None:
        if args.task is None and args.data is None:
            raise UsageError("--space: give the task of its table (--task T or --data PATH)")
        specs: list[tuple[str, Path, Callable[[], Any]]] = [
            (args.space.stem, args.space, lambda: task_from_args(args))]
    elif args.task is not None or args.data is not None:
        raise UsageError("--task/--data: only with --space (the shipped tables have theirs)")
    else:
        from userdata import DataSpec
        from userdata.corpora import write_code, write_docs

        corpus = args.out / "corpus"
        specs = [("ngram", TABLES / "ngram.yaml", lambda: make_task("ngram", size, 0)),
                 ("lm", TABLES / "lm.yaml", lambda: make_task("lm", size, 0, length=64)),
                 ("stdlib", TABLES / "stdlib.yaml", lambda: make_data_task(DataSpec(str(
                     write_code(corpus, CORPUS_MB))), size, 0, 64))]
        # lm's corpus (pydoc_data's topics, the same bytes) as a file, so that its prior is
        # profiled by the pilot as stdlib's is; the table itself trains the lm task
        profiled["lm"] = lambda: make_data_task(DataSpec(str(write_docs(
            args.out / "docs", DOCS_MB))), size, 0, 64)
        specs = [spec for spec in specs if not args.table or spec[0] in args.table]
    out = []
    for name, path, make in specs:
        try:
            space = training_budget(load_space(path), args.smoke_test)
            space.grid()
        except SpaceError as err:
            raise UsageError(f"--space: {err} (the benchmark needs a finite space)") from None
        task = make()
        shape = (space.budget, space.depth, space_mlp_ratio(space))
        profiled_task = profiled[name]() if name in profiled else task
        profile = profile_for(profiled_task, written_profile(profiled_task, args), args.out,
                              shape, SMOKE_PILOT_STEPS if args.smoke_test else None)
        settings = plan_settings(space.budget, space.depth, task,
                                 None if profile is None else profile.inputs, shape[2])
        out.append(Case(name, space, task, settings))
    return out


def written_profile(task: Any, args: argparse.Namespace) -> Path | None:
    """The profile of ``task``'s data already written in ``--from-csv`` or ``--out``
    (``profile_for`` writes ``profile-NAME.yaml`` there), so a table's prior is profiled once,
    as the table is trained once; None: profile now."""
    path = getattr(task, "path", None)
    if path is None:
        return None
    for folder in (getattr(args, "from_csv", None), args.out):  # table_noise has no --from-csv
        if folder is not None and (folder / f"profile-{Path(path).name}.yaml").is_file():
            return Path(folder / f"profile-{Path(path).name}.yaml")
    return None


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if not args.replay:
        return fail(p.prog, "--replay: required (the benchmark replays each strategy against "
                            "a trained table; live searches per strategy and seed are not "
                            "offered)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from experiments import harness
    from workers.search import ray_session

    try:
        harness.prepare(args)
        benchmarks = cases(args)
        ashas = {"both": (False, True), "off": (False,), "on": (True,)}[args.asha]
        with ray_session():
            rows = [row for case in benchmarks for row in run_case(
                case, case_runs(case, args.out, args.from_csv), args.seeds,
                args.strategy or STRATEGIES, args.prior_temperature, ashas,
                args.values == "drawn")]
    except SearchFaultError as err:  # its table's training stopped: the same command resumes
        return fault(p.prog, str(err))
    except TransformerAllocError as err:
        return fail(p.prog, str(err))
    write_csv(args.out / "search_efficiency.csv", rows)
    plot(rows, args.out / "search_efficiency.png")
    summary = summarise(rows)
    write_csv(args.out / "search_efficiency_summary.csv", summary)
    verdicts = verdict(summary)
    print(render(summary, verdicts) if args.format == "table"
          else dump({"summary": summary, "goals": verdicts}, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
