"""What the driver and a trial tell each other: the two typed records of the search boundary.

The driver sends every trial a ``TrialJob`` (the same for the whole search) and a ``TrialSpec``
(what this trial trains, from the searcher); a trial answers with a ``TrialReport`` per
evaluation, and one on failure. Ray Tune carries them: the job and spec travel pickled inside
Tune's config dict, and a report travels as the flat result dict Tune's schedulers read
(``to_result``), parsed back on the driver (``from_result``). No torch and no Ray here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from arch import ArchConfig, TrainConfig

Mode = Literal["min", "max"]
Status = Literal["running", "failed"]
# Keys of a report's result dict besides the task's metric (the scheduler reads ``step``).
STEP, STATUS, ERROR, NODE, RESUMED = "step", "status", "error", "node", "resumed_from"
VAL_LOSS, TRAIN_LOSS, TOKENS_PER_S = "val_loss", "train_loss", "tokens_per_s"
VAL_LOSS_SE = "val_loss_se"  # the standard error of val_loss (``workers.trainer.Evaluation``)
# Keys of Tune's config dict.
JOB_KEY, TRIAL_KEY = "job", "spec"


@dataclass(frozen=True)
class TrialJob:
    """What every trial of a search shares: the task, where and how to train, what to report."""

    task: Mapping[str, Any]  # ``workers.tasks.describe_task``: the worker rebuilds the task
    metric: str  # the task's metric, reported under this key
    mode: Mode  # min: lower metric is better
    seed: int = 0  # training seed unless the space samples ``train.seed``
    device: str = "cpu"
    threads: int = 1  # torch threads of the worker (its CPUs)
    checkpoints: bool = True  # save the trainer at every evaluation (retries resume from it)

    def worst(self) -> float:
        """The metric reported with a failure (the key must be present in every result)."""
        return -math.inf if self.mode == "max" else math.inf


@dataclass(frozen=True)
class TrialSpec:
    """What one trial trains: the sampled architecture (wired to the task), the sampled training
    fields, and the checkpoint of the failed trial it retries."""

    arch: ArchConfig
    train: Mapping[str, Any] = field(default_factory=dict)  # TrainConfig fields sampled
    resume_from: Path | None = None

    def train_config(self, job: TrialJob) -> TrainConfig:
        """The trainer's config: the job's seed and device, the sampled fields over them."""
        return TrainConfig.from_dict({"seed": job.seed, **self.train, "device": job.device})


@dataclass(frozen=True)
class TrialReport:
    """One evaluation of a running trial, or its failure."""

    status: Status
    value: float  # the job's metric (``TrialJob.worst()`` on failure)
    node: str  # Ray node id of the worker
    step: int | None = None
    val_loss: float | None = None
    train_loss: float | None = None
    tokens_per_s: float | None = None
    resumed_from: int = 0  # the step a restarted trial continued from (0: from scratch)
    error: str | None = None  # the failure, one line
    val_loss_se: float | None = None  # standard error of ``val_loss`` over its batches

    def to_result(self, metric: str) -> dict[str, Any]:
        """The flat dict Tune reports (``None`` fields left out)."""
        result = {metric: self.value, STATUS: self.status, NODE: self.node, STEP: self.step,
                  VAL_LOSS: self.val_loss, TRAIN_LOSS: self.train_loss,
                  TOKENS_PER_S: self.tokens_per_s, RESUMED: self.resumed_from,
                  ERROR: self.error, VAL_LOSS_SE: self.val_loss_se}
        return {k: v for k, v in result.items() if v is not None}

    @classmethod
    def from_result(cls, result: Mapping[str, Any], metric: str) -> TrialReport | None:
        """The report in one of Tune's result dicts (None when it holds none: Tune's own
        results, e.g. of a trial that died before reporting)."""
        if metric not in result or STATUS not in result:
            return None
        return cls(status=result[STATUS], value=float(result[metric]),
                   node=str(result.get(NODE, "")), step=result.get(STEP),
                   val_loss=result.get(VAL_LOSS), train_loss=result.get(TRAIN_LOSS),
                   tokens_per_s=result.get(TOKENS_PER_S),
                   resumed_from=int(result.get(RESUMED) or 0), error=result.get(ERROR),
                   val_loss_se=result.get(VAL_LOSS_SE))
