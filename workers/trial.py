"""One search trial: the sampled architecture trained by ``workers.train`` (no Ray here:
``workers.tune`` runs it as a Tune function trainable).

Every evaluation is reported as ``{metric, step, val_loss, train_loss, tokens_per_s, node,
resumed_from}`` together with a checkpoint directory (the trainer's state at that step), so a
trial restarted after its worker died, or retried after its driver died, continues from its
last evaluation instead of step 0. A trial that raises or diverges does not crash the worker: it
reports ``status: failed`` with the error, and the searcher records it as FAIL. Torch state is
released before the next trial reuses the worker.
"""

from __future__ import annotations

import gc
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from search_spaces import ArchConfig, param_count
from workers.searcher import ERROR, NODE, RESUMED, STATUS, STEP
from workers.tasks import task_from_description
from workers.train import EvalRecord, TrainConfig, Trainer

CHECKPOINT_FILE = "trainer.pt"
# report(metrics, checkpoint directory or None)
Report = Callable[[dict[str, Any], Path | None], None]


def worst(mode: str) -> float:
    """The value reported with a failure (the metric key must be present in every result)."""
    return float("-inf") if mode == "max" else float("inf")


def injected(inject: list[dict[str, str]], arch_json: str) -> dict[str, float]:
    """Fault injection for the launcher's tests (``--inject-failure KIND:TEXT``): trials whose
    architecture JSON contains TEXT raise (``raise``) or train with an infinite learning rate, so
    the weights and then the loss really become non-finite (``nan``)."""
    for rule in inject:
        if rule["match"] in arch_json:
            if rule["kind"] == "raise":
                raise RuntimeError(f"injected failure (architecture contains {rule['match']!r})")
            return {"lr": float("inf")}
    return {}


def check_recorded(arch: ArchConfig, trainer: Trainer) -> None:
    """The study records ``arch`` and its analytic counts: they must be the trained model's."""
    count = param_count(arch)
    if trainer.arch != arch or trainer.params != (count.trainable, count.total):
        raise RuntimeError(f"recorded architecture {arch.arch_id} ({count.trainable:,} trainable "
                           f"parameters) is not the trained one {trainer.arch.arch_id} "
                           f"({trainer.params[0]:,}): the study would describe another model")


def build_trainer(config: dict[str, Any], workdir: Path,
                  callback: Callable[[EvalRecord], None]) -> Trainer:
    """The trainer of a trial's config, saving its checkpoint in ``workdir``."""
    job = config["job"]
    # A space may list training seeds (``train.seed``); else the search's --seed.
    train = {"seed": job["seed"], **config["train"], "device": job["device"]}
    train.update(injected(job["inject"], config["arch"]))
    arch = ArchConfig.from_json(config["arch"])
    trainer = Trainer(arch, task_from_description(job["task"]), TrainConfig(**train),
                      checkpoint=workdir / CHECKPOINT_FILE if job.get("checkpoints", True)
                      else None, callbacks=[callback])
    check_recorded(arch, trainer)
    return trainer


def train_trial(config: dict[str, Any], report: Report, workdir: Path, node: str,
                restore: Path | None = None) -> None:
    """Train ``config["arch"]`` with ``config["train"]`` on the job's task, reporting every
    evaluation with the checkpoint in ``workdir``; continue from ``restore`` (this trial's own
    last checkpoint) or ``config["resume_from"]`` (that of the failed trial it retries)."""
    job = config["job"]
    torch.set_num_threads(max(1, int(job["threads"])))
    metric, resumed = job["metric"], 0

    def on_eval(record: EvalRecord) -> None:
        report({metric: record.metric, STEP: record.step, "val_loss": record.val_loss,
                "train_loss": record.train_loss, "tokens_per_s": record.tokens_per_s,
                NODE: node, STATUS: "running", RESUMED: resumed},
               workdir if job.get("checkpoints", True) else None)

    trainer = None
    try:
        trainer = build_trainer(config, workdir, on_eval)
        source = restore or (Path(config["resume_from"]) if config.get("resume_from") else None)
        if source is not None and (source / CHECKPOINT_FILE).exists():
            trainer.restore(source / CHECKPOINT_FILE)
            resumed = trainer.step
            if trainer.step >= trainer.config.steps and trainer.history:
                # The run had finished but its end was never told (the driver died after the
                # last report): report that evaluation again instead of failing the trial.
                on_eval(trainer.history[-1])
        result = trainer.run()
        error = result.error if result.status == "diverged" else None
    except Exception as err:
        error = traceback.format_exception_only(type(err), err)[-1].strip()
    finally:
        del trainer
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the next trial on this worker gets the memory back
    if error is not None:
        report({metric: worst(job["mode"]), STATUS: "failed", ERROR: error, NODE: node}, None)
