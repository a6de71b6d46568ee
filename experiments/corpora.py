"""python -m experiments.corpora [--smoke-test] [--grid-csv CSV] [--finalists 6] [...]

Is the allocator's plan right on real text, beyond the seeds' noise? Three corpora present
wherever Python is: the standard library's **code**, its **documentation** text (``pydoc_data``
topics, English prose), and **records**, the Unicode Character Database as semicolon-separated
rows regenerated from the interpreter's ``unicodedata`` (tabular data: fixed fields, a counter,
long exact repeats; neither prose nor code). Stage 1, on each, is a **full grid** over the two
layers' head counts (1, 2, 4, 8 or 16 heads each, head dim = D / heads; D = 128, 2 layers, MLP
2x, windows of 64 bytes, 900 steps of 16 windows), two training seeds per point (or read from an
earlier run's ``corpora.csv`` with ``--grid-csv``); stage 2 retrains the **finalists** (the
grid's best 6 by mean, its top quartile, and every plan's point) with 3 seeds for 1,800 steps,
evaluated on 2,048 validation batches. Each plan (``plans()``: today **before**, the
``alloc.profile --no-pilot`` statistics and the attention-only rule, and **after**, the pilot
profile and the MLP-aware rule) is moved into the grid and is in the **top quartile** when it is
not significantly worse than the grid's 6th best of 25 on the finalists' seeds.

The plans are moved into the grid as the allocator's best layer of equal heads (``--uniform``:
the grid's layers are uniform); each gets its rank in the grid, its layer-0 head count's rank
among the five (mean over layer 1: the extraction layer is what the bound decides), its mean
and 95% interval over the finalists' seeds, and the one-sided Welch test's p-value against the
reference (``common.stats``; docs/results/corpora/NOISE.md states the rule). Every table states
its noise: the seeds' SD, the evaluation's mean standard error
(``workers.training.trainer.measure``) and their ratio. The studies (``corpora-CORPUS`` and
``corpora-CORPUS-finalists``) are resumed on a re-run, so only the profiles and plans are redone.
Writes ``corpora.csv`` (one row per grid point and corpus), ``corpora_finalists.csv``,
``corpora_plans.csv``, ``corpora.png`` and each corpus's profiles.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from alloc import (
    PilotRequest,
    Plan,
    PlanSettings,
    Profile,
    make_plan,
    read_allocator_inputs,
    uniform_plan,
    write_profile,
)
from common.cli import int_in
from common.errors import UsageError
from experiments import corpora_report as report, corpora_stages as stages, harness
from experiments.corpora_report import render
from experiments.corpora_stages import MAX_FINALIST_SEEDS
from search_spaces import SearchSpace, parse_space
from userdata import DataSpec, corpora as registry
from workers.profile import profile_data
from workers.search import plan_settings, training_budget
from workers.tasks import Task, make_data_task

NAME = "corpora"
CORPORA = registry.names(registry.DEVELOPMENT)  # code, docs, records
MLP_RATIO = 2  # the space hashes [2], as the grids were run


@dataclass(frozen=True)
class Sizes:
    """One run's sizes: the grid's (stage 1) and its finalists' evaluation (stage 2)."""

    budget: int
    depth: int
    length: int  # training window, and the offsets profiled
    megabytes: float  # of each corpus (docs is all of pydoc_data's topics when smaller)
    heads: tuple[int, ...]  # layer 0's choices (the extraction layer the theory solves)
    later_heads: tuple[int, ...]  # every later layer's
    seeds: tuple[int, ...]
    steps: int
    batch_size: int
    pilot_steps: int
    # The finalists' validation batches: enough that the evaluation's standard error is well
    # below the seeds' SD (docs/results/corpora/NOISE.md has the measurement).
    final_eval_batches: int


# 2,048 batches of 16 windows. Measured at the full size (docs, 4 | 4 heads, 900 steps, three
# seeds) an evaluation's SE is 0.15 / sqrt(batches): 0.0033 here (0.035 at the grid's 32), under
# a quarter of every corpus's pooled seed SD in the grid (code 0.013, records 0.016, docs 0.081);
# the SE of the difference of two models on these shared windows is 0.0006, a seventh of the
# code grid's median per-point seed SD (0.0044). It costs about a third of a finalist's training
# (15 s beside 48 s). docs/results/corpora/NOISE.md has the table.
FINAL_EVAL_BATCHES = 2048
GRID_EVAL_BATCHES = 32  # the grid's, as its studies were run (its space's hash)
SMOKE = Sizes(budget=16, depth=2, length=16, megabytes=0.05, heads=(1, 2), later_heads=(1,),
              seeds=(0, 1), steps=4, batch_size=4, pilot_steps=8, final_eval_batches=8)
