"""The search driver: ``run_search`` searches per-layer configurations with Ray Tune while Optuna
records every trial in the study database. A search is checked once into a ``SearchRequest``
(``workers.search.request``), then ``execute`` opens its study (or resumes it: ``study``), seeds
it with the allocator's plan and the uniform baselines, runs the trials the study still lacks
through ``tune`` and summarises the study; ``python -m workers.search`` (``workers.search.cli``)
builds the request from its flags and executes it.

From Python::

    from workers.search import run_search
    summary = run_search("aot_vs_standard.yaml", "modadd", storage="sqlite:///s.db", trials=20)
    print(summary.counts, summary.best)
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from arch import training_dtype
from common.errors import Problem, shell_word
from common.progress import say
from search_spaces import SearchSpace
from studies import (
    STORAGE_ERRORS,
    Lease,
    QueryError,
    StorageFaultError,
    StorageSettings,
    command_note,
    guarded,
    open_storage,
    query,
    records as rec,
    redact,
    secure_url,
)
from studies.trials import WARM_START_FROM, Direction, TrialRecord, TrialStatus
from workers.errors import SearchFaultError
from workers.search import estimate
from workers.search.checks import trial_device
from workers.search.guard import GuardedSearcher
from workers.search.options import SearchOptions
from workers.search.protocol import StudentJob, TrialJob
from workers.search.request import SearchRequest, prepare
from workers.search.searcher import (
    StudySearcher,
    finished_count,
    not_trained,
    retried_numbers,
)
from workers.search.seeding import BoundPredictor, SearchPlan, Start, starting_points
from workers.search.study import (
    check_existing_study,
    make_sampler,
    open_search_study,
    session_seed,
)
from workers.tasks import Task, describe_task

if TYPE_CHECKING:
    from workers.search.tune import TuneRun

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchSummary:
    """What a search did: the study, trials by state, the best fully trained trial."""

    study: str
    storage: str  # password redacted
    status: TrialStatus  # COMPLETED, INTERRUPTED (Ctrl-C), TERMINATED (SIGTERM), STOPPED
    counts: dict[str, int]  # trials by Optuna state
    retried: list[int]  # failed trials that were re-run
    not_run: int  # starting points (e.g. grid points) never enqueued
    best: TrialRecord | None = field(default=None, compare=False)
    metric: str = "value"  # the task's metric, the study's objective

    @property
    def export(self) -> str | None:
        """The command that writes the best architecture as YAML; a password of the storage
        stays ``***`` (``studies`` reads it from ``$PGPASSWORD`` or ``~/.pgpass``), which a
        shell comment after the command says."""
        if self.best is None:
            return None
        return (f"python -m studies export --storage {shell_word(self.storage)} --study "
                f"{shell_word(self.study)} --trial {self.best.number} --out best.yaml"
                f"{command_note(self.storage)}")

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {"study": self.study, "storage": self.storage, "status": str(self.status),
                "trials": self.counts, "retried": self.retried, "not_run": self.not_run,
                "metric": self.metric,
                "best": None if best is None else {
                    "number": best.number, "value": best.value,
                    "params_trainable": best.params_trainable,
                    "arch": best.arch.to_dict() if best.arch else None},
                "export": self.export}


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
        SearchError: bad input (one line); StorageError: the storage cannot be opened.
    """
    return execute(prepare(space, task, storage=storage, study=study, trials=trials,
                           resume=resume, options=options))


def execute(request: SearchRequest) -> SearchSummary:
    """Run a checked search: take its study's lease, open (or resume) the study, answer at once
    if it already has its trials, else run the trials it lacks through Ray Tune; the study
    summarised.

    Raises:
        SearchError: the study is not this search's; StorageError: the storage cannot be opened;
        LeaseError: another driver runs the study; StorageFaultError: the storage failed while
        the search ran (the study is left as ``--resume`` continues it).
    """
    opts = request.options
    heartbeats = StorageSettings(heartbeat_interval=opts.heartbeat_interval,
                                 grace_period=opts.grace_period, retries=1)
    # before Ray starts; a connection that drops as it opens is retried like any other
    probe = open_storage(request.storage, heartbeats, patience=opts.storage_patience)
    try:
        # read before the lease is written: a study this search may not continue is refused
        # with the database as it was
        guarded(lambda: check_existing_study(request, probe), request.storage,
                opts.storage_patience)
        return _leased(request, probe, heartbeats)
    finally:
        probe.engine.dispose()


