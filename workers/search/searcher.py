"""The study side of a search: ask, record and tell Optuna trials safely, without Ray.

``StudySearcher`` is what the Ray Tune adapter (``workers.search.tune``) calls for every trial; it
speaks only Optuna's public ask/tell API, so it runs (and is tested) without Ray. It closes the
ways a stock ``OptunaSearch`` on an SQL study loses or corrupts trials:

* a trial is COMPLETE only if its last result reached the full ``steps``; a trial the scheduler
  stopped early is PRUNED with ``steps_reached``;
* a trial that raised or produced NaN is FAIL with its error in the user attr ``error``;
* a trial whose worker died once Ray's in-place restarts (user attr ``restarts``) were spent is
  FAIL, and retried ``WORKER_RETRIES`` more times as a new trial from its last checkpoint;
* a dead driver's trials are failed and retried on ``--resume`` (``studies.storage.
  reap_trials``), each continuing from the checkpoint its failed original recorded;
* starting points (seeds, a grid) are enqueued one at a time as trials are asked: none waits;
* telling an already finished trial (a late or duplicated completion) is logged and skipped;
* no point is trained twice: a proposal identical to a finished trial (same params: the same
  architecture and training values) is recorded as a FAIL with status ``duplicate`` (not
  trained, not counted against ``--trials``) and the sampler is asked again; after
  ``MAX_REDRAWS`` such proposals in a row a point not tried yet is enqueued, and when every
  point of the space has a trial the search ends (``ask`` returns None).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import random
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, Trial, TrialState

from alloc import MAX_CANDIDATES, point_key
from arch import ArchConfig, ModelIO
from search_spaces import SearchSpace, SpaceError
from studies import records as rec, retry_failed
from studies.trials import (
    CHECKPOINT,
    CHECKPOINT_STEP,
    RESTARTS,
    WARM_START_FROM,
    Direction,
    TrialRecord,
    TrialStatus,
)
from workers.search.asking import ask_new, tell
from workers.search.failures import Death, RayFailure, failure_line, ray_failure
from workers.search.protocol import TRIAL_KEY, TrialReport, TrialSpec, told_record
from workers.search.seeding import Start

log = logging.getLogger(__name__)
# The allocator's predicted error of a sampled architecture (recorded on its trial), or None.
PredictError = Callable[[ArchConfig], float | None]
# A trial whose worker died after Ray's own in-place restart (``FailureConfig``) is retried this
# many more times by the study, each time as a new trial from the chain's last checkpoint.
WORKER_RETRIES = 1
# How a retry's original ended (Optuna's retry copies its attrs: the retry starts without these).
ENDED_ATTRS = (rec.ERROR, rec.NODE, rec.RESUMED, RESTARTS)


@dataclass(frozen=True)
class Best:
    """The best fully trained trial so far: what a progress line shows (``shown``: how to name
    it there, where its architecture's description is not the best name)."""

    value: float
    number: int
    arch: ArchConfig
    shown: str = ""

    def describe(self) -> str:
        return self.shown or self.arch.describe()


@dataclass
class Asked:
    """A trial this searcher asked, as it runs: its Optuna trial and architecture, its last
    report, the step of its last checkpoint, Ray's in-place restarts, whether it was told, and
    its worker's death as handled. Mutable: it changes as Tune's events arrive."""

    trial: Trial
    arch: ArchConfig
    last: TrialReport | None = None  # dropped once told
    saved: int | None = None  # the step of the trial's last checkpoint
    restarts: int = 0  # Ray's in-place restarts of the trial
    told: bool = False
    death: Death | None = None  # its worker died, as handled


class StudySearcher:
    """Samples ``space`` define-by-run into ``study`` and records every trial.

    Trials are keyed by the caller's id (Ray Tune's trial id); ``storage`` is the study's
    ``RDBStorage``, used for the driver's heartbeats; ``kv_dtype`` is the dtype the trials
    train in (``arch.memory.training_dtype``), which their recorded KV cache is counted in.
    Each finished trial is classified once, when it is told: ``counts`` holds the trials this
    searcher told by state, and ``best`` the best fully trained trial so far (an earlier run's
    too), so what a progress line shows is what the study records.
    """

    def __init__(self, space: SearchSpace, *, io: ModelIO, study: optuna.Study,
                 storage: RDBStorage, metric: str, direction: Direction, steps: int,
                 predict: PredictError, starts: Sequence[Start] = (),
                 kv_dtype: str = "float32") -> None:
        self.space, self.io, self.study, self.storage = space, io, study, storage
        self.kv_dtype = kv_dtype
        self.metric, self.direction, self.steps, self.predict = metric, direction, steps, predict
        self.starts = list(starts)
        self.asked: dict[str, Asked] = {}  # by the caller's trial id
        self.waiting = 0  # retries of dead workers' trials enqueued and not asked yet
        self.exhausted = False  # every point of the space has a trial
        self.halt: RayFailure | None = None  # a failure that stops the search (a full disk)
        self.counts = {TrialState.COMPLETE.name: 0, TrialState.PRUNED.name: 0,
                       TrialState.FAIL.name: 0}
        self._rng = random.Random(study.study_name)
        self._points: list[dict[str, Any]] | None = None  # the space's, listed on first need
        self._study_id = storage.get_study_id_from_name(study.study_name)
        self.best = self.best_so_far()

    @property
    def trials(self) -> dict[str, Trial]:
        """The Optuna trial of each trial asked."""
        return {key: run.trial for key, run in self.asked.items()}

    @property
    def done(self) -> set[str]:
        """The trials asked and told."""
        return {key for key, run in self.asked.items() if run.told}

    @property
    def deaths(self) -> dict[str, Death]:
        """The trials whose worker died, as handled."""
        return {key: run.death for key, run in self.asked.items() if run.death is not None}

    def _open(self, key: str) -> Asked | None:
        """The trial ``key`` if this searcher asked it and has not told it."""
        run = self.asked.get(key)
        return None if run is None or run.told else run

    # --- asking ---------------------------------------------------------------------------

    def suggest(self, key: str, total: int) -> dict[str, TrialSpec] | Literal["wait", "end"]:
        """What Tune runs next to finish ``total`` trials: a new trial or a waiting retry;
        ``wait`` while the trials running make the total (one may die and need a retry); ``end``
        once none runs. Never more than ``total`` trials run or count as finished."""
        told = sum(run.told for run in self.asked.values())
        running = len(self.asked) - told
        if self.halt is not None:
            return "wait" if running else "end"
        retried = sum(run.death is not None and run.death.retry is not None
                      for run in self.asked.values())
        if self.waiting or (told - retried + running < total and not self.exhausted):
            config = self.ask(key)
            if config is not None:
                return config
            self.exhausted = True  # ask() said so once; a retry enqueued later still runs
        return "wait" if running else "end"

    def ask(self, key: str) -> dict[str, TrialSpec] | None:
        """A new trial for ``key``: its ``TrialSpec`` (the architecture wired to the task, the
        sampled training fields, the checkpoint of the failed trial it retries), as the config
        dict Tune merges into the job's; None when every point of the space is trained."""
        if self._exhausted():
            log.warning("every point of space %s has a trial: the search ends", self.space.name)
            return None
        trial, (arch, train) = ask_new(self.study, self._ask, self._untried, self._rng)
        for name, value in rec.trial_attrs(arch, predicted_error=self.predict(arch),
                                           status=TrialStatus.RUNNING,
                                           kv_dtype=self.kv_dtype).items():
            trial.set_user_attr(name, value)
        chain = self._chain(trial.number)
        if chain:  # a retry: it starts with no error, and no outcome, of the trial it copies
            for name in [n for n in ENDED_ATTRS if trial.user_attrs.get(n) is not None]:
                trial.set_user_attr(name, None)
        self._beat(trial.number)
        source = self._last_checkpointed(chain)
        resume = None if source is None else Path(source.user_attrs[CHECKPOINT])
        # Handed out only once every read and write of the ask is done: a connection that
        # drops before this line leaves the trial RUNNING and not handed out, which the guard
        # records as an orphan (a retry's enqueued again) before it asks again. Recorded
        # earlier, the lost trial counted as running forever, and a search with its last place
        # taken by it never ended.
        if chain:
            self.waiting = max(0, self.waiting - 1)
        self.asked[key] = Asked(trial, arch)
        return {TRIAL_KEY: TrialSpec(arch, train, resume)}

    def _ask(self) -> tuple[Trial, tuple[ArchConfig, dict[str, Any]]]:
        self._enqueue_next_start()
        with warnings.catch_warnings():  # heartbeats with ask/tell are this class's point
            warnings.filterwarnings("ignore", "Heartbeat of storage is supposed to be used")
            trial = self.study.ask()
        return trial, self.space.sample(trial, self.io)

    def _untried(self) -> list[dict[str, Any]] | None:
        """The points of the space no trial has; None for a space too large to list."""
        if self._points is None:
            try:
                self._points = self.space.grid(limit=MAX_CANDIDATES)
            except SpaceError:  # a numeric range, or too many points: repeats are unlikely
                self._points = []
        if not self._points:
            return None
        tried = {point_key(t.params) for t in self.study.get_trials(deepcopy=False)}
        return [p for p in self._points if point_key(p) not in tried]

    def _exhausted(self) -> bool:
        """Every point of a listable space has a trial and none waits to be run again."""
        return self._untried() == [] and not self.study.get_trials(
            deepcopy=False, states=(TrialState.WAITING,))

    def _enqueue_next_start(self) -> None:
        """Enqueue the next starting point not yet in the study, unless a trial is waiting
        (a retry, or a point enqueued before)."""
        while self.starts and not self.study.get_trials(deepcopy=False,
                                                        states=(TrialState.WAITING,)):
            start = self.starts.pop(0)
            self.study.enqueue_trial(dict(start.params), user_attrs={rec.SEED: start.label},
                                     skip_if_exists=True)

    def _chain(self, number: int) -> set[int]:
        """The failed trials trial ``number`` retries (Optuna's retry history: every trial of
        the chain before it); empty for a trial that is no retry."""
        return set(retry_history(self._frozen(number)))

    def _last_checkpointed(self, numbers: set[int]) -> FrozenTrial | None:
        """The latest of these trials that recorded a checkpoint (a retry continues from it)."""
        if not numbers:  # no retry: no read of the study (its open trials) to wait on or lose
            return None
        done = [t for t in self.study.get_trials(deepcopy=False)
                if t.number in numbers and CHECKPOINT in t.user_attrs]
        return max(done, key=lambda t: t.number) if done else None

    def _frozen(self, number: int) -> FrozenTrial:
        trial_id = self.storage.get_trial_id_from_study_id_trial_number(self._study_id, number)
        return self.storage.get_trial(trial_id)

    def not_run(self) -> int:
        """Starting points never enqueued (a grid larger than ``--trials``)."""
        existing = {point_key(t.params) for t in self.study.get_trials(deepcopy=False)}
        return sum(point_key(s.params) not in existing for s in self.starts)

    # --- results --------------------------------------------------------------------------

    def report(self, key: str, result: Mapping[str, Any]) -> None:
        """An intermediate result (Tune's dict of a ``TrialReport``): the learning curve, at
        the trial's ``step``."""
        report, run = TrialReport.from_result(result, self.metric), self._open(key)
        if report is None or run is None:
            return
        run.last = report
        if report.step is None:
            return
        if math.isfinite(report.value):
            # A trial reaped while it ran (its driver looked dead) is finished: ignore the rest.
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                run.trial.report(report.value, report.step)

    def record_checkpoint(self, key: str, path: str) -> None:
        """Remember where the trial's last checkpoint is (a retry continues from it)."""
        run = self._open(key)
        if run is not None:
            step = None if run.last is None else run.last.step
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                run.trial.set_user_attr(CHECKPOINT, path)
                run.trial.set_user_attr(CHECKPOINT_STEP, step)
            if run.last is not None:
                run.saved = step

    def recovered(self, key: str, failure: RayFailure | None = None) -> str | None:
        """Ray restarts the trial in place after ``failure`` (Tune's ``on_trial_recover``;
        default: its worker died): counted (the user attr ``restarts`` when it is told); the
        line that says so."""
        run = self._open(key)
        if run is None:
            return None
        attempt = self._attempt(run)
        run.restarts += 1
        start = "scratch" if run.saved is None else f"step {run.saved}"
        return failure_line(run.trial.number, attempt, failure or RayFailure("died"),
                            f"Ray restarts it in place from {start}")

    def _attempt(self, run: Asked) -> int:
        """The run of this trial's point that is running now: every run of the failed trials
        it retries (each with Ray's restarts in place), then this trial's own."""
        earlier = sum(1 + int(self._frozen(n).user_attrs.get(RESTARTS) or 0)
                      for n in self._chain(run.trial.number))
        return earlier + 1 + run.restarts

    def complete(self, key: str, result: Mapping[str, Any] | None, error: bool = False,
                 failure: RayFailure | None = None) -> TrialRecord | None:
        """Tell the trial's final state (once; later completions are ignored) and count it.
        ``error``: Ray failed the trial (``failure`` says how; default: its worker died).

        Returns:
            What the study recorded when it told the trial (its state, value, status and
            measurements); None when nothing was told (an unknown or finished trial).
        """
        run = self._open(key)
        if run is None:
            return None
        trial = run.trial
        final = None if result is None else TrialReport.from_result(result, self.metric)
        last = run.last
        if final is not None and (last is None or final.step != last.step):
            self.report(key, result or {})  # Tune skips on_trial_result when a trial is stopped
        report = final or last
        if error:
            failure = failure or RayFailure("died")
        elif report is not None and report.status == TrialStatus.FAILED:
            disk = ray_failure(report.error)  # the trial's own report of a full results disk
            failure = disk if disk.kind == "disk" else None
        record = dataclasses.replace(self.classify(report, failure is not None, trial.number),
                                     restarts=run.restarts or None)
        attempt = self._attempt(run)
        chain = self._chain(trial.number) if failure else set()
        if failure is not None:
            record = self._failed(record, failure, chain | {trial.number})
        state, value = TrialState[record.state], record.value
        told = tell(self.study, trial, state, *self.outcome(run, record))  # retried whole
        run.told, run.last = True, None  # only once told, so that the guard's retry tells it again
        if not told:
            return None
        if failure is not None:
            run.death = self._retry(trial.number, chain, failure, attempt)
            if run.death.retry is not None or failure.kind == "disk":
                return record  # the retry is the trial that counts
        self.counts[state.name] += 1
        if value is not None and (self.best is None or
                                  self.direction.better(value, self.best.value)):
            self.best = self.best_of(value, run)
        return record

    def best_of(self, value: float, run: Asked) -> Best:
        """``run``'s trial as the best so far, at ``value``."""
        return Best(value, run.trial.number, run.arch)

    def outcome(self, run: Asked, record: TrialRecord
                ) -> tuple[float | Sequence[float] | None, Mapping[str, Any]]:
        """What Optuna is told of a finished trial: its value (a multi-objective study's:
        every objective), and the user attrs its record sets."""
        return record.value, record.told_attrs()

    def stop_for(self, failure: RayFailure) -> None:
        """Stop the search for ``failure`` (a full results disk): no trial starts any more."""
        self.halt = failure

    def _failed(self, record: TrialRecord, failure: RayFailure, chain: set[int]) -> TrialRecord:
        """``record`` of a trial Ray failed, with its status and error: what failed, what
        happens next."""
        step = self._checkpoint_step(chain)
        start = "scratch" if step is None else f"step {step}"
        if failure.kind == "disk":
            return dataclasses.replace(
                record, status=TrialStatus.DISK_FULL, error=f"{failure.describe()}; the search "
                f"stopped and --resume retries it from {start} (not counted against --trials)")
        then = (f"retried as a new trial from {start}" if len(chain) <= WORKER_RETRIES
                else "its retries are spent; --resume retries it")
        return dataclasses.replace(record, status=TrialStatus.RAY_FAILED,
                                   error=f"{failure.describe()}; {then}")

    def _checkpoint_step(self, numbers: set[int]) -> int | None:
        """The step of the last checkpoint among these trials: where a retry continues."""
        source = self._last_checkpointed(numbers)
        if source is None:
            return None
        attrs = source.user_attrs
        return attrs.get(CHECKPOINT_STEP, attrs.get(rec.STEPS_REACHED))

    def _retry(self, number: int, chain: set[int], failure: RayFailure, attempt: int) -> Death:
        """Retry trial ``number`` (Ray failed it) unless its ``chain`` had WORKER_RETRIES; a
        full disk stops the search instead, its trial re-enqueued for ``--resume``."""
        if failure.kind == "disk":
            self.halt = failure
            retry_failed(self.study, number)
            return Death(number, attempt, None, self._checkpoint_step(chain | {number}), failure)
        if len(chain) >= WORKER_RETRIES:
            return Death(number, attempt, None, None, failure)
        retry_failed(self.study, number)
        self.waiting += 1
        retry = next(t.number for t in self.study.get_trials(
            deepcopy=False, states=(TrialState.WAITING,)) if number in retry_history(t))
        return Death(number, attempt, retry, self._checkpoint_step(chain | {number}), failure)

    def classify(self, report: TrialReport | None, error: bool, number: int) -> TrialRecord:
        """What finished trial ``number`` records from its last report (``told_record``)."""
        return told_record(report, number, steps=self.steps, metric=self.metric, error=error)

    def best_so_far(self) -> Best | None:
        """The study's best fully trained trial, this run's or an earlier one's (a resumed
        search), or None."""
        done = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.value is not None and rec.ARCH in t.user_attrs]
        if not done:
            return None
        best = min(done, key=lambda t: self.direction.rank(t.value))  # type: ignore[arg-type]
        return Best(float(best.value), best.number,  # type: ignore[arg-type]  # first of equals
                    ArchConfig.from_json(best.user_attrs[rec.ARCH]))

    # --- liveness and cleanup -------------------------------------------------------------

    def _beat(self, number: int) -> None:
        if self.storage.get_heartbeat_interval() is not None:
            self.storage.record_heartbeat(
                self.storage.get_trial_id_from_study_id_trial_number(self._study_id, number))

    def beat(self) -> None:
        """Record a heartbeat for every trial this driver asked and has not told yet."""
        for run in self.asked.values():
            if not run.told:
                self._beat(run.trial.number)

    def abandon(self, status: TrialStatus) -> list[int]:
        """FAIL every trial still open (the search was interrupted) and re-enqueue its params.

        Returns:
            Numbers of the trials failed.
        """
        failed = []
        for run in self.asked.values():
            if run.told:
                continue
            run.told, trial = True, run.trial
            attrs = {rec.STATUS: str(status), rec.ERROR: f"the search was {status} while it "
                     "ran; re-enqueued (python -m workers.search --resume runs it again)"}
            if tell(self.study, trial, TrialState.FAIL, None, attrs):
                retry_failed(self.study, trial.number)
                failed.append(trial.number)
        return failed


