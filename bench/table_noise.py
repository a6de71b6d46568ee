"""python -m bench.table_noise [--out results/search_efficiency] [--noise-seeds 2] [--top 6]

How far a search-efficiency table's points move with the training seed, so that its targets
(within 1% and 0.5% of the best) and the allocator's rank are read against that noise. Each table
of ``bench.search_efficiency`` (the shipped ones, or ``--space`` with its task) is trained once
with training seed 0; here its ``--top`` best points and the allocator prior's mode (the point
the bound's energy ranks first) are retrained with training seeds 1..N into the study
``noise-NAME`` beside the table (``tables.db`` in ``--out``; built if absent, resumed if
interrupted). A table trained under another training recipe than today's
(``arch.training.RECIPE``, recorded on its study; a table from before 2026-11-28 has none) keeps
its ranking, and its points are retrained with seed 0 too, so that every seed compared is
today's recipe (a ``noise-NAME`` of another recipe is refused). Per point: its mean over seeds
0..N with the 95% interval, its rank in the table,
and the one-sided Welch p that it is worse than the table's ``--top``-th best (a point is in
the top group when it is not significantly worse, at 5%); per table: the seeds' SD pooled over
the points beside the 1% and 0.5% margins and the evaluation's standard error. Writes
``table_noise.csv`` (one row per table and point) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from alloc import Candidates, allocator_prior, candidates, point_key
from arch import RECIPE, ArchConfig
from bench.search_efficiency import (
    SEED,
    TARGETS,
    Case,
    add_table_args,
    allocator_starts,
    build_table,
    cases,
    load_table,
    table_url,
)
from common.cli import Parser, add_format, dump, fail, fault, int_in, render_table
from common.errors import TransformerAllocError, UsageError
from common.files import write_csv
from common.stats import interval, kth_best, noise, not_worse
from search_spaces import SearchSpace, parse_space
from workers.errors import SearchFaultError


@dataclass(frozen=True)
class TableNoise:
    """What the retrained points of one table measured: per point (its key) its value per
    training seed, and each retraining's evaluation standard error."""

    values: dict[str, dict[int, float]]
    eval_se: tuple[float, ...]


def seeded_space(space: SearchSpace, seeds: int) -> SearchSpace:
    """``space`` with the training seed a choice of 0..seeds (its own points are seed 0)."""
    data = {**space.data, "name": f"{space.name}-noise",
            "train": {**space.data.get("train", {}), "seed": list(range(seeds + 1))}}
    return parse_space(data, space.source)


def prior_mode(case: Case, cands: Candidates, table: dict[str, Any]) -> str | None:
    """The trained point the allocator's prior proposes first: its lowest energy, ties broken
    by the allocator's plan (``Prior.mode``)."""
    prior = allocator_prior(cands, case.settings, plan=allocator_starts(case)[1])
    among = np.array([i for i, p in enumerate(cands.params) if point_key(p) in table])
    if not len(among):
        return None
    return point_key(cands.params[prior.mode(among, np.random.default_rng(0))])


def retrain(case: Case, out: Path, seeds: int, chosen: list[str], first: int = 1
            ) -> TableNoise:
    """Every ``chosen`` point with training seeds ``first``..seeds, trained (or resumed) into
    ``noise-NAME``; seed 0 is the table's unless ``first`` is 0."""
    from experiments import harness
    from studies import open_storage, records as rec

    url, study = table_url(out), f"noise-{case.name}"
    if harness.study_exists(url, study) and study_recipe(url, study) != RECIPE:
        raise UsageError(f"study {study!r} in {str(out)!r} was trained under another training "
                         f"recipe than today's ({RECIPE}); delete it or give another --out")
    space = seeded_space(case.space, seeds)
    points = tuple({**json.loads(k), SEED: s} for k in chosen for s in range(first, seeds + 1))
    harness.search(space, case.task, len(points), url, study, out / "ray_results",
                   points=points)
    values: dict[str, dict[int, float]] = {k: {} for k in chosen}
    errors = []
    for t in optuna.load_study(study_name=study, storage=open_storage(url)).trials:
        if t.state != optuna.trial.TrialState.COMPLETE or t.value is None:
            continue
        key = point_key({k: v for k, v in t.params.items() if k != SEED})
        if key in values and first <= int(t.params[SEED]) <= seeds:
            values[key][int(t.params[SEED])] = float(t.value)
            if t.user_attrs.get(rec.VAL_LOSS_SE) is not None:
                errors.append(float(t.user_attrs[rec.VAL_LOSS_SE]))
    return TableNoise(values, tuple(errors))


def study_recipe(url: str, study: str) -> str | None:
    """The training recipe ``study`` was trained under (None: before the record, or no such
    study)."""
    from studies import open_storage

    try:
        attrs = optuna.load_study(study_name=study, storage=open_storage(url)).user_attrs
    except KeyError:
        return None
    return None if attrs.get("recipe") is None else str(attrs["recipe"])


