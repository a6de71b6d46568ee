"""Trials survive faults: a SIGKILLed worker's trial is restarted by Ray from its last checkpoint,
ends at the uninterrupted run's loss, reports no step twice and leaves nothing RUNNING (SQLite
and PostgreSQL); the trial function reports a checkpoint per evaluation and restarts from one.
(A SIGKILLed driver's trials continuing from their checkpoints: tests/test_search.py.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import optuna
import pytest
import torch
import yaml
from optuna.trial import TrialState

from arch import ArchConfig, TrainConfig
from studies.trials import RESUMED, Direction
from tests.helpers.search import finish, launch, load, wait_for
from workers.search.protocol import TrialJob, TrialReport, TrialSpec
from workers.tasks import make_task
from workers.training.trainer import Trainer

SPACE = """name: one
budget: 32
depth: 1
sampler: grid
layers: [{layers: all, heads: [4], mlp_ratio: [2]}]
train: {steps: 300, eval_every: 20, batch_size: 16, lr: 1.0e-3}
"""


def args(tmp: Path, url: str, study: str) -> list[str]:
    (tmp / "one.yaml").write_text(SPACE)
    return ["--space", str(tmp / "one.yaml"), "--task", "ngram", "--task-param", "dim=8",
            "--trials", "1", "--scheduler", "fifo", "--storage", url, "--study", study,
            "--heartbeat-interval", "1", "--grace-period", "3"]


def results(tmp: Path) -> list[dict[str, object]]:
    """Every result Ray recorded for the search's trials, in order."""
    rows = []
    for path in sorted((tmp / "results").glob("*/trial_*/result.json")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def uninterrupted(study: optuna.Study, number: int) -> float:
    """The final metric of the same trial trained in one go in this process."""
    trial = next(t for t in study.trials if t.number == number)
    torch.set_num_threads(1)  # as the trial's worker
    config = TrainConfig(**{"seed": 0, **yaml.safe_load(SPACE)["train"], "device": "cpu"})
    trainer = Trainer(ArchConfig.from_json(trial.user_attrs["arch"]),
                      make_task("ngram", "paper", 0, dim=8), config)
    result = trainer.run()
    assert result.metric is not None
    return result.metric


def test_a_killed_worker_continues_from_its_checkpoint(storage_url: str, study_name: str,
                                                       tmp_path: Path,
                                                       ray_cluster: dict[str, str]) -> None:
    proc = launch(tmp_path, *args(tmp_path, storage_url, study_name), ray=ray_cluster)
    # Ray's result files, not the study: a poll that opens the database takes a second or more
    # on a loaded machine, and the trial's 15 evaluations could all pass in between.
    # The worker's pid is taken from the same read that saw step 60: a second read can find the
    # result files mid-rewrite (seen once, on a box with a study running beside the suite).
    seen: list[int] = []

    def reached() -> bool:
        rows = results(tmp_path)
        if any(r["step"] >= 60 for r in rows if "step" in r):  # type: ignore[operator]
            seen.append(int(rows[0]["pid"]))  # type: ignore[call-overload]
        return bool(seen)

    wait_for(reached, 180)
    pid = seen[0]
    os.kill(pid, signal.SIGKILL)  # the trial's worker, not the driver
    _, err = finish(proc, 300)
    assert proc.returncode == 0, err[-3000:]
    study = load(storage_url, study_name)
    (trial,) = study.trials
    assert trial.state == TrialState.COMPLETE and trial.user_attrs[RESUMED] > 0
    rows = [r for r in results(tmp_path) if "step" in r]
    steps = [r["step"] for r in rows]
    assert steps == sorted(set(steps)), steps  # no step reported twice
    restarted = [r for r in rows if r[RESUMED]]
    assert restarted and restarted[0]["step"] > restarted[0][RESUMED] > 0
    assert {int(r["pid"]) for r in rows} != {pid}  # a new worker finished it
    assert trial.value == pytest.approx(uninterrupted(study, 0), rel=1e-4)


@pytest.mark.parametrize("checkpoints", [True, False])
def test_a_trial_reports_every_evaluation_with_its_checkpoint(checkpoints: bool,
                                                             tmp_path: Path) -> None:
    """The trial function without Ray: a report per evaluation, each with the trainer's state
    (or none with --no-checkpoints), and a restart from one continues its curve."""
    from arch import HeadGroup, LayerSpec
    from workers.search.trial import CHECKPOINT_FILE, train_trial
    from workers.tasks import describe_task

    layer = LayerSpec("mhsa", (HeadGroup(2, 8),))
    arch = ArchConfig(d_model=16, layers=(layer,), max_seq_len=16, input_dim=8)
    job = TrialJob(task=describe_task(make_task("ngram", "smoke")), metric="mse",
                   direction=Direction.MINIMIZE, checkpoints=checkpoints)
    spec = TrialSpec(arch, {"steps": 30, "eval_every": 10, "batch_size": 8})
    reports: list[tuple[dict[str, object], bool]] = []

    def report(result: TrialReport, checkpoint: Path | None) -> None:
        saved = checkpoint is not None and (checkpoint / CHECKPOINT_FILE).exists()
        reports.append((result.to_result(job.metric), saved))
        if checkpoint is not None and result.step == 20:
            shutil.copytree(checkpoint, tmp_path / "at20")

    (tmp_path / "work").mkdir()
    (tmp_path / "work2").mkdir()
    train_trial(job, spec, report, tmp_path / "work", "node")
    assert [m["step"] for m, _ in reports] == [10, 20, 30]
    assert all(saved == checkpoints for _, saved in reports)
    if checkpoints:
        again: list[tuple[dict[str, object], bool]] = []
        train_trial(job, spec, lambda r, c: again.append((r.to_result("mse"), c is not None)),
                    tmp_path / "work2", "node", restore=tmp_path / "at20")
        assert [m["step"] for m, _ in again] == [30] and again[0][0][RESUMED] == 20
        assert again[0][0]["mse"] == pytest.approx(reports[-1][0]["mse"], rel=1e-6)
        # From the final checkpoint (the driver died before the end was told): the last
        # evaluation is reported again, not lost.
        final: list[dict[str, object]] = []
        train_trial(job, spec, lambda r, c: final.append(r.to_result("mse")), tmp_path / "work2",
                    "node",
                    restore=tmp_path / "work")
        assert [(m["step"], m["status"]) for m in final] == [(30, "running")]
        assert final[0]["mse"] == reports[-1][0]["mse"]
