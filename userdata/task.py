"""The task a command trains, measures or fine-tunes on, as its flags name it: ``TaskSpec``, a
generated task by name or the user's data, with its parameters, size and seed. Computed once
from the flags (``workers.taskargs.task_spec``) and carried by every request that runs a task
(``workers.train``, ``workers.search``, ``workers.profile --checkpoint``, ``workers.compress``);
built into a task by one resolver, ``workers.taskargs.resolve_task`` (torch). Torch-free, so
that the requests (``alloc.compression.MeasureRequest``) hold it without torch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from common.errors import Problem
from userdata.errors import TaskError
from userdata.readers import DataSpec

# The generated tasks: the names ``workers.tasks.TASKS`` registers besides the data tasks (a
# test checks them), listed here so that naming a task needs no torch.
GENERATED_TASKS = ("addition", "denoise", "dyck", "icl_linear", "induction", "kernel", "lm",
                   "memorize", "modadd", "ngram", "retrieval")
SIZES = ("smoke", "paper")  # a generated task's sizes
DATA_PARAMS = ("length",)  # the one parameter of a task made of the user's data


@dataclass(frozen=True)
class TaskSpec:
    """A task, named: a generated task (``name``) or the user's ``data``, not both; neither
    names none (a command then takes its default: the checkpoint's task, the space's data).

    Attributes:
        name: a generated task, one of ``GENERATED_TASKS``.
        data: the user's data.
        params: the task's parameters overridden (``length``, the window, alone for data).
        size: a generated task's size, ``smoke`` or ``paper``.
        seed: the task's seed (its examples and their split).

    Raises:
        TaskError: every field that breaks its rule, as problems naming the field
            (``task.name``, ``task.data``, ``task.params``, ``task.size``, ``task.seed``).
    """

    name: str | None = None
    data: DataSpec | None = None
    params: Mapping[str, Any] = field(default_factory=dict)
    size: str = "paper"
    seed: int = 0

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise TaskError.of(problems)

    def problems(self) -> list[Problem]:
        """Every rule the fields break (empty when none)."""
        found = []
        if self.name is not None and self.name not in GENERATED_TASKS:
            found.append(Problem("task.name", self.name, f"unknown task {self.name!r}; "
                                 f"choices: {', '.join(GENERATED_TASKS)}", shown=""))
        if self.data is not None and self.name is not None:
            found.append(Problem("task.data", repr(self.data.path), "not with {task.name}"))
        unknown = sorted(set(self.params) - set(DATA_PARAMS))
        if self.data is not None and unknown:
            found.append(Problem("task.params", ", ".join(unknown),
                                 "a {task.data} task takes only length=N"))
        if self.size not in SIZES:
            found.append(Problem("task.size", self.size, f"must be one of {', '.join(SIZES)}"))
        if not (isinstance(self.seed, int) and self.seed >= 0):
            found.append(Problem("task.seed", self.seed, "must be an integer >= 0"))
        return found

    @property
    def given(self) -> bool:
        """A task or data is named."""
        return self.name is not None or self.data is not None
