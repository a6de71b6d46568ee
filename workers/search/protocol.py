"""What the driver and a trial tell each other: the two typed records of the search boundary.

The driver sends every trial a ``TrialJob`` (the same for the whole search) and a ``TrialSpec``
(what this trial trains, from the searcher); a trial answers with a ``TrialReport`` per
evaluation, and one on failure. Ray Tune carries them: the job and spec travel pickled inside
Tune's config dict, and a report travels as the flat result dict Tune's schedulers read
(``to_result``), parsed back on the driver (``from_result``); what a finished trial records
in the study follows from its last report (``told_record``). No torch and no Ray here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arch import ArchConfig, TrainConfig
from search_spaces import Allocation
from studies.trials import (
    ERROR,
    NODE,
    RESUMED,
    STATUS,
    TOKENS_PER_S,
    VAL_LOSS,
    VAL_LOSS_SE,
    Direction,
    TrialRecord,
    TrialStatus,
)

# Keys of a report's result dict besides the task's metric (the scheduler reads ``step``); a
# fact the study records too is under the study's key (``studies.records``).
STEP, TRAIN_LOSS = "step", "train_loss"
# Keys of Tune's config dict.
JOB_KEY, TRIAL_KEY = "job", "spec"


@dataclass(frozen=True)
class TrialJob:
    """What every trial of a search shares: the task, where and how to train, what to report."""

    task: Mapping[str, Any]  # ``workers.tasks.describe_task``: the worker rebuilds the task
    metric: str  # the task's metric, reported under this key
    direction: Direction  # which way the metric improves
    seed: int = 0  # training seed unless the space samples ``train.seed``
    device: str = "cpu"
    threads: int = 1  # torch threads of the worker (its CPUs)
    checkpoints: bool = True  # save the trainer at every evaluation (retries resume from it)


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
class StudentJob:
    """What every trial of a student search shares (``workers.search.students``): the teacher,
    the study's cache of its measurements (``workers.search.student_cache``: a folder every
    worker of a cluster reads through the storage path), how many reports a trial makes and
    how long it distils."""

    teacher: str  # the checkpoint (a folder, a GGUF file or our .pt), absolute
    cache: str  # the study's cache folder, absolute
    metric: str = VAL_LOSS  # the held-out loss, reported under this key
    direction: Direction = Direction.MINIMIZE
    seed: int = 0
    device: str = "cpu"
    threads: int = 1
    eval_chunks: int = 4  # reports per trial: the held-out windows in this many parts
    distil_steps: int = 0  # distillation steps after the cut, on the calibration data
    checkpoints: bool = False  # a student is rebuilt in seconds: nothing to resume from


@dataclass(frozen=True)
class StudentSpec:
    """What one student trial measures: its allocation, and the folder its plan is written to
    (what ``studies export`` copies)."""

    allocation: Allocation
    folder: str


@dataclass(frozen=True)
class TrialReport:
    """One evaluation of a running trial (``RUNNING``), or its failure (``FAILED``)."""

    status: TrialStatus
    value: float  # the job's metric (its direction's ``worst`` on failure)
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
        result = {metric: self.value, STATUS: str(self.status), NODE: self.node, STEP: self.step,
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
        return cls(status=TrialStatus(result[STATUS]), value=float(result[metric]),
                   node=str(result.get(NODE, "")), step=result.get(STEP),
                   val_loss=result.get(VAL_LOSS), train_loss=result.get(TRAIN_LOSS),
                   tokens_per_s=result.get(TOKENS_PER_S),
                   resumed_from=int(result.get(RESUMED) or 0), error=result.get(ERROR),
                   val_loss_se=result.get(VAL_LOSS_SE))


def told_record(report: TrialReport | None, number: int, *, steps: int, metric: str,
                error: bool = False) -> TrialRecord:
    """What finished trial ``number`` records from its last ``report`` (None: it reported
    nothing): COMPLETE with its value once it reached ``steps``, PRUNED before (the scheduler
    stopped it), FAIL when it failed or its ``metric`` is not finite. ``error``: Ray failed it
    (a FAIL whose caller records what failed)."""
    told = TrialRecord(None, number, "FAIL", None)
    if report is not None:
        told = dataclasses.replace(
            told, steps_reached=report.step, tokens_per_s=report.tokens_per_s,
            node=report.node or None, resumed_from=report.resumed_from or None,
            val_loss=report.val_loss, val_loss_se=report.val_loss_se)
    if error:
        return told
    failed = TrialStatus.FAILED
    if report is None:
        return dataclasses.replace(told, status=failed, error=f"no {metric} reported")
    if report.status == TrialStatus.FAILED:
        return dataclasses.replace(told, status=failed, error=report.error)
    if not math.isfinite(report.value):
        return dataclasses.replace(told, status=failed, error=f"no finite {metric} reported")
    if report.step is None or report.step < steps:
        return dataclasses.replace(told, state="PRUNED", status=TrialStatus.STOPPED)
    return dataclasses.replace(told, state="COMPLETE", value=report.value,
                               status=TrialStatus.COMPLETED)