def _leased(request: SearchRequest, probe: optuna.storages.RDBStorage,
            heartbeats: StorageSettings) -> SearchSummary:
    """``execute`` under the study's lease, released however it ends."""
    opts = request.options
    lease = Lease(probe.engine, request.study, ttl=opts.grace_period)
    try:
        dead = guarded(lambda: lease.acquire(take_stale=request.resume), request.storage,
                       opts.storage_patience)
        if dead is not None:
            say(f"study {request.study}: took over from its last driver "
                f"({dead.describe(time.time())})", quiet=opts.quiet)
        return _execute(request, probe, lease, heartbeats)
    finally:
        with contextlib.suppress(*STORAGE_ERRORS):  # a lease left behind is stale once we exit
            lease.release()


def _execute(request: SearchRequest, probe: optuna.storages.RDBStorage, lease: Lease,
             heartbeats: StorageSettings) -> SearchSummary:
    """``execute`` once the lease is held."""
    opts, url = request.options, request.storage
    opened = guarded(lambda: open_search_study(request, probe), url, opts.storage_patience)
    remaining = request.trials - finished_count(opened.study)
    starts = starting_points(request.space, opened.plan, request.sampler, opts.points)
    if remaining <= 0:  # nothing to run: answer before Ray starts
        print(f"study {request.study} already has its {request.trials} trials",
              file=sys.stderr)
        return summarise(_searcher(request, opened.study, probe, opened.plan, starts),
                         request.study, url, TrialStatus.COMPLETED)
    announce_estimate(request, starts, remaining)
    from workers.search import tune  # Ray starts here

    # Ray stops at the end of the search (unless the caller had started it): its last words
    # (a dead worker's) come while the search's stdout is aside (``cli.stdout_aside``)
    with tune.session(opts.address):
        url = secure_url(url)  # after Ray started its processes, so they never inherit it
        rdb = open_storage(url, heartbeats, patience=opts.storage_patience)
        sampler = make_sampler(request, opened.plan, opened.warm,
                               session_seed(opts.seed, len(opened.study.trials)))
        study = optuna.load_study(study_name=request.study, storage=rdb, sampler=sampler)
        searcher = GuardedSearcher(_searcher(request, study, rdb, opened.plan, starts), url,
                                   lease, patience=opts.storage_patience)
        status = _run(searcher, request, url, remaining)
        return guarded(lambda: summarise(searcher.inner, request.study, url, status), url,
                       opts.storage_patience)


def _searcher(request: SearchRequest, study: optuna.Study,
              storage: optuna.storages.RDBStorage, planned: SearchPlan,
              starts: list[Start]) -> StudySearcher:
    space, task = request.space, request.task
    return StudySearcher(space, io=task.io, study=study, storage=storage, metric=task.metric,
                         direction=Direction.of(task.higher_is_better),
                         steps=int(space.fixed_train("steps")),
                         predict=BoundPredictor(planned.settings), starts=starts,
                         kv_dtype=training_dtype(trial_device(request.options)))


def _run(searcher: GuardedSearcher, request: SearchRequest, url: str, remaining: int
         ) -> TrialStatus:
    """Run the ``remaining`` trials the study still lacks; returns how the run ended."""
    from workers.search import tune

    space, task, opts, name = request.space, request.task, request.options, request.study
    steps = int(space.fixed_train("steps"))
    run = tune.TuneRun(name=f"{name}-{time.strftime('%Y%m%d-%H%M%S')}", trials=remaining,
                       steps=steps, eval_every=int(space.fixed_train("eval_every")),
                       options=opts, concurrent=_concurrency(opts, remaining))
    say(f"search {name}: {remaining} trial(s) of {space.name} on {task.name} ({steps} steps "
        f"each), study in {redact(url)}, Ray results in {opts.storage_path / run.name}",
        quiet=opts.quiet)
    return run_trials(searcher, trial_job(task, opts), run)


def run_trials(searcher: GuardedSearcher, job: TrialJob | StudentJob, run: TuneRun
               ) -> TrialStatus:
    """Run ``run``'s trials through Ray Tune; the open trials marked and re-enqueued when the
    run was interrupted, a full disk or a storage fault raised as one line."""
    from workers.search import tune

    opts = run.options
    with terminated_as_interrupted() as signals:
        status = tune.run_tuner(searcher, job, run, stop=searcher.should_stop)
    how = TrialStatus.TERMINATED if signals.terminated else TrialStatus.INTERRUPTED
    if searcher.inner.halt is not None:
        _stop_on_full_disk(searcher, opts.storage_path / run.name)
    failed = None if searcher.fault else searcher.abandon(how)
    if searcher.fault is not None:
        _stop_on_fault(searcher)
    if failed or signals.terminated:
        status = how
        print(f"{how}: trials {failed} failed and re-enqueued; continue with --resume",
              file=sys.stderr)
    return status


