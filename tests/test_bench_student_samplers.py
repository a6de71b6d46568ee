"""bench.student_samplers: recorded student studies read in run order, each seed against its own
best, random search's median from its exchangeable draws (replayed and geometric, with the exact
interval), and the goal's verdict."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import optuna
import pytest

from bench.student_samplers import (
    Run,
    clopper_pearson,
    first_within,
    geometric_median,
    main,
    replayed,
    verdict,
)

FIXED = ("plan", "uniform", "palu")


def record(url: str, name: str, fixed: list[float], sampled: list[float | None]) -> None:
    """A two-objective study: the fixed allocations first (labelled), then sampled trials
    (None: stopped by ASHA)."""
    study = optuna.create_study(study_name=name, storage=url,
                                directions=["minimize", "minimize"])
    for label, loss in zip(FIXED, fixed, strict=True):
        trial = study.ask()
        trial.set_user_attr("seed", label)
        study.tell(trial, [loss, 1.0])
    for value in sampled:
        trial = study.ask()
        if value is None:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, [value, 1.0])


def test_random_searchs_median_is_read_from_its_draws_and_each_seed_has_its_own_best(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    # seed 0: the prior reaches 3.00 (the best) at trial 6; random has 1 hit of 40 draws
    record(url, "p-prior-s0", [3.2, 3.3, 3.4], [3.1, 3.05, 3.0, None, 3.2])
    record(url, "p-random-s0", [3.2, 3.3, 3.4], [3.25] * 20 + [3.02] + [None] * 19)
    # seed 1: another plan, another best (2.0): 1% of 3.0 would take every trial here
    record(url, "p-prior-s1", [2.1, 2.2, 2.3], [2.0, 2.5])
    record(url, "p-random-s1", [2.1, 2.2, 2.3], [2.05] * 40)
    assert main(["--storage", url, "--prefix", "p", "--seeds", "0", "1", "--format",
                 "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    first = {(r["sampler"], r["seed"]): r["first_within"] for r in out["rows"]}
    assert first == {("prior", 0): 6, ("random", 0): 24, ("prior", 1): 4, ("random", 1): None}
    assert {r["seed"]: r["target"] for r in out["rows"]} == pytest.approx({0: 3.03, 1: 2.02})
    rnd = out["random"]
    assert (rnd["hits"], rnd["draws"]) == (1, 80)
    assert rnd["median"] == 3 + math.ceil(math.log(0.5) / math.log(1 - 1 / 80))  # 3 + 56
    low, high = rnd["interval"]
    assert low < rnd["median"] < high
    assert out["medians"]["prior"] == 5.0
    assert out["verdicts"] == {"prior": verdict(5.0, (low, high))}
    # another name for another run of a sampler (e.g. a prior centred elsewhere)
    record(url, "p-again-s0", [3.2, 3.3, 3.4], [3.01])
    record(url, "p-again-s1", [2.1, 2.2, 2.3], [2.5])
    assert main(["--storage", url, "--prefix", "p", "--seeds", "0", "1", "--samplers", "again",
                 "random", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["medians"]["again"] == math.inf and set(out["verdicts"]) == {"again"}
    assert out["least_medians"]["again"] == (4 + 5) / 2  # s1: none in its 4 trials, so 5


def test_a_replay_puts_the_fixed_trials_first_and_finds_the_one_hit_anywhere_after() -> None:
    run = Run("random", 0, (3.2, 3.3, 3.4, *([3.25] * 9), 3.0), fixed=3)
    found = replayed(run, 3.03, random.Random(0), replays=500)
    assert set(found) == set(range(4, 14))  # every place of the hit after the fixed three
    assert first_within(run.losses, 3.03) == 13


def test_the_geometric_median_and_its_exact_interval() -> None:
    assert geometric_median(0.0, 3) == math.inf and geometric_median(0.5, 3) == 4
    low, high = clopper_pearson(0, 100)
    assert low == 0.0 and high == pytest.approx(0.0362, abs=1e-4)  # the rule of three's cousin
    assert verdict(10, (25, 60)) == "holds" and verdict(31, (25, 60)) == "fails"
    assert verdict(20, (25, 60)) == "inconclusive"
    # runs that never came within: unknown beyond their trials, so not "fails" below half
    assert verdict(math.inf, (15, 74), least=25) == "inconclusive"
    assert verdict(math.inf, (15, 40), least=25) == "fails"


def test_a_seed_without_studies_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    record(url, "p-prior-s0", [3.2, 3.3, 3.4], [3.0])
    assert main(["--storage", url, "--prefix", "p", "--seeds", "0", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no study p-SAMPLER-s4" in err and len(err.splitlines()) == 1
