"""The search driver: ``run_search`` searches per-layer configurations with Ray Tune while Optuna
records every trial in the study database. It opens the study (or resumes it), seeds it with the
allocator's plan and the uniform baselines, runs the trials through ``tune`` and summarises the
study; ``python -m workers.search`` (``workers.search.cli``) reads its flags and calls it.

From Python::

    from workers.search.driver import run_search
    summary = run_search("aot_vs_standard.yaml", "modadd", storage="sqlite:///s.db", trials=20)
    print(summary.counts, summary.best)
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna

from alloc.calibrate import with_constants
from alloc.plan import PlanSettings
from alloc.sampler import PriorSampler
from arch.memory import training_dtype
from common.errors import excerpt
from common.progress import say
from search_spaces import SearchSpace, SpaceError, load_space
from search_spaces.loader import space_shape
from studies import query
from studies import records as rec
from studies.storage import (
    StorageSettings,
    open_storage,
    reap_trials,
    redact,
    resolve_url,
    secure_url,
)
from workers.search import estimate
from workers.search.checks import (
    SearchError,
    check_study_name,
    check_trial_memory,
    check_writable_dir,
    trial_device,
)
from workers.search.options import SMOKE_TRAIN, SearchOptions
from workers.search.protocol import TrialJob
from workers.search.searcher import (
    WARM_START_FROM,
    Start,
    StudySearcher,
    finished_count,
    is_duplicate,
    retried_numbers,
)
from workers.search.seeding import (
    BoundPredictor,
    measured_inputs,
    plan_settings,
    planner,
    profile_for,
    seeds,
    space_mlp_ratio,
    starting_points,
)
from workers.search.warmstart import WarmStart, copy_trials, open_source
from workers.tasks import Task, TaskError, describe_task, make_task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchSummary:
    """What a search did: the study, trials by state, the best fully trained trial."""

    study: str
    storage: str  # password redacted
    status: str  # completed | interrupted
    counts: dict[str, int]  # trials by Optuna state
    retried: list[int]  # failed trials that were re-run
    not_run: int  # starting points (e.g. grid points) never enqueued
    best: query.TrialRecord | None = field(default=None, compare=False)
    metric: str = "value"  # the task's metric, the study's objective

    @property
    def export(self) -> str | None:
        """The command that writes the best architecture as YAML."""
        if self.best is None:
            return None
        return (f"python -m studies export --storage {shlex.quote(self.storage)} --study "
                f"{shlex.quote(self.study)} --trial {self.best.number} --out best.yaml")

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {"study": self.study, "storage": self.storage, "status": self.status,
                "trials": self.counts, "retried": self.retried, "not_run": self.not_run,
                "metric": self.metric,
                "best": None if best is None else {
                    "number": best.number, "value": best.value,
                    "params_trainable": best.params_trainable,
                    "arch": best.arch.to_dict() if best.arch else None},
                "export": self.export}


# --- the study ----------------------------------------------------------------------------------


def describe_search(space: SearchSpace, task: Task, settings: PlanSettings,
                    seed: int) -> dict[str, Any]:
    """Keyword arguments of ``studies.records.study_attrs`` for this search."""
    return {"task": task.name, "metric": task.metric, "space_name": space.name,
            "space_hash": space.hash, "alloc_inputs": asdict(settings),
            "task_fields": json.dumps(describe_task(task), sort_keys=True),
            "steps": space.fixed_train("steps"), "seed": seed}


def open_study(name: str, storage: optuna.storages.BaseStorage, url: str,
               description: dict[str, Any], maximize: bool, resume: bool) -> optuna.Study:
    """Create the study, or load it for ``resume`` after checking it is the same search."""
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        if resume:
            raise SearchError(f"--resume: no study {name!r} in {redact(url)}; run without "
                             "--resume to start it") from None
        study = optuna.create_study(study_name=name, storage=storage,
                                    direction="maximize" if maximize else "minimize")
        rec.set_study_attrs(study, **description)
        return study
    if not resume and study.trials:
        raise SearchError(f"--study {name!r}: already has {len(study.trials)} trials in "
                         f"{redact(url)}; pass --resume to continue it or choose a new name")
    if study.trials and study.user_attrs.get("record_schema") != rec.RECORD_SCHEMA:
        raise SearchError(f"--resume: study {name!r} was written by an older version whose "
                         "trial records are not comparable (record_schema "
                         f"{study.user_attrs.get('record_schema')!r}, this code writes "
                         f"{rec.RECORD_SCHEMA}); start a new study")
    mine = rec.study_attrs(**description)
    for key in ("task", "space_hash", "task_fields", "steps"):
        if key in study.user_attrs and study.user_attrs[key] != mine[key]:
            raise SearchError(f"--resume: study {name!r} was run with {key} = "
                             f"{study.user_attrs[key]!r}, this command gives {mine[key]!r}")
    if not study.trials:  # an empty study made elsewhere: describe it as ours
        rec.set_study_attrs(study, **description)
    return study


# --- running ------------------------------------------------------------------------------------


def run_search(space: SearchSpace | str | Path, task: Task | str, *, storage: str | None = None,
               study: str | None = None, trials: int | None = None, resume: bool = False,
               options: SearchOptions | None = None) -> SearchSummary:
    """Search ``space`` on ``task`` into an Optuna study: the Python face of the command.

    Args:
        space: a ``SearchSpace``, or a space file (a path or a shipped name).
        task: a ``Task`` (``workers.tasks.make_task``), or a task name at its paper size.
        storage: SQLAlchemy URL (default: ``$OPTUNA_STORAGE``, then ``sqlite:///studies.db``).
        study: study name (default: ``SPACE-TASK``).
        trials: finished trials the study should hold (default: 20, a grid's size).
        resume: continue an existing study (retrying the trials that were running).
        options: scheduler, resources, Ray address and the rest (``SearchOptions``).

    Raises:
        UsageError: bad input (one line); StorageError: the storage cannot be opened.
    """
    opts = options or SearchOptions()
    try:
        task = make_task(task, "paper", opts.seed) if isinstance(task, str) else task
    except TaskError as err:
        raise SearchError(f"--task: {err}") from None
    shape = (space.budget, space.depth, space_mlp_ratio(space)) \
        if isinstance(space, SearchSpace) else space_shape(space)
    profile = profile_for(task, opts.profile, opts.storage_path, shape, quiet=opts.quiet)
    measured = measured_inputs(profile)
    if not isinstance(space, SearchSpace):
        try:
            space = load_space(space, planner=planner(
                task, measured, shape[2] if shape else PlanSettings.mlp_ratio))
        except SpaceError as err:
            raise SearchError(f"--space: {err}") from None
    url = resolve_url(storage)
    name = study if study is not None else f"{space.name}-{task.name}"
    check_study_name(name, "--study" if study is not None else
                     f"the study name from space {excerpt(space.name)} (give --study)")
    check_writable_dir("--storage-path", opts.storage_path)
    check_trial_memory(space, task, opts)
    if opts.warm_start is not None:
        check_study_name(opts.warm_start, "--warm-start")
        if opts.warm_start == name:
            raise SearchError(f"--warm-start {opts.warm_start!r}: is the study this search "
                              "writes; give another study of the same --storage")
    settings = plan_settings(space.budget, space.depth, task, measured, space_mlp_ratio(space))
    kind = opts.sampler or space.sampler
    total = trials or (len(space.grid()) if kind == "grid" else 20)
    heartbeats = StorageSettings(heartbeat_interval=opts.heartbeat_interval,
                                 grace_period=opts.grace_period, retries=1)
    probe = open_storage(url, heartbeats)  # fail fast, before Ray starts
    try:
        warm = None if opts.warm_start is None else open_source(opts.warm_start, probe)
        if warm is not None and warm.constants is not None:
            settings = with_constants(settings, warm.constants)
        description = describe_search(space, task, settings, opts.seed)
        ot_study = open_study(name, probe, url, description, task.higher_is_better, resume)
        if warm is not None:
            note = copy_trials(warm, ot_study, space, task.io, rec.study_attrs(**description))
            print(f"warm start from study {warm.study}: constants "
                  f"{note['constants'] or 'none calibrated'}; {note['copied']} trial(s) copied"
                  + (f" ({note['trials_not_copied']})" if "trials_not_copied" in note else ""),
                  file=sys.stderr)
        if resume:
            alive = reap_trials(ot_study, probe,
                                opts.grace_period + opts.heartbeat_interval).alive
            if alive:
                raise SearchError(f"--resume: trials {alive} of {name!r} still have a live "
                                  "heartbeat; another driver is running this study")
        remaining = total - finished_count(ot_study)
        if remaining <= 0:  # nothing to run: answer before Ray starts
            print(f"study {name} already has its {total} trials", file=sys.stderr)
            return summarise(_searcher(space, task, ot_study, probe, settings, kind, opts), name,
                             url, "completed")
    finally:
        probe.engine.dispose()  # its connections are not needed past the checks
    announce_estimate(name, space, task, starting_points(space, settings, kind), remaining, opts)
    from workers.search import tune  # Ray starts here

    tune.start(opts.address)
    url = secure_url(url)  # after Ray started its processes, so they never inherit it
    rdb = open_storage(url, heartbeats)
    sampler = _sampler(space, kind, settings, opts, warm)
    ot_study = optuna.load_study(study_name=name, storage=rdb, sampler=sampler)
    searcher = _searcher(space, task, ot_study, rdb, settings, kind, opts)
    status = _run(searcher, space, task, total, name, url, opts)
    return summarise(searcher, name, url, status)


def _searcher(space: SearchSpace, task: Task, study: optuna.Study,
              storage: optuna.storages.RDBStorage, settings: PlanSettings,
              sampler: str, opts: SearchOptions) -> StudySearcher:
    return StudySearcher(space, io=task.io, study=study, storage=storage, metric=task.metric,
                         mode="max" if task.higher_is_better else "min",
                         steps=int(space.fixed_train("steps")), predict=BoundPredictor(settings),
                         starts=starting_points(space, settings, sampler),
                         kv_dtype=training_dtype(trial_device(opts)))


def _sampler(space: SearchSpace, kind: str, settings: PlanSettings, opts: SearchOptions,
             warm: WarmStart | None) -> optuna.samplers.BaseSampler:
    """The Optuna sampler ``kind`` names (a grid's points are enqueued; TPE samples past them)."""
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=opts.seed)
    if kind == "prior":
        fitted = warm is not None and warm.constants is not None
        return PriorSampler.for_space(
            space, settings, temperature=opts.prior_temperature, seed=opts.seed,
            source=f"calibrated by study {warm.study}" if fitted and warm else None,
            plan=next((s.params for s in seeds(space, settings) if s.label == "allocator"),
                      None))
    return optuna.samplers.TPESampler(seed=opts.seed, constant_liar=True)


def _run(searcher: StudySearcher, space: SearchSpace, task: Task, total: int, name: str,
         url: str, opts: SearchOptions) -> str:
    """Run the trials the study still lacks; returns how the run ended."""
    from workers.search import tune

    remaining = total - finished_count(searcher.study)  # > 0: run_search checked
    job = trial_job(task, opts)
    steps = int(space.fixed_train("steps"))
    run = tune.TuneRun(name=f"{name}-{time.strftime('%Y%m%d-%H%M%S')}",
                       storage_path=opts.storage_path, trials=remaining, steps=steps,
                       eval_every=int(space.fixed_train("eval_every")), scheduler=opts.scheduler,
                       cpus_per_trial=opts.cpus_per_trial, gpus_per_trial=opts.gpus_per_trial,
                       max_concurrent=opts.max_concurrent, reuse_actors=opts.reuse_actors,
                       heartbeat_interval=opts.heartbeat_interval, quiet=opts.quiet)
    say(f"search {name}: {remaining} trial(s) of {space.name} on {task.name} ({steps} steps "
        f"each), study in {redact(url)}, Ray results in {opts.storage_path / run.name}",
        quiet=opts.quiet)
    status = tune.run_tuner(searcher, job, run)
    failed = searcher.abandon("interrupted")
    if failed:
        status = "interrupted"
        print(f"interrupted: trials {failed} failed and re-enqueued; continue with --resume",
              file=sys.stderr)
    return status


def trial_job(task: Task, opts: SearchOptions) -> TrialJob:
    """What every trial of the search shares."""
    return TrialJob(task=describe_task(task), metric=task.metric,
                    mode="max" if task.higher_is_better else "min", seed=opts.seed,
                    device=trial_device(opts), threads=max(1, int(opts.cpus_per_trial)),
                    checkpoints=opts.checkpoints)


def announce_estimate(name: str, space: SearchSpace, task: Task, starts: list[Start],
                      trials: int, opts: SearchOptions) -> None:
    """Say, before Ray starts, how long a trial and the search will take here, from a few
    timed training steps (``workers.search.estimate``; a second or two). Not on a cluster
    (``--address``): its workers are not this machine; the estimate from the finished trials
    follows there as here."""
    if opts.quiet or opts.address is not None:
        return
    try:
        timed = estimate.probe(space, task, trial_job(task, opts), starts)
    except (RuntimeError, MemoryError) as err:  # e.g. a GPU that cannot hold it next to others
        log.warning("no estimate of the trial time: timing a few steps failed (%s)", err)
        return
    concurrent = estimate.at_once(opts.cpus_per_trial, opts.gpus_per_trial,
                                  opts.max_concurrent, trials)
    say(f"search {name}: {estimate.describe(timed, trials, concurrent, opts.scheduler)}")


def summarise(searcher: StudySearcher, name: str, url: str, status: str) -> SearchSummary:
    trials = searcher.study.get_trials(deepcopy=False)
    counts: dict[str, int] = {}
    for t in trials:
        kind = ("DUPLICATE" if is_duplicate(t) else "WARM_START" if WARM_START_FROM in
                t.user_attrs else t.state.name)
        counts[kind] = counts.get(kind, 0) + 1
    try:
        _, winners = query.top(searcher.storage.engine, name, 1)
        best = winners[0]
    except query.QueryError:
        best = None
    return SearchSummary(name, redact(url), status, counts, sorted(retried_numbers(trials)),
                         searcher.not_run(), best, searcher.metric)


def training_budget(space: SearchSpace, smoke_test: bool = False,
                    steps: int | None = None) -> SearchSpace:
    """``space`` at smoke size (``SMOKE_TRAIN``) and/or with ``steps`` per trial."""
    if smoke_test:
        space = space.with_train(**SMOKE_TRAIN)
    if steps:
        space = space.with_train(steps=steps, eval_every=min(int(space.fixed_train(
            "eval_every")), steps))
    return space