FULL = Sizes(budget=128, depth=2, length=64, megabytes=2.0, heads=(1, 2, 4, 8, 16),
             later_heads=(1, 2, 4, 8, 16), seeds=(0, 1), steps=900, batch_size=16,
             pilot_steps=300, final_eval_batches=FINAL_EVAL_BATCHES)


# --- the grid ----------------------------------------------------------------------------------


def space(sizes: Sizes, corpus: str, final_steps: int | None = None) -> SearchSpace:
    """Every (layer-0, later-layer) head count, each with every seed; all else fixed. With
    ``final_steps``: the finalists' space (stage 2), the same grid trained that long with
    seeds 0..MAX_FINALIST_SEEDS-1 and ``final_eval_batches``."""
    name = f"{NAME}-{corpus}" + ("" if final_steps is None else "-finalists")
    steps = sizes.steps if final_steps is None else final_steps
    seeds = list(sizes.seeds) if final_steps is None else list(range(MAX_FINALIST_SEEDS))
    batches = GRID_EVAL_BATCHES if final_steps is None else sizes.final_eval_batches
    data = {"name": name, "budget": sizes.budget, "depth": sizes.depth,
            "sampler": "grid", "model": {"positional": "learned"},
            "layers": [{"layers": i, "heads": list(sizes.heads if i == 0 else sizes.later_heads),
                        "mlp_ratio": [MLP_RATIO]} for i in range(sizes.depth)],
            "train": {"steps": steps, "eval_every": steps, "eval_batches": batches,
                      "batch_size": sizes.batch_size, "lr": 3.0e-3, "weight_decay": 0.1,
                      "seed": seeds}}
    return training_budget(parse_space(data, name))


def task_for(folder: Path, sizes: Sizes) -> Task:
    return make_data_task(DataSpec(str(folder)), length=sizes.length)


def train_grid(args: argparse.Namespace, sizes: Sizes, corpus: str, folder: Path,
               profile: Path) -> str:
    """The corpus's grid study, trained (or resumed); returns its name. ``profile``: the
    corpus's profile (the grid sampler needs no plan; the search would otherwise make one)."""
    grid = space(sizes, corpus)
    study = f"{NAME}-{corpus}"
    harness.search(grid, task_for(folder, sizes), grid.size(10_000),
                   harness.storage_url(args, NAME), study, args.out / "ray_results",
                   profile=profile, quiet=args.quiet)
    return study


def sizes_of(args: argparse.Namespace) -> Sizes:
    return SMOKE if args.smoke_test else FULL


def corpora_of(args: argparse.Namespace) -> tuple[str, ...]:
    chosen = tuple(args.corpus or CORPORA)
    unknown = [c for c in chosen if c not in CORPORA]
    if unknown:
        raise UsageError(f"--corpus {unknown[0]!r}: must be one of {', '.join(CORPORA)}")
    return chosen


# --- the plans ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanPoint:
    """One way of planning: its profile, the allocator's plan, and the plan in the grid (the
    allocator's best layer of equal heads, ``--uniform``, which is what the grid holds)."""

    label: str
    profile: Profile
    settings: PlanSettings
    plan: str  # the exact plan, per layer
    point: tuple[int, int]  # heads of layer 0 and 1 of the uniform plan


def plan_from_profile(path: Path, budget: int, depth: int, task: Task,
                      mlp_ratio: float = MLP_RATIO, **rules: Any) -> Plan:
    """The plan ``alloc.solve --budget BUDGET --layers DEPTH --mlp-ratio R --profile PATH``
    makes for windows of ``task``'s length, with the ``PlanSettings`` fields of ``rules``
    replaced (an earlier rule: ``product_order=1``, ``max_block=1``, ...)."""
    settings = dataclasses.replace(
        plan_settings(budget, depth, task, read_allocator_inputs(path), mlp_ratio), **rules)
    return make_plan(settings)


def plan_point(label: str, profile: Profile, path: Path, sizes: Sizes, task: Task,
               **rules: Any) -> PlanPoint:
    """``profile`` written to ``path``, read back as ``alloc.solve --profile`` would, planned
    at the grid's width and depth with an MLP of 2x (``plan_from_profile``)."""
    write_profile(profile, path)
    plan = plan_from_profile(path, sizes.budget, sizes.depth, task, **rules)
    counts = [layer.n_heads for layer in uniform_plan(plan).arch.layers]
    return PlanPoint(label, profile, plan.settings, plan.arch.describe(),
                     (counts[0], counts[1]))


