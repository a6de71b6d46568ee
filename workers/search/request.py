"""What a search is asked to do, checked once: ``SearchRequest``, built by ``prepare``.

``prepare`` is the search's one validation pass, shared by the command (which builds the task
and the options from its flags) and by ``run_search`` (which accepts a space file or a
``SearchSpace``, a task or its name). The space file is read once (``SpaceFile``): its data
source, its shape (for the data's pilot profile) and the space itself come from that one
reading. The profile's allocator inputs are read once (a profile made now is kept as it is
written), and the allocator's plan is made once (``SearchPlan``: as a file's ``allocator``
placeholders take it, else last); the request carries both on. Everything that can be refused
is refused here, in an order that writes nothing before the names and paths are checked: the
study name, the result directory, the data's profile (it writes there), the space, the GPU, the
trial memory, the warm start, the plan. A refusal is a ``SearchError`` (or the task's, data's,
profile's or plan's own error), one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from alloc import AllocatorInputs, PlanSettings
from arch import ArchConfig
from common.errors import Problem, excerpt
from search_spaces import SAMPLER_KINDS, SearchSpace, SpaceError, SpaceFile
from studies import resolve_url
from userdata import DataSpec, TaskSpec
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
from workers.search.seeding import SearchPlan, plan_settings, profile_for, space_mlp_ratio
from workers.taskargs import resolve_task
from workers.tasks import Task


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
    plan: SearchPlan  # the allocator's, for this space on this task (before any warm start)
    measured: AllocatorInputs | None = None  # the profile's allocator inputs

    @property
    def sampler(self) -> str:
        """tpe | random | grid | prior: the options', else the space's."""
        return self.options.sampler or self.space.sampler


@contextlib.contextmanager
def space_errors() -> Iterator[None]:
    """A ``SpaceError`` becomes the search's one-line error of its field ``space``."""
    try:
        yield
    except SpaceError as err:
        raise SearchError.of([Problem("space", "", str(err))]) from None


def read_space(name: str | Path) -> tuple[SpaceFile, DataSpec | None]:
    """A space file, read once, and the data it names (what it searches without a task)."""
    with space_errors():
        file = SpaceFile.read(name)
        return file, file.data_source()


def prepare(space: SearchSpace | SpaceFile | str | Path, task: Task | TaskSpec | str, *,
            storage: str | None = None, study: str | None = None, trials: int | None = None,
            resume: bool = False, options: SearchOptions | None = None,
            budget: int | None = None, smoke_test: bool = False, steps: int | None = None,
            pilot_steps: int | None = None) -> SearchRequest:
    """Check a search once and describe it as a ``SearchRequest``.

    Args:
        space: a ``SearchSpace``, a ``SpaceFile`` or a space file (a path or a shipped name).
        task: a ``Task``, the ``TaskSpec`` of one, or a task name at its paper size (seeded
            by ``options.seed``).
        storage, study, trials, resume, options: as ``run_search``'s.
        budget: the width budget, over a space file's (``--budget``).
        smoke_test, steps: the trials' training at smoke size, and/or for ``steps`` steps.
        pilot_steps: the data's pilot profile's training steps (default: the profile's).

    Raises:
        SearchError: bad input (one line); the task's, data's, profile's or plan's error
        likewise.
    """
    opts = options or SearchOptions()
    task = _task(task, opts.seed)
    source = read_space(space)[0] if isinstance(space, str | Path) else space
    if study is not None:  # before profiling the data writes into the storage path
        check_study_name(study)
    check_writable_dir("storage_path", opts.storage_path)
    profiled = profile_for(task, opts.profile, opts.storage_path, _shape(source, budget),
                           pilot_steps, opts.quiet, pilot=_plan_shapes_trials(source, opts))
    opts = dataclasses.replace(opts, profile=None if profiled is None else profiled.path)
    measured = None if profiled is None else profiled.inputs
    found, planned = _load(source, task, measured, budget)
    loaded = training_budget(found, smoke_test, steps)
    check_gpus(opts)
    name = study if study is not None else f"{loaded.name}-{task.name}"
    if study is None:
        check_study_name(name, why=f" (the default from space {excerpt(loaded.name)}; give "
                                   "{study})")
    check_trial_memory(loaded, task, opts)
    if opts.warm_start is not None:
        check_warm_start(opts.warm_start, name)
    kind = opts.sampler or loaded.sampler
    check_points(loaded, opts.points)
    total = trials or len(opts.points) or (len(loaded.grid()) if SAMPLER_KINDS[kind].enumerates
                                           else DEFAULT_TRIALS)
    url = resolve_url(storage)
    if planned is None:  # last: the checks above refuse a space too large to plan quickly
        planned = _plan(task, measured, loaded.budget, loaded.depth, space_mlp_ratio(loaded))
    return SearchRequest(loaded, task, url, name, total, resume, opts, planned, measured)


def _plan_shapes_trials(source: SearchSpace | SpaceFile, opts: SearchOptions) -> bool:
    """Whether the allocator's plan chooses any trial: not for a grid that takes nothing from
    the plan (its points are the trials, in order; the plan is only recorded beside them), nor
    for given points. Only where it does is the data's pilot training (minutes) worth its time."""
    if opts.points:
        return False
    if isinstance(source, SpaceFile):
        kind, planned = opts.sampler or str(source.data.get("sampler", "tpe")), \
            source.uses_allocator()
    else:
        kind, planned = opts.sampler or source.sampler, False
    return planned or not (kind in SAMPLER_KINDS and SAMPLER_KINDS[kind].enumerates)


def _shape(source: SearchSpace | SpaceFile, budget: int | None
           ) -> tuple[int, int, float] | None:
    """``(budget, depth, largest MLP ratio)`` of the space, before a file is loaded."""
    if isinstance(source, SpaceFile):
        return source.shape(budget)
    return source.budget, source.depth, space_mlp_ratio(source)


def _load(source: SearchSpace | SpaceFile, task: Task, measured: AllocatorInputs | None,
          budget: int | None) -> tuple[SearchSpace, SearchPlan | None]:
    """The space, and the allocator's plan if a file's ``allocator`` placeholders took it as
    it loaded (made for the MLP of its layer 0, ``SpaceFile.plan_mlp_ratio``)."""
    if isinstance(source, SearchSpace):
        return source, None
    made: list[SearchPlan] = []
    mlp = source.plan_mlp_ratio()

    def planner(width: int, depth: int) -> ArchConfig:  # asked once, for the space's shape
        made.append(_plan(task, measured, width, depth,
                          PlanSettings.mlp_ratio if mlp is None else mlp))
        return made[-1].plan.arch

    with space_errors():
        return source.load(budget, planner), made[0] if made else None


def _plan(task: Task, measured: AllocatorInputs | None, budget: int, depth: int,
          mlp_ratio: float) -> SearchPlan:
    return SearchPlan.make(plan_settings(budget, depth, task, measured, mlp_ratio))


def _task(task: Task | TaskSpec | str, seed: int) -> Task:
    """The task asked for: built by the one resolver from its ``TaskSpec`` (a name: at its
    paper size, seeded by ``seed``)."""
    if isinstance(task, str):
        task = TaskSpec(task, seed=seed)
    if not isinstance(task, TaskSpec):
        return task
    made = resolve_task(task)
    if made is None:
        raise SearchError("task: a task or data is required")
    return made
