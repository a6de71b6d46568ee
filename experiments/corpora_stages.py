"""The corpora experiment's two stages and its verdicts (``experiments.corpora``).

Stage 1 is the grid: every point with a few seeds, its per-seed losses read from its study or
from an earlier run's ``corpora.csv`` (``--grid-csv``). Stage 2 is the finalists: the grid's
best points by mean, its k best (the reference among them) and every plan's point, retrained
longer, with more seeds and a longer evaluation, into their own study. A plan's verdict uses
the finalists' seeds: it is in the top quartile when it is not significantly worse than the
grid's k-th best (``common.stats.not_worse``: one-sided Welch, 5%).
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import Problem, UsageError
from common.stats import Interval, interval, kth_best, noise, not_worse
from experiments import harness
from search_spaces import SearchSpace
from workers.tasks import Task

Point = tuple[int, int]  # heads of layer 0 and layer 1
Losses = dict[Point, dict[int, float]]  # per point, its loss per training seed
SEED_COLUMN = re.compile(r"loss_seed(\d+)")
GRID_COLUMNS = ("corpus", "heads_L0", "heads_L1")
# The finalists' space holds seeds 0..MAX_FINALIST_SEEDS - 1, whatever --finalist-seeds asks:
# its hash does not change with it, so a re-run with more seeds resumes the study.
MAX_FINALIST_SEEDS = 10


@dataclass(frozen=True)
class Stage:
    """What a stage measured: each point's loss per seed, and each evaluation's standard error
    (empty where none was recorded: a ``--grid-csv`` or an older study)."""

    losses: Losses
    eval_se: tuple[float, ...] = ()


def point_of(params: Mapping[str, Any]) -> Point:
    return int(params["L0.g0.count"]), int(params["L1.g0.count"])


def read_study(url: str, study: str, points: Collection[Point] | None = None,
               seeds: int | None = None) -> Stage:
    """The fully trained trials of ``study`` (of ``points`` and seeds 0..seeds-1 only, when
    given): loss per point and seed, and their eval SEs."""
    import optuna

    from studies import open_storage, records as rec

    losses: Losses = {}
    errors = []
    for t in optuna.load_study(study_name=study, storage=open_storage(url)).trials:
        point, seed = point_of(t.params), int(t.params["train.seed"])
        if (points is not None and point not in points) or (seeds is not None and seed >= seeds):
            continue
        if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None:
            losses.setdefault(point, {})[seed] = t.value
            if t.user_attrs.get(rec.VAL_LOSS_SE) is not None:
                errors.append(float(t.user_attrs[rec.VAL_LOSS_SE]))
    return Stage(losses, tuple(errors))


# --- stage 1 from an earlier run's corpora.csv ---------------------------------------------------


def read_grid_csv(path: Path, corpora: Sequence[str], heads: Sequence[int],
                  later_heads: Sequence[int]) -> dict[str, Stage]:
    """Per corpus of ``corpora``: the grid's per-seed losses in ``path`` (columns corpus,
    heads_L0, heads_L1, loss_seed0, loss_seed1, ...; others ignored).

    Raises:
        UsageError: the file is missing, lacks a column, or holds a value that is not one of
            the grid's (one line naming the line and the field).
    """
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            columns = list(reader.fieldnames or [])
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise _grid_error(path, f"cannot be read ({err})") from None
    seeds = {int(m.group(1)): c for c in columns if (m := SEED_COLUMN.fullmatch(c))}
    missing = [c for c in GRID_COLUMNS if c not in columns] + ([] if seeds else ["loss_seed0"])
    if missing:
        raise _grid_error(path, f"no column {missing[0]} (needs {', '.join(GRID_COLUMNS)}, "
                                "loss_seed0, loss_seed1, ...: an earlier run's corpora.csv)")
    out: dict[str, Losses] = {c: {} for c in corpora}
    choices = {"heads_L0": tuple(heads), "heads_L1": tuple(later_heads)}
    for line, row in enumerate(rows, start=2):
        here = f"line {line}"
        if row["corpus"] not in out:
            continue
        point = tuple(_head(row, key, choices[key], path, here) for key in choices)
        if point in out[row["corpus"]]:
            raise _grid_error(path, f"{here}: {row['corpus']} {point[0]} | {point[1]} heads "
                                    "again")
        out[row["corpus"]][(point[0], point[1])] = {
            seed: _loss(row, column, path, here) for seed, column in sorted(seeds.items())}
    empty = [c for c, losses in out.items() if not losses]
    if empty:
        raise _grid_error(path, f"no row of corpus {empty[0]!r}")
    return {c: Stage(losses) for c, losses in out.items()}


def _grid_error(path: Path, rule: str) -> UsageError:
    """The error for the grid's CSV file ``path`` breaking ``rule``: a problem of the field
    ``grid_csv`` (the command's ``--grid-csv``)."""
    return UsageError.of([Problem("grid_csv", repr(str(path)), rule)])


def _head(row: Mapping[str, str], key: str, choices: tuple[int, ...], path: Path,
          here: str) -> int:
    value = (row.get(key) or "").strip()
    if not value.isdigit() or int(value) not in choices:
        raise _grid_error(path, f"{here}: {key} = {value!r}: not a head count of this grid "
                                f"({', '.join(map(str, choices))})")
    return int(value)


def _loss(row: Mapping[str, str], key: str, path: Path, here: str) -> float:
    value = (row.get(key) or "").strip()
    try:
        loss = float(value)
    except ValueError:
        loss = math.nan
    if not math.isfinite(loss) or loss < 0:
        raise _grid_error(path, f"{here}: {key} = {value!r}: not a loss (a finite number >= 0)")
    return loss


# --- stage 2: the finalists ---------------------------------------------------------------------


def finalists(rows: Sequence[Mapping[str, Any]], count: int, top: int,
              plans: Sequence[Point]) -> list[Point]:
    """The grid's best ``count`` points by mean (``rows``: ranked, best first), at least its
    ``top`` best (the reference is the last of them), then the plans' points in the grid."""
    chosen = [(int(r["heads_L0"]), int(r["heads_L1"])) for r in rows[:max(count, top)]]
    grid = {(int(r["heads_L0"]), int(r["heads_L1"])) for r in rows}
    return chosen + [p for p in dict.fromkeys(plans) if p in grid and p not in chosen]


def finalist_points(space: SearchSpace, chosen: Sequence[Point], seeds: int
                    ) -> tuple[dict[str, Any], ...]:
    """The params of every chosen point with seeds 0..seeds-1, point by point."""
    grid = space.grid()
    return tuple(p for point in chosen for p in grid
                 if point_of(p) == point and int(p["train.seed"]) < seeds)


def train_finalists(args: Any, space: SearchSpace, task: Task, study: str, chosen: Sequence[Point],
                    seeds: int, profile: Path) -> Stage:
    """The ``chosen`` points with seeds 0..seeds-1 trained (or resumed) into ``study`` (in
    ``args``' storage); what it holds of them."""
    url, points = harness.storage_url(args, "corpora"), finalist_points(space, chosen, seeds)
    harness.search(space, task, len(points), url, study, args.out / "ray_results",
                   profile=profile, quiet=args.quiet, points=points)
    return read_study(url, study, set(chosen), seeds)


# --- the verdicts -------------------------------------------------------------------------------


def describe_noise(stage: Stage) -> dict[str, Any]:
    """The stage's noise: the seeds' SD, the evaluations' mean SE, their ratio, in words."""
    measured = noise({p: list(v.values()) for p, v in stage.losses.items()}, stage.eval_se)
    ratio = None if math.isnan(measured.ratio) else measured.ratio
    return {"seed_sd": measured.seed_sd, "eval_se": None if not stage.eval_se else
            measured.eval_se, "ratio": ratio,
            "text": measured.describe() if stage.eval_se else
            f"seed SD {measured.seed_sd:.4f}, eval SE not recorded"}


def _interval(losses: Mapping[int, float] | None) -> Interval | None:
    return interval(list(losses.values())) if losses else None


def judge(rows: Sequence[Mapping[str, Any]], final: Stage, top: int,
          plans: Mapping[str, Point]) -> dict[str, Any]:
    """The finalists' table and each plan's verdict: the reference is the grid's ``top``-th
    best by its mean (``rows``: the grid, ranked), compared with the finalists' seeds."""
    grid = {(int(r["heads_L0"]), int(r["heads_L1"])): r for r in rows}
    reference = kth_best({p: float(r["loss"]) for p, r in grid.items()}, top)
    losses = {p: list(v.values()) for p, v in final.losses.items()}
    verdict = not_worse(losses, reference) if reference in losses else None
    table = []
    for point, by_seed in final.losses.items():
        at = _interval(by_seed)
        assert at is not None
        table.append({
            "heads_L0": point[0], "heads_L1": point[1], "grid_rank": grid[point]["rank"],
            "grid_loss": grid[point]["loss"], "loss": at.mean, "low": at.low, "high": at.high,
            "seeds": at.n, "p_worse": verdict and verdict.p_worse[point],
            "not_worse": verdict is not None and point in verdict.not_worse,
            "reference": point == reference,
            "plans": " ".join(label for label, p in plans.items() if p == point)})
    return {"reference": {"grid_point": list(reference), "grid_rank": top,
                          "grid_loss": grid[reference]["loss"]},
            "noise": describe_noise(final), "rows": table,
            "plans": {label: plan_verdict(point, final, verdict)
                      for label, point in plans.items()}}


def plan_verdict(point: Point, final: Stage, verdict: Any) -> dict[str, Any]:
    """A plan on the finalists: its mean and interval, its p-value against the reference, and
    ``top_quartile`` (None: the plan is not a finalist, e.g. beyond the grid)."""
    at = _interval(final.losses.get(point))
    if at is None or verdict is None:
        return {"loss": None, "low": None, "high": None, "seeds": 0, "p_worse": None,
                "top_quartile": None}
    return {"loss": at.mean, "low": at.low, "high": at.high, "seeds": at.n,
            "p_worse": verdict.p_worse[point], "top_quartile": point in verdict.not_worse}
