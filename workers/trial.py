"""The Ray Tune function trainable: one candidate architecture trained by ``workers.train``.

Every evaluation is reported to Tune as ``{metric, step, val_loss, train_loss, tokens_per_s,
node}`` (``step`` is the scheduler's time axis). A trial that raises or diverges does not crash the
worker: it reports ``status: failed`` with the error and returns, so the searcher records it as
FAIL with its message and the search goes on. Torch state is released before the next trial
reuses the actor.
"""

from __future__ import annotations

import gc
import traceback
from typing import Any

import ray
import torch
from ray import tune

from search_spaces import ArchConfig, param_count
from workers.tasks import make_task
from workers.train import EvalRecord, TrainConfig, Trainer

# Keys of the results a trial reports besides the task's metric.
STEP, STATUS, ERROR, NODE = "step", "status", "error", "node"


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


def run_trial(config: dict[str, Any]) -> None:
    """Train ``config["arch"]`` with ``config["train"]`` on the job's task, reporting to Tune."""
    job = config["job"]
    node = ray.get_runtime_context().get_node_id()
    torch.set_num_threads(max(1, int(job["threads"])))
    metric = job["metric"]

    def report(record: EvalRecord) -> None:
        tune.report({metric: record.metric, STEP: record.step, "val_loss": record.val_loss,
                     "train_loss": record.train_loss, "tokens_per_s": record.tokens_per_s,
                     NODE: node, STATUS: "running"})

    trainer = None
    try:
        # A space may list training seeds (``train.seed``); else the search's --seed.
        train = {"seed": job["seed"], **config["train"], "device": job["device"]}
        train.update(injected(job["inject"], config["arch"]))
        task = make_task(job["task"], job["size"], job["seed"], **job["task_params"])
        settings = TrainConfig(**train)
        arch = ArchConfig.from_json(config["arch"])
        trainer = Trainer(arch, task, settings, callbacks=[report])
        check_recorded(arch, trainer)
        result = trainer.run()
        error = result.error if result.status == "diverged" else None
    except Exception as err:
        lines = traceback.format_exception_only(type(err), err)
        error = lines[-1].strip()
    finally:
        del trainer
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the next trial on this actor gets the memory back
    if error is not None:
        tune.report({metric: worst(job["mode"]), STATUS: "failed", ERROR: error, NODE: node})