def describe(params: Mapping[str, Any], arch: ArchConfig) -> str:
    """The architecture and the sampled training choices, e.g. ``mhsa 4x64 mlp2 lr=0.003``."""
    train = [f"{k.removeprefix('train.')}={format(v, 'g') if isinstance(v, float) else v}"
             for k, v in params.items() if k.startswith("train.")]
    return " ".join([arch.describe(), *train])


def measure(case: Case, out: Path, seeds: int, top: int) -> list[dict[str, Any]]:
    """One row per retrained point of ``case``'s table (see the module's docstring)."""
    url = table_url(out)
    build_table(case, url, out / "ray_results")
    table = load_table(url, f"table-{case.name}")
    # Lower is better below: a table that maximises is read negated.
    sign = -1.0 if case.task.higher_is_better else 1.0
    ranked = sorted(table, key=lambda k: sign * table[k].value)
    cands = candidates(case.space)
    names = {point_key(p): describe(p, a) for p, a in zip(cands.params, cands.archs)}
    mode = prior_mode(case, cands, table)
    chosen = list(dict.fromkeys(ranked[:top] + ([mode] if mode else [])))
    # A table trained under another recipe (arch.training.RECIPE) ranks the points, but its
    # seed-0 values are not comparable with seeds trained now: seed 0 is retrained too.
    stale = study_recipe(url, f"table-{case.name}") != RECIPE
    measured = retrain(case, out, seeds, chosen, first=0 if stale else 1)
    by_seed = {k: [*([] if stale else [table[k].value]),
                   *(v for _, v in sorted(measured.values[k].items()))] for k in chosen}
    losses = {k: [sign * v for v in values] for k, values in by_seed.items()}
    reference = kth_best({k: float(np.mean(v)) for k, v in losses.items()
                          if k in ranked[:top]}, min(top, len(ranked)))
    verdict = not_worse(losses, reference)
    spread = noise(losses, measured.eval_se)
    best = abs(min(float(np.mean(v)) for v in losses.values()))
    rows = []
    for k in chosen:
        at = interval(losses[k])
        low, high = sorted((sign * at.low, sign * at.high))
        rows.append({
            "table": case.name, "arch": names.get(k, k), "point": k,
            "table_rank": ranked.index(k) + 1, "table_value": table[k].value,
            "mean": sign * at.mean, "low": low, "high": high, "seeds": at.n,
            "reference": k == reference, "allocator_mode": k == mode,
            "p_worse": verdict.p_worse[k], "top_group": k in verdict.not_worse,
            "seed_sd": spread.seed_sd, "eval_se": spread.eval_se, "seed0_retrained": stale,
            **{f"margin_{t:g}": t * best for t in TARGETS}})
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    def num(x: float | None, digits: int = 4) -> str:
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else \
            f"{x:.{digits}f}"

    points = render_table(
        ["table", "point", "rank", "seed 0", "mean [95% interval]", "p worse", "top group"],
        [[r["table"], r["arch"] + (" (allocator)" if r["allocator_mode"] else "")
          + (" (reference)" if r["reference"] else ""), r["table_rank"],
          num(r["table_value"]), f"{num(r['mean'])} [{num(r['low'])}, {num(r['high'])}]",
          num(r["p_worse"], 3), "yes" if r["top_group"] else "NO"] for r in rows],
        right=[False, False, True, True, True, True, False])
    tables = render_table(
        ["table", "seed SD (pooled)", "eval SE", "1% margin", "0.5% margin", "SD / 1%"],
        [[r["table"], num(r["seed_sd"]), num(r["eval_se"]), num(r["margin_0.01"]),
          num(r["margin_0.005"]), f"{r['seed_sd'] / r['margin_0.01']:.2f}"]
         for r in {r["table"]: r for r in rows}.values()],
        right=[False] + [True] * 5)
    return f"{points}\n\n{tables}"


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m bench.table_noise", description=__doc__.split("\n\n")[1])
    add_table_args(p)
    p.add_argument("--noise-seeds", type=int_in(1, 9), default=2,
                   help="training seeds beside the table's own (default: 2)")
    p.add_argument("--top", type=int_in(2, 25), default=6,
                   help="the table's best points retrained; the last is the reference")
    p.add_argument("--out", type=Path, default=Path("results/search_efficiency"),
                   help="the folder of bench.search_efficiency (its tables.db)")
    add_format(p)
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from experiments import harness
    from workers.search import ray_session

    try:
        harness.prepare(args)
        benchmarks = cases(args)
        with ray_session():
            rows = [r for case in benchmarks
                    for r in measure(case, args.out, args.noise_seeds, args.top)]
    except SearchFaultError as err:  # its table's training stopped: the same command resumes
        return fault(p.prog, str(err))
    except TransformerAllocError as err:
        return fail(p.prog, str(err))
    write_csv(args.out / "table_noise.csv", rows)
    print(render(rows) if args.format == "table" else dump(rows, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