def plans(sizes: Sizes, folder: Path, out: Path, quiet: bool = False
          ) -> tuple[PlanPoint, ...]:
    """**before**: data statistics, the attention-only rule, one offset per head group, later
    layers copying layer 0; **previous**: the pilot and the MLP rule, still one offset per group
    and copied later layers; **after**: the pilot, the MLP rule, blocks averaged (§2.2) and
    later layers' head counts from their measured patterns (§4.1)."""
    spec, task = DataSpec(str(folder)), task_for(folder, sizes)
    before = profile_data(spec, seq_len=sizes.length)
    pilot = PilotRequest(spec, budget=sizes.budget, layers=sizes.depth, mlp_ratio=MLP_RATIO,
                         steps=sizes.pilot_steps, quiet=quiet)
    after = profile_data(spec, seq_len=sizes.length, pilot=pilot)
    return (plan_point("before", before, out / "profile-before.yaml", sizes, task,
                       product_order=1, max_block=1, patterns=None),
            plan_point("previous", after, out / "profile-previous.yaml", sizes, task,
                       max_block=1, patterns=None),
            plan_point("after", after, out / "profile-after.yaml", sizes, task))


# --- the table ---------------------------------------------------------------------------------


def ranked(losses: dict[tuple[int, int], dict[int, float]], seeds: tuple[int, ...]
           ) -> list[dict[str, Any]]:
    """One row per point with every seed: its losses, their mean and its rank (1 = best)."""
    rows = [{"heads_L0": h0, "heads_L1": h1, **{f"loss_seed{s}": by[s] for s in seeds},
             "loss": float(np.mean([by[s] for s in seeds]))}
            for (h0, h1), by in sorted(losses.items()) if all(s in by for s in seeds)]
    for rank, row in enumerate(sorted(rows, key=lambda r: r["loss"]), start=1):
        row["rank"] = rank
    return sorted(rows, key=lambda r: r["rank"])


def layer0_ranks(rows: list[dict[str, Any]]) -> dict[int, tuple[int, float]]:
    """Per layer-0 head count: its rank (1 = best) and mean loss over the layer-1 choices (what
    the extraction layer's choice is worth, the later layer averaged out)."""
    means = {h: float(np.mean([r["loss"] for r in rows if r["heads_L0"] == h]))
             for h in sorted({r["heads_L0"] for r in rows})}
    order = sorted(means, key=means.__getitem__)
    return {h: (order.index(h) + 1, means[h]) for h in means}


def seed_agreement(rows: list[dict[str, Any]], seeds: tuple[int, ...]) -> float | None:
    """Spearman correlation of the points' losses between the first two seeds."""
    if len(seeds) < 2 or len(rows) < 3:
        return None
    from scipy.stats import spearmanr

    rho = spearmanr([r[f"loss_seed{seeds[0]}"] for r in rows],
                    [r[f"loss_seed{seeds[1]}"] for r in rows]).statistic
    return float(rho)


def grid_stage(args: argparse.Namespace, sizes: Sizes, corpus: str, folder: Path,
               profile: Path, from_csv: stages.Stage | None
               ) -> tuple[stages.Stage, tuple[int, ...]]:
    """Stage 1: the grid's per-seed losses, from ``--grid-csv`` or trained (or resumed) into
    its study, and the seeds every point has."""
    if from_csv is None:
        study = train_grid(args, sizes, corpus, folder, profile)
        return stages.read_study(harness.storage_url(args, NAME), study), sizes.seeds
    common = set.intersection(*(set(by) for by in from_csv.losses.values()))
    return from_csv, tuple(sorted(common))


