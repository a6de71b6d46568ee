"""Early stopping (``workers.search.schedule``): milestones at evaluation steps, the best ten
trials of every milestone kept, successive halving past them (equal to brute force), and a trial
retried from a checkpoint judged at the same milestones, by the values measured there, as a
fresh trial (the trial function without Ray)."""

from __future__ import annotations

import math
import random
import shutil
from pathlib import Path

import pytest

from arch import ArchConfig, HeadGroup, LayerSpec
from studies.trials import Direction
from workers.search.protocol import STEP, TrialJob, TrialReport, TrialSpec
from workers.search.schedule import FULL_TRIALS, Halving, Rungs
from workers.search.trial import train_trial
from workers.tasks import describe_task, make_task


def test_milestones_are_evaluation_steps_at_a_third_and_two_thirds() -> None:
    assert Rungs.for_training(2000, 100).milestones == (700, 1400)
    assert Rungs.for_training(40, 10).milestones == (20, 30)
    assert Rungs.for_training(30, 10).milestones == (10, 20)
    assert Rungs.for_training(10, 10).milestones == ()  # one evaluation: nothing to compare


@pytest.mark.parametrize("trials", [14, 40])
def test_a_milestone_stops_only_past_the_best_ten_and_the_best_third(trials: int) -> None:
    rng = random.Random(trials)
    values = [rng.random() for _ in range(trials)]
    halving = Halving(Rungs((10,), 30), maximize=False)
    stopped = 0
    for n, value in enumerate(values):
        better = sum(v < value for v in values[:n])
        expected = better < max(FULL_TRIALS, math.ceil((n + 1) / 3))
        assert halving.judge(f"t{n}", 10, value) == expected, n
        assert halving.judge(f"t{n}", 20, value)  # judged once per milestone
        stopped += not expected
    assert all(halving.judge(f"u{n}", 10, -1.0) for n in range(3))  # better than all: kept
    if trials == 14:  # a README-sized search: at most four trials stop at a milestone
        assert stopped <= trials - FULL_TRIALS
    else:  # a larger one: successive halving cuts, as ASHA does
        assert stopped >= trials // 3


def test_a_retried_trial_meets_the_milestones_with_the_values_measured_there(
        tmp_path: Path) -> None:
    layer = LayerSpec("mhsa", (HeadGroup(2, 8),))
    arch = ArchConfig(d_model=16, layers=(layer,), max_seq_len=16, input_dim=8)
    job = TrialJob(task=describe_task(make_task("ngram", "smoke")), metric="mse",
                   direction=Direction.MINIMIZE)
    train = {"steps": 30, "eval_every": 10, "batch_size": 8}
    first: list[TrialReport] = []

    def keep(report: TrialReport, checkpoint: Path | None) -> None:
        first.append(report)
        if checkpoint is not None and report.step == 20:  # the trial dies after step 20
            shutil.copytree(checkpoint, tmp_path / "at20")

    for name in ("work", "work2"):
        (tmp_path / name).mkdir()
    train_trial(job, TrialSpec(arch, train), keep, tmp_path / "work", "node")
    retried: list[TrialReport] = []
    train_trial(job, TrialSpec(arch, train, resume_from=tmp_path / "at20"),
                lambda report, _: retried.append(report), tmp_path / "work2", "node")
    assert [r.step for r in retried] == [10, 20, 30]
    assert all(r.resumed_from == 20 for r in retried)
    rungs = Rungs.for_training(30, 10)

    def judged(reports: list[TrialReport]) -> tuple[list[bool], dict[int, float]]:
        """Decisions and the values recorded at the milestones, among ten better trials."""
        halving = Halving(rungs, maximize=False)
        for n in range(FULL_TRIALS):
            for milestone in rungs.milestones:
                halving.judge(f"other{n}", milestone, 0.0)
        decisions = []
        for r in reports:
            decisions.append(halving.judge("t", int(r.to_result("mse")[STEP]), r.value))
            if not decisions[-1]:
                break
        return decisions, {m: -values["t"] for m, values in halving.recorded.items()
                           if "t" in values}

    assert judged(retried) == judged(first)
    decisions, at = judged(retried)
    assert decisions == [False]  # stopped at its first milestone, as the fresh trial is
    assert at == {10: first[0].value}
