"""What a search is asked to do, checked once: ``SearchRequest``, built by ``prepare``.

``prepare`` is the search's one validation pass, shared by the command (which builds the task
and the options from its flags) and by ``run_search`` (which accepts a space file or a
``SearchSpace``, a task or its name). The space file is read once (``SpaceFile``): its data
source, its shape (for the data's pilot profile) and the space itself come from that one
reading; the profile's allocator inputs are read once too. Everything that can be refused is
refused here, in an order that writes nothing before the names and paths are checked: the study
name, the result directory, the data's profile (it writes there), the space, the GPU, the trial
memory, the warm start. A refusal is a ``SearchError`` (or the task's, data's or profile's own
error), one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alloc.settings import PlanSettings
from common.errors import excerpt
from search_spaces import SearchSpace, SpaceError, SpaceFile
from studies.storage import resolve_url
from userdata import DataSpec
from workers.errors import SearchError
from workers.search.checks import (
    check_gpus,
    check_points,
    check_study_name,
    check_trial_memory,
    check_warm_start,
    check_writable_dir,
)
from workers.search.options import DEFAULT_TRIALS, SearchOptions, training_budget
from workers.search.seeding import (
    measured_inputs,
    plan_settings,
    planner,
    profile_for,
    space_mlp_ratio,
)
from workers.tasks import Task, TaskError, make_task


@dataclass(frozen=True)
class SearchRequest:
    """A search, checked: what it searches, on which task, into which study, and how."""

    space: SearchSpace  # loaded, at the training budget its trials run
    task: Task
    storage: str  # the SQLAlchemy URL, resolved (printed only redacted)
    study: str  # the study's name, checked
    trials: int  # finished trials the study should hold
    resume: bool  # continue an existing study
    options: SearchOptions  # its ``profile``: the one planned with (given, or made now)
    measured: Mapping[str, Any] | None = None  # the profile's allocator inputs

    @property
    def sampler(self) -> str:
        """tpe | random | grid | prior: the options', else the space's."""
        return self.options.sampler or self.space.sampler

    def plan_settings(self) -> PlanSettings:
        """The allocator's inputs for this space on this task (before any warm start)."""
        return plan_settings(self.space.budget, self.space.depth, self.task, self.measured,
                             space_mlp_ratio(self.space))


@contextlib.contextmanager
def space_errors() -> Iterator[None]:
    """A ``SpaceError`` becomes the search's one-line ``--space`` error."""
    try:
        yield
    except SpaceError as err:
        raise SearchError(f"--space: {err}") from None


def read_space(name: str | Path) -> tuple[SpaceFile, DataSpec | None]:
    """A space file, read once, and the data it names (what it searches without a task)."""
    with space_errors():
        file = SpaceFile.read(name)
        return file, file.data_source()


def prepare(space: SearchSpace | SpaceFile | str | Path, task: Task | str, *,
            storage: str | None = None, study: str | None = None, trials: int | None = None,
            resume: bool = False, options: SearchOptions | None = None,
            budget: int | None = None, smoke_test: bool = False, steps: int | None = None,
            pilot_steps: int | None = None) -> SearchRequest:
    """Check a search once and describe it as a ``SearchRequest``.

    Args:
        space: a ``SearchSpace``, a ``SpaceFile`` or a space file (a path or a shipped name).
        task: a ``Task``, or a task name at its paper size (seeded by ``options.seed``).
        storage, study, trials, resume, options: as ``run_search``'s.
        budget: the width budget, over a space file's (``--budget``).
        smoke_test, steps: the trials' training at smoke size, and/or for ``steps`` steps.
        pilot_steps: the data's pilot profile's training steps (default: the profile's).

    Raises:
        SearchError: bad input (one line); the task's, data's or profile's error likewise.
    """
    opts = options or SearchOptions()
    task = _task(task, opts.seed)
    source = read_space(space)[0] if isinstance(space, str | Path) else space
    if study is not None:  # before profiling the data writes into --storage-path
        check_study_name(study)
    check_writable_dir("--storage-path", opts.storage_path)
    profile = profile_for(task, opts.profile, opts.storage_path, _shape(source, budget),
                          pilot_steps, opts.quiet)
    opts = dataclasses.replace(opts, profile=profile)
    measured = measured_inputs(profile)
    loaded = training_budget(_load(source, task, measured, budget), smoke_test, steps)
    check_gpus(opts)
    name = study if study is not None else f"{loaded.name}-{task.name}"
    if study is None:
        check_study_name(name, f"the study name from space {excerpt(loaded.name)} (give --study)")
    check_trial_memory(loaded, task, opts)
    if opts.warm_start is not None:
        check_warm_start(opts.warm_start, name)
    kind = opts.sampler or loaded.sampler
    check_points(loaded, opts.points)
    total = trials or len(opts.points) or (len(loaded.grid()) if kind == "grid"
                                           else DEFAULT_TRIALS)
    return SearchRequest(loaded, task, resolve_url(storage), name, total, resume, opts,
                         measured)


def _shape(source: SearchSpace | SpaceFile, budget: int | None
           ) -> tuple[int, int, float] | None:
    """``(budget, depth, largest MLP ratio)`` of the space, before a file is loaded."""
    if isinstance(source, SpaceFile):
        return source.shape(budget)
    return source.budget, source.depth, space_mlp_ratio(source)


def _load(source: SearchSpace | SpaceFile, task: Task, measured: Mapping[str, Any] | None,
          budget: int | None) -> SearchSpace:
    """The space: a file's, loaded with the allocator's plan for ``task`` as its planner."""
    if isinstance(source, SearchSpace):
        return source
    shape = source.shape(budget)
    with space_errors():
        return source.load(budget, planner(task, measured,
                                           shape[2] if shape else PlanSettings.mlp_ratio))


def _task(task: Task | str, seed: int) -> Task:
    if not isinstance(task, str):
        return task
    try:
        return make_task(task, "paper", seed)
    except TaskError as err:
        raise SearchError(f"--task: {err}") from None