def not_trained(trial: FrozenTrial) -> bool:
    """Recorded but never trained: a duplicate proposal or an orphan."""
    return TrialStatus.read(trial.user_attrs.get(rec.STATUS)) in rec.NOT_TRAINED


def retry_history(trial: FrozenTrial) -> list[int]:
    """The failed trials ``trial`` retries, oldest first (Optuna's retry markers)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return RetryHeartbeatStaleTrialCallback.retry_history(trial)


def retried_numbers(trials: list[FrozenTrial]) -> set[int]:
    """Numbers of failed trials that have a retry copy (they do not count as finished): every
    trial in some trial's retry history, so each link of a chain of retries is counted."""
    return {n for t in trials for n in retry_history(t)}


def requeue_ray_failures(study: optuna.Study) -> list[int]:
    """Retry (``--resume``) every trial that failed for the machine, not for its point (Ray
    failed it, or the results disk was full) and has no retry yet: the retry, not it, counts
    against ``--trials``. Returns their numbers."""
    trials = study.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    failed = [t.number for t in trials if t.state == TrialState.FAIL and t.number not in retried
              and TrialStatus.read(t.user_attrs.get(rec.STATUS)) in rec.MACHINE_FAILURES]
    for number in failed:
        retry_failed(study, number)
    return failed


def finished_count(study: optuna.Study) -> int:
    """Trials that count against ``--trials``: COMPLETE, PRUNED, and FAIL without a retry, that
    this study trained (``not_trained``: not a duplicate or orphan; not copied by a warm start)."""
    trials = study.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    done = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    return sum(t.state in done and t.number not in retried and not not_trained(t)
               and WARM_START_FROM not in t.user_attrs for t in trials)
