"""One student search trial: a student of the teacher built at the trial's allocation from the
study's cached measurements (``workers.search.student_cache``), optionally distilled for a few
steps, and scored on the held-out windows (no Ray here: ``workers.search.tune`` runs it).

The trial first writes its plan (``plan.yaml`` and its maps, ``plan.factors.safetensors``) to
its folder, then builds the student from that plan as ``workers.compress`` does, so the plan
``studies export`` copies builds the student the trial measured. The held-out windows are
scored in ``eval_chunks`` parts, the running mean reported after each (the scheduler's steps:
ASHA may stop a trial after any part; every trial sees the windows in the same order, so a
part's mean compares trials on the same text), and every window's loss is written beside the
plan (``windows.json``) for the study's comparisons paired by window.
"""

from __future__ import annotations

import functools
import gc
import json
import math
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from alloc.compression import CompressionPlan
from common.files import write_atomic
from studies.trials import TrialStatus
from workers.compression import LatentFits, write_fits
from workers.models import Model
from workers.search.protocol import StudentJob, StudentSpec, TrialReport
from workers.search.student_cache import (
    FACTORS,
    open_cache,
    read_student_fits,
    student_plan,
    window_losses,
)

PLAN, WINDOWS = "plan.yaml", "windows.json"
Report = Callable[[TrialReport, Path | None], None]


def write_plan(folder: Path, plan: CompressionPlan, fits: LatentFits) -> None:
    """The trial's plan and its maps (once: a folder is a pure function of its allocation)."""
    if (folder / PLAN).is_file():
        return
    folder.mkdir(parents=True, exist_ok=True)
    write_fits(folder / FACTORS, fits)
    write_atomic(folder / PLAN, plan.to_yaml())


@functools.lru_cache(maxsize=2)
def teacher_model(path: str) -> Model:
    """The teacher, read once per worker process (a reused worker keeps it)."""
    from workers.checkpoints import load

    return load(Path(path)).model.eval()


def build(job: StudentJob, spec: StudentSpec) -> tuple[Model, CompressionPlan]:
    """The trial's student, built from the plan it writes (as ``workers.compress`` builds it)."""
    from workers.compression import build_student, pair_orders, read_fits

    cache = open_cache(Path(job.cache))
    plan = student_plan(cache, spec.allocation)
    folder = Path(spec.folder)
    write_plan(folder, plan, read_student_fits(cache, spec.allocation))
    fits = read_fits(plan, folder)
    student = build_student(teacher_model(job.teacher), plan.student, pair_orders(plan),
                            plan.input_scales(), fits)
    return student.eval(), plan


def distil(job: StudentJob, student: Model) -> Model:
    """``student`` after ``job.distil_steps`` steps of distillation from the teacher on the
    calibration data (``workers.compression.distil``)."""
    from userdata import DataSpec
    from workers.compression import Distiller, DistilSettings
    from workers.tasks import make_data_task

    meta = open_cache(Path(job.cache)).meta["settings"]
    task = make_data_task(DataSpec(**meta["data"]), length=int(meta["seq_len"]))
    settings = DistilSettings(steps=job.distil_steps, batch_size=4, seed=job.seed,
                              save_every=job.distil_steps + 1)
    Distiller(teacher_model(job.teacher), student, task, settings).run()
    return student.eval()


def student_trial(job: StudentJob, spec: StudentSpec, report: Report, workdir: Path,
                  node: str, restore: Path | None = None) -> None:
    """Build, optionally distil and score the student of ``spec``, reporting the held-out loss
    after each part of the windows; a failure is reported, never raised."""
    torch.set_num_threads(max(1, job.threads))
    step = 0
    try:
        student, _ = build(job, spec)
        if job.distil_steps:
            student = distil(job, student)
        student = student.to(job.device)  # a GPU share (--gpus-per-trial) scores on CUDA
        ids, _ = open_cache(Path(job.cache)).eval_windows()
        losses: list[float] = []
        for step, part in enumerate(ids.tensor_split(min(job.eval_chunks, len(ids))), 1):
            losses += window_losses(student, part).tolist()
            mean = float(np.mean(losses))
            se = float(np.std(losses, ddof=1) / math.sqrt(len(losses))) if len(losses) > 1 \
                else None
            if step == min(job.eval_chunks, len(ids)):  # before the last report: it is told
                write_atomic(Path(spec.folder) / WINDOWS, json.dumps(losses))
            report(TrialReport(TrialStatus.RUNNING, mean, node, step, mean, val_loss_se=se),
                   None)
    except Exception as err:
        error = traceback.format_exception_only(type(err), err)[-1].strip()
        report(TrialReport(TrialStatus.FAILED, job.direction.worst, node, step=step,
                           error=error), None)
    finally:
        gc.collect()
