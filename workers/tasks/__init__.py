"""Tasks, generated locally: ``make_task(name, size="smoke"|"paper", seed, **params)``.

Each task declares its inputs (``tokens`` with ``vocab_size``, or ``vectors`` with
``input_dim``/``output_dim``), ``seq_len``, a metric and its direction; ``fit_arch`` wires an
``ArchConfig``'s input/output to the task. Families: ``vectors`` (ngram, kernel, denoise,
icl_linear), ``tokens`` (induction, retrieval, modadd, addition, dyck, memorize), ``text`` (lm),
and ``data`` (the user's own: text, bin, npy; ``make_data_task``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from arch import ArchConfig
from workers.errors import TaskError
from workers.tasks.base import Batch, Task, generator
from workers.tasks.data import DATA_TASKS, ArrayTask, BinTask, TextTask, make_data_task
from workers.tasks.text import LMTask, corpus
from workers.tasks.tokens import (
    AdditionTask,
    DyckTask,
    InductionTask,
    MemorizeTask,
    ModAddTask,
    RetrievalTask,
    bits_per_param,
)
from workers.tasks.vectors import DenoiseTask, ICLLinearTask, KernelTask, NgramTask, cluster_snr

TASKS: dict[str, type[Task]] = {cls.name: cls for cls in (
    NgramTask, KernelTask, DenoiseTask, InductionTask, RetrievalTask, ModAddTask, AdditionTask,
    DyckTask, MemorizeTask, ICLLinearTask, LMTask, TextTask, BinTask, ArrayTask)}

__all__ = ["DATA_TASKS", "TASKS", "AdditionTask", "ArrayTask", "Batch", "BinTask", "DenoiseTask",
           "DyckTask", "ICLLinearTask", "InductionTask", "KernelTask", "LMTask", "MemorizeTask",
           "ModAddTask", "NgramTask", "RetrievalTask", "Task", "TaskError", "TextTask",
           "bits_per_param", "cluster_snr", "corpus", "describe_task", "fit_arch", "generator",
           "make_data_task", "make_task", "task_from_description"]


def make_task(name: str, size: str = "smoke", seed: int = 0, **params: Any) -> Task:
    """The task ``name`` at ``size`` (``smoke`` or ``paper``), with parameters overridden."""
    if name in DATA_TASKS:
        raise TaskError(f"task {name!r} reads your data: make it with make_data_task(DataSpec)")
    if name not in TASKS:
        raise TaskError(f"unknown task {name!r}; choices: "
                        f"{', '.join(n for n in TASKS if n not in DATA_TASKS)}")
    cls = TASKS[name]
    if size not in cls.sizes:
        raise TaskError(f"unknown size {size!r} for {name}; choices: {', '.join(cls.sizes)}")
    valid = [f.name for f in dataclasses.fields(cls) if f.name != "seed"]
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise TaskError(f"unknown parameter {unknown[0]!r} for task {name}; valid: "
                        f"{', '.join(valid)}")
    return cls(seed=seed, **{**cls.sizes[size], **params})


def describe_task(task: Task) -> dict[str, Any]:
    """Everything that rebuilds ``task`` elsewhere (a Ray worker): its name and fields."""
    return {"name": task.name, **dataclasses.asdict(task)}


def task_from_description(description: dict[str, Any]) -> Task:
    """The inverse of ``describe_task``."""
    fields = dict(description)
    return TASKS[fields.pop("name")](**fields)


def fit_arch(arch: ArchConfig, task: Task) -> ArchConfig:
    """``arch`` with its input/output and length wired to ``task`` (the layers are kept)."""
    return arch.with_io(task.io)
