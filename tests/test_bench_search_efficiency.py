"""bench.search_efficiency: the tables are trained through the launcher, every strategy replays
against them, and the replay's bookkeeping is exact (a grid visits each point once, the target
is within 2% of the table's best, trials and training cost are counted as the replay ran)."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import optuna

from arch import ModelIO
from bench.search_efficiency import STRATEGIES, Entry, Outcome, key, replay, to_target
from search_spaces import parse_space
from tests.test_search import ray_tmp

ROOT = Path(__file__).resolve().parents[1]


def test_smoke_run_replays_every_strategy(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.search_efficiency", "--replay",
                           "--smoke-test", "--seeds", "5", "--out", str(tmp_path),
                           "--format", "json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ,
                                            "RAY_TMPDIR": str(ray_tmp(tmp_path))})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert {(s["bench"], s["strategy"], s["asha"]) for s in summary} == {
        (b, s, a) for b in ("ngram", "lm") for s in STRATEGIES for a in (False, True)}
    for s in summary:
        assert s["seeds"] == 5 and s["reached"] == 5  # 3x the table's size always suffices
        if s["strategy"] == "grid":  # without replacement: within the table
            assert s["iqr_trials"][1] <= s["table_size"]
    with (tmp_path / "search_efficiency.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    tables = optuna.load_study(study_name="table-ngram",
                               storage=f"sqlite:///{tmp_path / 'tables.db'}")
    values = [t.value for t in tables.get_trials(states=(optuna.trial.TrialState.COMPLETE,))]
    ngram = [r for r in rows if r["bench"] == "ngram"]
    assert float(ngram[0]["best"]) == min(values)  # ngram's MSE is minimised
    assert float(ngram[0]["target"]) == min(values) * 1.02
    assert (tmp_path / "search_efficiency.png").stat().st_size > 10_000


def test_grid_replay_visits_every_point_once_and_the_target_is_found_exactly() -> None:
    space = parse_space({"name": "t", "budget": 16, "depth": 1, "sampler": "grid",
                         "layers": [{"heads": [1, 2, 4, 8]}],
                         "train": {"steps": 30, "eval_every": 10}})
    io = ModelIO(4, vocab_size=5)
    table = {key(p): Entry(float(i), {10: 9.0, 20: 9.0, 30: float(i)})
             for i, p in enumerate(space.grid())}
    outcomes = replay(space, io, table, "grid", seed=3, asha=False, trials=4, starts=[],
                      maximize=False)
    assert sorted(o.value for o in outcomes) == [0.0, 1.0, 2.0, 3.0]  # type: ignore[type-var]
    assert to_target(outcomes, 0.0, False, 30) == (
        1.0 + [o.value for o in outcomes].index(0.0), 1.0 + [o.value for o in outcomes].index(
            0.0))
    seeded = replay(space, io, table, "seeded-tpe", seed=0, asha=False, trials=2,
                    starts=[space.grid()[2]], maximize=False)
    assert seeded[0].value == 2.0  # the enqueued start is the first trial


def test_to_target_counts_pruned_trials_as_partial_cost() -> None:
    outcomes = [Outcome(None, 10), Outcome(5.0, 30), Outcome(None, 10), Outcome(1.0, 30)]
    assert to_target(outcomes, 1.0, False, 30) == (4.0, 80 / 30)
    assert to_target(outcomes, 0.5, False, 30) == (math.inf, math.inf)
    assert to_target(outcomes, 5.0, True, 30) == (2.0, 40 / 30)


def test_a_point_that_failed_to_train_costs_a_trial_and_finds_nothing() -> None:
    space = parse_space({"name": "t", "budget": 16, "depth": 1, "sampler": "grid",
                         "layers": [{"heads": [1, 2, 4, 8]}],
                         "train": {"steps": 30, "eval_every": 10}})
    grid = space.grid()
    table = {key(p): Entry(1.0, {30: 1.0}) for p in grid[1:]}  # grid[0] failed to train
    outcomes = replay(space, ModelIO(4, vocab_size=5), table, "random", seed=0, asha=False,
                      trials=20, starts=[grid[0]], maximize=False)
    assert Outcome(None, 30) in outcomes and all(o.value in (None, 1.0) for o in outcomes)


def test_without_replay_it_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    from bench.search_efficiency import main

    assert main(["--smoke-test", "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


def test_seeds_that_are_one_point_cost_one_trial_as_in_the_launcher() -> None:
    """The allocator's plan, its uniform variant and the baseline are often the same point;
    the launcher enqueues it once (skip_if_exists), and so does the replay."""
    space = parse_space({"name": "t", "budget": 16, "depth": 1, "sampler": "grid",
                         "layers": [{"heads": [1, 2, 4, 8]}],
                         "train": {"steps": 30, "eval_every": 10}})
    grid = space.grid()
    table = {key(p): Entry(float(i), {30: float(i)}) for i, p in enumerate(grid)}
    outcomes = replay(space, ModelIO(4, vocab_size=5), table, "seeded-tpe", seed=0, asha=False,
                      trials=3, starts=[grid[2], grid[2], grid[2]], maximize=False)
    values = [o.value for o in outcomes]
    assert values[0] == 2.0 and values != [2.0, 2.0, 2.0]  # enqueued three times: 2, 2, 2
