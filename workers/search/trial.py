"""One search trial: the sampled architecture trained by ``workers.train`` (no Ray here:
``workers.search.tune`` runs it as a Tune function trainable).

Every evaluation is reported as a ``TrialReport`` together with a checkpoint directory (the
trainer's state at that step), so a trial restarted after its worker died, or retried after its
driver died, continues from its last evaluation instead of step 0. A retry (a new trial from
another's checkpoint) first reports the evaluations that checkpoint recorded, so that the
scheduler judges it at the same milestones, by the values measured there, as a fresh trial
(``workers.search.schedule``). A trial that raises or
diverges does not crash the worker: it reports ``status: failed`` with the error, and the
searcher records it as FAIL. Torch state is released before the next trial reuses the worker.
"""

from __future__ import annotations

import gc
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from arch import ArchConfig, param_count
from studies.trials import TrialStatus
from workers.search.protocol import TrialJob, TrialReport, TrialSpec
from workers.tasks import task_from_description
from workers.training.trainer import EvalRecord, Trainer

CHECKPOINT_FILE = "trainer.pt"
# report(what the trial reports, its checkpoint directory or None)
Report = Callable[[TrialReport, Path | None], None]


def check_recorded(arch: ArchConfig, trainer: Trainer) -> None:
    """The study records ``arch`` and its analytic counts: they must be the trained model's."""
    count = param_count(arch)
    if trainer.arch != arch or trainer.params != (count.trainable, count.total):
        raise RuntimeError(f"recorded architecture {arch.arch_id} ({count.trainable:,} trainable "
                           f"parameters) is not the trained one {trainer.arch.arch_id} "
                           f"({trainer.params[0]:,}): the study would describe another model")


def build_trainer(job: TrialJob, spec: TrialSpec, workdir: Path,
                  callback: Callable[[EvalRecord], None]) -> Trainer:
    """The trainer of a trial, saving its checkpoint in ``workdir``."""
    config = spec.train_config(job)
    trainer = Trainer(spec.arch, task_from_description(dict(job.task)), config,
                      checkpoint=workdir / CHECKPOINT_FILE if job.checkpoints else None,
                      callbacks=[callback])
    check_recorded(spec.arch, trainer)
    return trainer


def replay(trainer: Trainer, on_eval: Callable[[EvalRecord, bool], None]) -> None:
    """Report again the evaluations a restored ``trainer`` recorded (its learning curve up to
    the step it continues from), the last one with its checkpoint (saved here first): a trial
    retried from another's checkpoint meets each milestone with the value measured there, not
    with a value from later in its training."""
    if not trainer.history:
        return
    trainer.save()
    for record in trainer.history[:-1]:
        on_eval(record, False)
    on_eval(trainer.history[-1], True)


def train_trial(job: TrialJob, spec: TrialSpec,
                report: Report, workdir: Path, node: str,
                restore: Path | None = None) -> None:
    """Train ``spec`` for ``job``, reporting every evaluation with the checkpoint in
    ``workdir``; continue from ``restore`` (this trial's own last checkpoint) or
    ``spec.resume_from`` (that of the failed trial it retries)."""
    torch.set_num_threads(max(1, job.threads))
    resumed = 0

    def on_eval(record: EvalRecord, checkpoint: bool = True) -> None:
        report(TrialReport(TrialStatus.RUNNING, record.metric, node, record.step, record.val_loss,
                           record.train_loss, record.tokens_per_s, resumed,
                           val_loss_se=record.val_loss_se),
               workdir if job.checkpoints and checkpoint else None)

    trainer: Trainer | None = None
    error, step = None, None
    try:
        trainer = build_trainer(job, spec, workdir, on_eval)
        source = restore or spec.resume_from
        if source is not None and (source / CHECKPOINT_FILE).exists():
            trainer.restore(source / CHECKPOINT_FILE)
            resumed = trainer.step
            if restore is None:  # a retry: the evaluations it continues, at their steps
                replay(trainer, on_eval)
            elif trainer.step >= trainer.config.steps and trainer.history:
                # The run had finished but its end was never told (the driver died after the
                # last report): report that evaluation again instead of failing the trial.
                on_eval(trainer.history[-1])
        result = trainer.run()
        if result.status == "diverged":
            error = result.error
    except Exception as err:
        error = traceback.format_exception_only(type(err), err)[-1].strip()
    finally:
        step = trainer.step if trainer is not None else None
        del trainer
        # The trial's reference cycles (model, optimizer, closures) go before the next trial;
        # what survives (the imports, Ray's and torch's state) is frozen, so that neither this
        # collection nor Ray's own in this worker scans it again (a full collection here
        # costs ~0.2 s: 390,000 objects after torch, dynamo and Ray Tune are imported).
        gc.collect()
        gc.freeze()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the next trial on this worker gets the memory back
    if error is not None:
        report(TrialReport(TrialStatus.FAILED, job.direction.worst, node, step=step,
                           resumed_from=resumed, error=error), None)