def corpus_result(args: argparse.Namespace, sizes: Sizes, corpus: str,
                  from_csv: stages.Stage | None = None) -> dict[str, Any]:
    """The corpus written, profiled and planned each way, its grid trained (or resumed, or
    read from ``--grid-csv``), its finalists retrained, and each plan judged."""
    out = args.out / corpus
    folder = registry.corpus(corpus).write(out / "text", sizes.megabytes)
    points = plans(sizes, folder, out, args.quiet)
    profile = out / "profile-before.yaml"
    grid, seeds = grid_stage(args, sizes, corpus, folder, profile, from_csv)
    rows = ranked(grid.losses, seeds)
    if not rows:
        raise RuntimeError(f"{corpus}: no grid point has every seed")
    top = max(1, len(rows) // 4)
    where = {p.label: p.point for p in points}
    chosen = stages.finalists(rows, args.finalists, top, list(where.values()))
    final = stages.train_finalists(args, space(sizes, corpus, final_steps(args, sizes)),
                                   task_for(folder, sizes), f"{NAME}-{corpus}-finalists",
                                   chosen, final_seeds(args), profile)
    judged = stages.judge(rows, final, top, where)
    by_point = {(r["heads_L0"], r["heads_L1"]): r for r in rows}
    marginal = layer0_ranks(rows)
    result: dict[str, Any] = {
        "corpus": corpus, "megabytes": sum(p.stat().st_size for p in folder.iterdir()) / 1e6,
        "points": len(rows), "top_quartile": top, "seeds": list(seeds),
        "seed_spearman": seed_agreement(rows, seeds), "grid_noise": stages.describe_noise(grid),
        "best": rows[0], "rows": rows, "plans": list(where),
        "finalists": {"seeds": final_seeds(args), "steps": final_steps(args, sizes),
                      "eval_batches": sizes.final_eval_batches,
                      **{k: v for k, v in judged.items() if k != "plans"}},
        "layer0": {str(h): {"rank": rank, "loss": loss} for h, (rank, loss) in marginal.items()}}
    for p in points:
        row = by_point.get(p.point)
        result[p.label] = {
            "plan": p.plan, "grid_point": list(p.point), "rank": row and row["rank"],
            "loss": row and row["loss"], "inputs": describe_inputs(p.settings),
            "layer0_rank": marginal.get(p.point[0], (None, None))[0],
            "sources": p.profile.inputs.sources,
            "pilot_seconds": p.profile.pilot.seconds if p.profile.pilot else None,
            "final": judged["plans"][p.label]}
        for r in rows:
            r[p.label] = (r["heads_L0"], r["heads_L1"]) == p.point
    return result


def final_steps(args: argparse.Namespace, sizes: Sizes) -> int:
    """``--finalist-steps``, else twice the grid's."""
    return int(args.finalist_steps or 2 * sizes.steps)


def final_seeds(args: argparse.Namespace) -> int:
    """``--finalist-seeds``, else 3 (2 at smoke size: a test's seconds)."""
    return int(args.finalist_seeds or (2 if args.smoke_test else 3))


def describe_inputs(s: PlanSettings) -> str:
    spectrum = "measured input spectrum" if s.input_spectrum else f"d_in {s.input_dim}"
    return (f"kernel {s.kernel}, {spectrum}, compression order "
            f"{s.compression_order}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from workers.search import ray_session  # Ray: only when the experiment runs, not for --help

    sizes, chosen = sizes_of(args), corpora_of(args)  # bad --corpus: before any work
    from_csv = (None if args.grid_csv is None else
                stages.read_grid_csv(args.grid_csv, chosen, sizes.heads, sizes.later_heads))
    harness.prepare(args)
    results = []
    with ray_session(), harness.runs(args, NAME, len(chosen), "corpora") as bar:
        for k, corpus in enumerate(chosen, start=1):
            bar.write(f"{NAME}: corpus {k}/{len(chosen)}: {corpus}: profile, plan, its "
                      "grid's search and its finalists'")
            results.append(corpus_result(args, sizes, corpus,
                                         None if from_csv is None else from_csv[corpus]))
            bar.update(1)
            bar.event(f"{corpus} done")
    report.write_tables(results, args.out)
    report.plot(results, sizes.heads, sizes.later_heads, args.out / "corpora.png")
    return {"sizes": dataclasses.asdict(sizes), "corpora": results, "out": str(args.out)}


def build_parser() -> argparse.ArgumentParser:
    parser = harness.build_parser(NAME, __doc__, studies=True)
    parser.add_argument("--corpus", action="append", metavar="NAME",
                        help=f"only this corpus (repeatable; default: {', '.join(CORPORA)})")
    parser.add_argument("--grid-csv", type=Path, metavar="PATH",
                        help="stage 1 read from an earlier run's corpora.csv (columns corpus, "
                             "heads_L0, heads_L1, loss_seed0, loss_seed1, ...) instead of "
                             "trained")
    parser.add_argument("--finalists", type=int_in(1), default=6, metavar="N",
                        help="stage 2 retrains the grid's best N points by mean (and always "
                             "its top quartile and every plan's point)")
    parser.add_argument("--finalist-seeds", type=int_in(1, stages.MAX_FINALIST_SEEDS),
                        metavar="N", help="the finalists' training seeds, 0..N-1 (default: 3, "
                                          "2 with --smoke-test)")
    parser.add_argument("--finalist-steps", type=int_in(1), metavar="STEPS",
                        help="the finalists' training steps (default: twice the grid's: "
                             f"{2 * FULL.steps}, {2 * SMOKE.steps} with --smoke-test)")
    return parser


def main(argv: list[str] | None = None) -> int:
    return harness.main(build_parser(), argv, run, render)


if __name__ == "__main__":
    sys.exit(main())
