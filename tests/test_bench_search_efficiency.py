"""bench.search_efficiency: a space file the test writes is trained into a table through the
launcher, every strategy replays against it, and the replay's bookkeeping is exact (no strategy
trains a point twice, targets within 1% and 0.5% of the table's best, trials and training cost
counted as the replay ran, graded priors centred where they say)."""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import optuna
import pytest

from alloc.prior.bound import candidates, point_key
from alloc.prior.sampler import PriorSampler
from alloc.settings import PlanSettings
from arch import ModelIO
from bench import table_noise
from bench.search_efficiency import (
    STRATEGIES,
    Entry,
    Outcome,
    Priors,
    Runs,
    Strategy,
    main,
    make_strategy,
    replay,
    to_target,
)
from common.files import write_yaml
from search_spaces import SearchSpace, parse_space

IO = ModelIO(4, vocab_size=5)


def small_space() -> SearchSpace:
    return parse_space({"name": "t", "budget": 16, "depth": 1, "sampler": "grid",
                        "layers": [{"heads": [1, 2, 4, 8]}],
                        "train": {"steps": 30, "eval_every": 10}})


@pytest.mark.usefixtures("shared_ray")
def test_smoke_run_on_a_space_file_replays_every_strategy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Both benchmarks in this process, on its Ray (``shared_ray``)."""
    monkeypatch.chdir(tmp_path)
    space = tmp_path / "six.yaml"
    write_yaml(space, {"name": "six", "budget": 16, "depth": 1, "sampler": "grid",
                       "layers": [{"layers": "all", "heads": [1, 2, 4], "mlp_ratio": [0, 2]}],
                       "train": {"lr": 3.0e-3}})
    result = json.loads(printed(capsys, main, [
        "--replay", "--space", str(space), "--task", "ngram", "--smoke-test", "--seeds", "3",
        "--out", str(tmp_path / "out"), "--format", "json"]))
    assert {(s["table"], s["strategy"], s["asha"]) for s in result["summary"]} == {
        ("six", s, a) for s in STRATEGIES for a in (False, True)}
    for s in result["summary"]:  # no repeats: every strategy reaches both targets in 6 trials
        assert s["seeds"] == 3 and s["reached_0.005"] == 3 and s["iqr_trials_0.005"][1] <= 6
    assert [g["table"] for g in result["goals"]] == ["six"]
    out = tmp_path / "out"
    with (out / "search_efficiency.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    table = optuna.load_study(study_name="table-six", storage=f"sqlite:///{out / 'tables.db'}")
    values = [t.value for t in table.get_trials(states=(optuna.trial.TrialState.COMPLETE,))]
    assert len(values) == 6 and float(rows[0]["best"]) == min(values)  # MSE is minimised
    assert (out / "search_efficiency.png").stat().st_size > 10_000
    assert_the_table_noise_is_its_points_over_seeds(space, out, capsys)


def printed(capsys: pytest.CaptureFixture[str], run: Callable[[list[str]], int],
            argv: list[str]) -> str:
    """What ``run(argv)`` printed on stdout; it must exit 0 (else its stderr's end is shown)."""
    capsys.readouterr()
    code = run(argv)
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    return out


def assert_the_table_noise_is_its_points_over_seeds(space: Path, out: Path,
                                                    capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
    """bench.table_noise on the trained table: its 2 best points and the allocator's mode
    retrained with seed 1; each row is the mean and interval of the table's value and that
    retraining, the pooled seed SD is theirs, the reference is the 2nd best."""
    rows = json.loads(printed(capsys, table_noise.main, [
        "--space", str(space), "--task", "ngram", "--smoke-test", "--top", "2", "--noise-seeds",
        "1", "--out", str(out), "--format", "json"]))
    url = f"sqlite:///{out / 'tables.db'}"
    table = {point_key(t.params): t.value for t in optuna.load_study(
        study_name="table-six", storage=url).trials}
    again = {point_key({k: v for k, v in t.params.items() if k != "train.seed"}): t.value
             for t in optuna.load_study(study_name="noise-six", storage=url).trials}
    assert len(again) == len(rows) and {r["point"] for r in rows} == set(again)
    assert [r["table_rank"] for r in rows][:2] == [1, 2]
    assert sum(r["allocator_mode"] for r in rows) == 1
    assert [r["reference"] for r in rows][:2] == [False, True]
    for r in rows:
        assert r["table_value"] == table[r["point"]] and r["seeds"] == 2
        assert r["mean"] == pytest.approx((table[r["point"]] + again[r["point"]]) / 2)
        assert r["low"] <= r["mean"] <= r["high"]
    pooled = math.sqrt(np.mean([(table[k] - again[k]) ** 2 / 2 for k in again]))
    assert rows[0]["seed_sd"] == pytest.approx(pooled)


def test_every_strategy_tries_each_point_once_and_finds_the_best_exactly() -> None:
    space = small_space()
    table = {point_key(p): Entry(float(i), {10: 9.0, 20: 9.0, 30: float(i)})
             for i, p in enumerate(space.grid())}
    cands = candidates(space)
    values = np.array([table[point_key(p)].value for p in cands.params])
    priors = Priors(cands, PlanSettings(budget=16, layers=1, seq_len=4), values, None)
    for name in STRATEGIES:
        strategy = make_strategy(name, 3, priors, [space.grid()[2]], list(table), False)
        outcomes = replay(space, IO, table, strategy, False, 10, False, 3)
        assert sorted(o.value for o in outcomes) == [0.0, 1.0, 2.0, 3.0], name
        first = [o.value for o in outcomes].index(0.0) + 1.0
        assert to_target(outcomes, 0.0, False, 30) == (first, first)
    for grade, centre in (("prior-best", 0.0), ("prior-worst", 3.0)):
        prior = make_strategy(grade, 0, priors, [], list(table), False).sampler
        assert isinstance(prior, PriorSampler)
        mode = prior.prior.mode(np.arange(len(cands)), np.random.default_rng(0))
        assert values[mode] == centre, grade


def test_replays_draw_each_point_s_run_by_their_seed() -> None:
    """A point with several training runs gives each replay one of them, drawn by the replay's
    seed (the same seed, the same draw); a point with one run always gives it; the runs survive
    the CSV that ships them."""
    space = small_space()
    keys = [point_key(p) for p in space.grid()]
    runs = Runs({keys[0]: {0: Entry(1.0, {30: 1.0}), 1: Entry(2.0, {30: 2.0}),
                           2: Entry(3.0, {30: 3.0})},
                 keys[1]: {0: Entry(5.0, {10: 6.0, 30: 5.0})}})
    assert runs.seed(0) == {keys[0]: Entry(1.0, {30: 1.0}), keys[1]: Entry(5.0, {10: 6.0,
                                                                                30: 5.0})}
    assert runs.seeds_per_point() == {1: 1, 3: 1}
    draws = [runs.draw(random.Random(f"values {seed}")) for seed in range(60)]
    assert {d[keys[0]].value for d in draws} == {1.0, 2.0, 3.0}
    assert {d[keys[1]].value for d in draws} == {5.0}
    assert draws[7] == runs.draw(random.Random("values 7"))


def test_the_runs_csv_round_trips_and_a_bad_one_is_named(tmp_path: Path) -> None:
    from bench.search_efficiency import read_runs, write_runs
    from common.errors import UsageError

    space = small_space()
    keys = [point_key(p) for p in space.grid()]
    runs = Runs({keys[0]: {0: Entry(1.5, {10: 2.0, 30: 1.5}), 2: Entry(1.25, {30: 1.25})},
                 keys[3]: {0: Entry(0.5, {})}})
    write_runs(tmp_path / "table-t.csv", runs)
    assert read_runs(tmp_path / "table-t.csv") == runs
    (tmp_path / "bad.csv").write_text("point,seed\n{},x\n")
    with pytest.raises(UsageError, match=r"bad\.csv"):
        read_runs(tmp_path / "bad.csv")


def test_to_target_counts_pruned_trials_as_partial_cost() -> None:
    outcomes = [Outcome(None, 10), Outcome(5.0, 30), Outcome(None, 10), Outcome(1.0, 30)]
    assert to_target(outcomes, 1.0, False, 30) == (4.0, 80 / 30)
    assert to_target(outcomes, 0.5, False, 30) == (math.inf, math.inf)
    assert to_target(outcomes, 5.0, True, 30) == (2.0, 40 / 30)


def test_a_point_that_failed_to_train_costs_a_trial_and_finds_nothing() -> None:
    space = small_space()
    grid = space.grid()
    table = {point_key(p): Entry(1.0, {30: 1.0}) for p in grid[1:]}  # grid[0] failed to train
    strategy = Strategy(optuna.samplers.RandomSampler(seed=0), [grid[0]])
    outcomes = replay(space, IO, table, strategy, False, 20, False)
    assert Outcome(None, 30) in outcomes and all(o.value in (None, 1.0) for o in outcomes)


def test_without_replay_it_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    from bench.search_efficiency import main

    assert main(["--smoke-test", "--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


def test_seeds_that_are_one_point_cost_one_trial_as_in_the_launcher() -> None:
    """The allocator's plan, its uniform variant and the baseline are often the same point;
    the launcher enqueues it once (skip_if_exists), and so does the replay."""
    space = small_space()
    grid = space.grid()
    table = {point_key(p): Entry(float(i), {30: float(i)}) for i, p in enumerate(grid)}
    strategy = Strategy(optuna.samplers.TPESampler(seed=0), [grid[2], grid[2], grid[2]])
    values = [o.value for o in replay(space, IO, table, strategy, False, 3, False)]
    assert values[0] == 2.0 and len(set(values)) == 3  # once, and no point twice
