"""The study a search writes: what it records of the search (``describe_search``), creating it or
loading it to resume after checking it is the same search (``open_study``), a warm start's
constants and trials, the trials a dead driver left running, and the Optuna sampler the search
asks (``make_sampler``). No Ray here: all of it happens before Ray starts, except the sampler."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import optuna

from alloc import PlanSettings, PriorSampler, with_constants
from arch import RECIPE
from common.errors import Problem
from search_spaces import SearchSpace
from studies import reap_trials, records as rec, redact
from studies.trials import Direction
from workers.errors import SearchError
from workers.search.request import SearchRequest
from workers.search.searcher import requeue_ray_failures
from workers.search.seeding import SearchPlan, plan_anchor, seeds
from workers.search.warmstart import WarmStart, copy_trials, open_source
from workers.tasks import Task, describe_task

log = logging.getLogger(__name__)


def describe_search(space: SearchSpace, task: Task, settings: PlanSettings,
                    seed: int) -> dict[str, Any]:
    """Keyword arguments of ``studies.records.study_attrs`` for this search."""
    return {"task": task.name, "metric": task.metric, "space_name": space.name,
            "space_hash": space.hash, "alloc_inputs": asdict(settings),
            "task_fields": json.dumps(describe_task(task), sort_keys=True),
            "steps": space.fixed_train("steps"), "seed": seed, "recipe": RECIPE}


def open_study(name: str, storage: optuna.storages.BaseStorage, url: str,
               description: dict[str, Any], direction: Direction, resume: bool,
               more: tuple[Direction, ...] = ()) -> optuna.Study:
    """Create the study, or load it for ``resume`` after checking it is the same search
    (``more``: the directions of its objectives after the first, a multi-objective study's)."""
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        if resume:
            raise SearchError.of([Problem("resume", True, f"no study {name!r} in {redact(url)}; "
                                          "run without {resume} to start it", shown="")]) from None
        study = optuna.create_study(study_name=name, storage=storage,
                                    directions=[d.value for d in (direction, *more)])
        rec.set_study_attrs(study, **description)
        return study
    if not resume and study.trials:
        raise SearchError.of([Problem("study", name, f"already has {len(study.trials)} trials in "
                                      f"{redact(url)}; pass {{resume}} to continue it or choose a "
                                      "new name", shown=repr(name))])
    check_same_search(study, name, description)
    if study.trials and "recipe" not in study.user_attrs:
        log.warning("study %r predates the training recipe's record (before 2026-11-28: "
                    "warmup 0.05, lr 1e-3 unless the space set them); trials added now train "
                    "with %s", name, RECIPE)
    if not study.trials:  # an empty study made elsewhere: describe it as ours
        rec.set_study_attrs(study, **description)
    return study


def check_same_search(study: optuna.Study, name: str, description: dict[str, Any]) -> None:
    """Refuse an existing study this search is not: one an older version wrote, or one of
    another search (its task, space, steps or recipe). Reads only.

    Raises:
        SearchError: which, in one line.
    """
    if study.trials and study.user_attrs.get("record_schema") != rec.RECORD_SCHEMA:
        raise SearchError.of([Problem("resume", True, f"study {name!r} was written by an older "
                                      "version whose trial records are not comparable "
                                      f"(record_schema {study.user_attrs.get('record_schema')!r}, "
                                      f"this code writes {rec.RECORD_SCHEMA}); start a new study",
                                      shown="")])
    mine = rec.study_attrs(**description)
    for key in ("task", "space_hash", "task_fields", "steps", "recipe"):
        if key in study.user_attrs and study.user_attrs[key] != mine[key]:
            raise SearchError.of([Problem("resume", True, f"study {name!r} was run with {key} = "
                                          f"{study.user_attrs[key]!r}, this command gives "
                                          f"{mine[key]!r}", shown="")])


def check_existing_study(request: SearchRequest, storage: optuna.storages.BaseStorage) -> None:
    """``check_same_search`` on the request's study if it exists, before anything is written
    (the driver's lease): a refused command leaves the database as it was. Whether it may be
    continued (its trials, ``--resume``) is asked under the lease, whose refusal names a
    driver still running it."""
    try:
        study = optuna.load_study(study_name=request.study, storage=storage)
    except KeyError:
        return
    if study.trials and not request.resume:  # refused under the lease, as it names a driver
        return
    check_same_search(study, request.study, describe_search(
        request.space, request.task, request.plan.settings, request.options.seed))


@dataclass(frozen=True)
class OpenedStudy:
    """The study of a search, ready for its trials."""

    study: optuna.Study
    plan: SearchPlan  # the allocator's, from its inputs with a warm start's constants
    warm: WarmStart | None  # what ``--warm-start`` carried over


def open_search_study(request: SearchRequest,
                      storage: optuna.storages.RDBStorage) -> OpenedStudy:
    """Open (or resume) the request's study in ``storage``, whose lease the caller holds: the
    warm start's constants and trials carried over, and on ``resume`` the trials of a dead
    driver failed and retried.

    Raises:
        SearchError: the study is not this search's.
    """
    opts, planned = request.options, request.plan
    warm = None if opts.warm_start is None else open_source(opts.warm_start, storage)
    if warm is not None and warm.constants is not None:  # other inputs: the plan made again
        planned = SearchPlan.make(with_constants(planned.settings, warm.constants))
    description = describe_search(request.space, request.task, planned.settings, opts.seed)
    study = open_study(request.study, storage, request.storage, description,
                       Direction.of(request.task.higher_is_better), request.resume)
    if warm is not None:
        note = copy_trials(warm, study, request.space, request.task.io,
                           rec.study_attrs(**description))
        print(f"warm start from study {warm.study}: constants "
              f"{note['constants'] or 'none calibrated'}; {note['copied']} trial(s) copied"
              + (f" ({note['trials_not_copied']})" if "trials_not_copied" in note else ""),
              file=sys.stderr)
        if warm.ignored:
            print(f"warm start: {warm.ignored}", file=sys.stderr)
    if request.resume:  # the driver holds the study's lease: what still runs is a dead one's
        reaped = reap_trials(study, storage)
        if reaped:
            print(f"--resume: trials {reaped} of the last driver were still running: marked "
                  "interrupted and retried", file=sys.stderr)
        again = requeue_ray_failures(study)
        if again:
            print(f"--resume: trials {again} failed for the machine (Ray, a full disk), not "
                  "their point: retried", file=sys.stderr)
    return OpenedStudy(study, planned, warm)


def session_seed(seed: int, trials_before: int) -> int:
    """The seed of a sampler that continues a study holding ``trials_before`` trials: ``seed``
    itself for a new study; for a resumed one a seed drawn from both, so that a seeded sampler
    does not draw again, point for point, what the first run drew (a random search resumed
    with ``seed`` would repeat its first trials), while the same resume still draws the same."""
    if trials_before == 0:
        return seed
    return int(np.random.SeedSequence([seed, trials_before]).generate_state(1)[0])


def make_sampler(request: SearchRequest, planned: SearchPlan, warm: WarmStart | None,
                 seed: int) -> optuna.samplers.BaseSampler:
    """The Optuna sampler the request names, seeded with ``seed`` (``session_seed``; a
    grid's points are enqueued; TPE samples past them)."""
    return SAMPLERS[request.sampler](request, planned, warm, seed)


def _tpe(request: SearchRequest, planned: SearchPlan, warm: WarmStart | None, seed: int
         ) -> optuna.samplers.BaseSampler:
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


def _random(request: SearchRequest, planned: SearchPlan, warm: WarmStart | None, seed: int
            ) -> optuna.samplers.BaseSampler:
    return optuna.samplers.RandomSampler(seed=seed)


def _prior(request: SearchRequest, planned: SearchPlan, warm: WarmStart | None, seed: int
           ) -> optuna.samplers.BaseSampler:
    """The allocator's bound as the prior (re-fitted by a warm start's study, if it has one),
    its mode the allocator's own plan."""
    opts, fitted = request.options, warm is not None and warm.constants is not None
    return PriorSampler.for_space(
        request.space, planned.settings, temperature=opts.prior_temperature, seed=seed,
        source=f"calibrated by study {warm.study}" if fitted and warm else None,
        plan=plan_anchor(seeds(request.space, planned)))


# Each sampler's Optuna sampler (``search_spaces.SAMPLER_KINDS`` says what it does around it):
# the grid's points are enqueued, TPE samples past them.
SAMPLERS: Mapping[str, Callable[[SearchRequest, SearchPlan, WarmStart | None, int],
                                optuna.samplers.BaseSampler]] = {
    "tpe": _tpe, "grid": _tpe, "random": _random, "prior": _prior}