def _concurrency(opts: SearchOptions, trials: int) -> int:
    """Trials that run at once: what Ray's resources allow, at most ``--max-concurrent`` (a
    limit beyond the resources is said, once) and ``trials``."""
    from workers.search import tune

    can = tune.capacity(opts.cpus_per_trial, opts.gpus_per_trial)
    if opts.max_concurrent is not None and opts.max_concurrent > can:
        gpus = f" and {opts.gpus_per_trial:g} GPU" if opts.gpus_per_trial else ""
        say(f"--max-concurrent {opts.max_concurrent}: Ray can run {can} trial(s) at once here "
            f"({opts.cpus_per_trial:g} CPU{gpus} per trial); {can} will", quiet=opts.quiet)
    return max(1, min(can, opts.max_concurrent or can, trials))


def _stop_on_full_disk(searcher: GuardedSearcher, folder: Path) -> None:
    """After a trial found the results disk full: the running trials marked interrupted and
    re-enqueued, then the fault in one line (every trial it failed runs again on --resume)."""
    searcher.abandon(TrialStatus.INTERRUPTED)
    raise SearchFaultError.of([Problem(
        "storage_path", "", f"the Ray results folder {str(folder)!r} is on a full disk (No "
        "space left on device): the search stopped and its failed trials are not counted; free "
        "space there, then continue with {resume}")])


def _stop_on_fault(searcher: GuardedSearcher) -> None:
    """After the storage failed: one try at marking the open trials interrupted (the database
    may be back), then the fault, as one line."""
    fault = searcher.fault
    assert fault is not None
    try:
        failed = guarded(lambda: searcher.inner.abandon(TrialStatus.INTERRUPTED), searcher.url,
                         patience=0)
        if failed:
            print(f"trials {failed} marked interrupted and re-enqueued", file=sys.stderr)
    except StorageFaultError:
        print("the running trials could not be marked: --resume fails and retries them",
              file=sys.stderr)
    raise fault


@contextlib.contextmanager
def terminated_as_interrupted() -> Iterator[_Signals]:
    """SIGTERM (a scheduler's or an operator's stop) handled as Ctrl-C is: Tune stops the
    trials and returns, the driver marks the open ones and exits (143). Ray's own SIGTERM
    handler in this process would print a native stack trace and leave the trials RUNNING."""
    signals = _Signals()
    if threading.current_thread() is not threading.main_thread():
        yield signals  # only the main thread may handle signals (e.g. a notebook's thread)
        return

    def on_term(signum: int, frame: object) -> None:
        signals.terminated = True
        signal.raise_signal(signal.SIGINT)  # Tune's graceful stop, as for a first Ctrl-C

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield signals
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class _Signals:
    terminated: bool = False


def trial_job(task: Task, opts: SearchOptions) -> TrialJob:
    """What every trial of the search shares."""
    return TrialJob(task=describe_task(task), metric=task.metric,
                    direction=Direction.of(task.higher_is_better), seed=opts.seed,
                    device=trial_device(opts), threads=max(1, int(opts.cpus_per_trial)),
                    checkpoints=opts.checkpoints)


def announce_estimate(request: SearchRequest, starts: list[Start], trials: int) -> None:
    """Say, before Ray starts, how long a trial and the search will take here, from a few
    timed training steps (``workers.search.estimate``; a second or two). Not on a cluster
    (``--address``): its workers are not this machine; the estimate from the finished trials
    follows there as here."""
    opts, task = request.options, request.task
    if opts.quiet or opts.address is not None:
        return
    try:
        timed = estimate.probe(request.space, task, trial_job(task, opts), starts)
    except (RuntimeError, MemoryError) as err:  # e.g. a GPU that cannot hold it next to others
        log.warning("no estimate of the trial time: timing a few steps failed (%s)", err)
        return
    concurrent = estimate.at_once(opts.cpus_per_trial, opts.gpus_per_trial,
                                  opts.max_concurrent, trials)
    search = estimate.SearchEstimate(timed, trials, concurrent, opts.reuse_actors,
                                     estimate.slowdown())
    say(f"search {request.study}: {estimate.describe(search, opts.scheduler)}")


def summarise(searcher: StudySearcher, name: str, url: str, status: TrialStatus
              ) -> SearchSummary:
    """What the study ``name`` holds after a search that ended as ``status``."""
    trials = searcher.study.get_trials(deepcopy=False)
    counts: dict[str, int] = {}
    for t in trials:
        kind = (t.user_attrs[rec.STATUS].upper() if not_trained(t) else
                "WARM_START" if WARM_START_FROM in t.user_attrs else t.state.name)
        counts[kind] = counts.get(kind, 0) + 1
    try:
        _, winners = query.top(searcher.storage.engine, name, 1)
        best = winners[0]
    except QueryError:
        best = None
    return SearchSummary(name, redact(url), status, counts, sorted(retried_numbers(trials)),
                         searcher.not_run(), best, searcher.metric)
