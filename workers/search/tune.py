"""Ray and Ray Tune, in one module: the only place the project imports Ray.

``run_tuner`` runs a search's remaining trials with Tune's ``Tuner`` (a function trainable,
ASHA or FIFO, one report per evaluation with a checkpoint through Tune's public checkpoint
API) while ``workers.search.searcher.StudySearcher`` asks and tells the Optuna study (a trial
whose worker dies is restarted in place once by Ray, then retried by the searcher as a new
trial; the monitor says so in one line per death, Tune's tracebacks dropped); ``start`` /
``session`` manage the Ray instance (local by default, ``address`` for a cluster). Everything
else of the search (the study, seeds, the summary) lives in ``workers.search``, Ray-free.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.search import Searcher

from common.progress import Progress, duration
from studies.trials import RESUMED, Direction, TrialStatus
from workers.search import estimate
from workers.search.failures import RayFailure, disk_full, ray_failure
from workers.search.guard import TuneSearcher
from workers.search.options import SearchOptions
from workers.search.protocol import (
    JOB_KEY,
    STEP,
    TRIAL_KEY,
    StudentJob,
    TrialJob,
    TrialReport,
)
from workers.search.schedule import Halving, Rungs
from workers.search.searcher import WORKER_RETRIES
from workers.search.student_trial import student_trial
from workers.search.trial import train_trial

log = logging.getLogger(__name__)


class _DropRecords(logging.Filter):
    """Drops a logger's records whose message contains one of ``texts``."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in self.texts)


def _drop(logger: str, text: str) -> None:
    """Drop ``logger``'s records containing ``text`` (one filter per logger, idempotent)."""
    target = logging.getLogger(logger)
    found = [f for f in target.filters if isinstance(f, _DropRecords)]
    if not found:
        found = [_DropRecords()]
        target.addFilter(found[0])
    found[0].texts.add(text)


def quiet_ray_advice() -> None:
    """Silence what Ray says that a search must not follow or need not read (idempotent)."""
    # After a Ctrl-C, Tune logs "Resume experiment with: Tuner.restore(...)" through its
    # module's logger (ray.tune.tune), at WARNING, with no verbosity setting that gates it: a
    # search resumes from its study (--resume, which the driver says), never from Ray's state.
    # The filter drops that record and keeps the logger's others.
    _drop("ray.tune.tune", ".restore(")
    # Ray 2.60 turns token authentication on for a new local instance and says so at every
    # start ("Token authentication is enabled ... Set RAY_AUTH_MODE=disabled to opt out").
    # The documented way to choose the mode, RAY_AUTH_MODE=token, is read once, when ray is
    # imported: set here it leaves this process "disabled" while the processes it starts
    # are "token", and the GCS refuses the driver (measured); "disabled" would silence it
    # too, by opening the instance to anyone on the network. So the mode stays Ray's secure
    # default, and a filter on the logger of Ray's token setup drops only this notice.
    _drop("ray._private.authentication.authentication_token_setup",
          "Token authentication is enabled")
    # After a Ctrl-C, Tune's result analysis warns that a trial which had not reported yet has
    # no metrics: the study is the record (our line says which trials are retried), and the
    # analysis is never read.
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    # A trial's worker that dies: Tune logs the actor's traceback at each failure and, at the
    # end of fit(), "Trials did not complete" for a trial it failed. The monitor says it in one
    # line per death (restarted in place, or retried by the study as a new trial), and the
    # traceback stays in the trial's error.txt.
    _drop("ray.tune.execution.tune_controller", "Trial task failed for trial")
    _drop("ray.tune.tune", "Trials did not complete")
    # A reused worker whose reset failed: the monitor tells it (``_tell_untold``)
    _drop("ray.tune.execution.tune_controller", "Could not re-use actor for trial")
    # A full results disk: the search stops and says so in one line; Ray's traceback of the
    # experiment state it could not save goes (a search resumes from its study, not from it).
    _drop("ray.tune.execution.experiment_state", "Saving experiment state to storage")
    # A failed trial reports the worst metric, inf: Tune's TensorBoard logger warns of it; and
    # on a busy machine Tune times its own loop ("The `on_step_begin` operation took 1.763 s,
    # which may be a performance bottleneck"): neither is the user's to act on
    logging.getLogger("tensorboardX.x2num").setLevel(logging.ERROR)
    _drop("ray.tune.utils.util", "may be a performance bottleneck")


def start(address: str | None = None) -> None:
    """Start (or join, with ``address``) Ray unless this process already did."""
    # Keeping one checkpoint per trial makes Tune snapshot its experiment state at every
    # checkpoint (to delete the previous one safely) and warn about it each time: cheap next
    # to a trial, so the warning goes.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # our progress lines replace Ray's boxes
    quiet_ray_advice()
    if ray.is_initialized():  # called from Python (benchmarks, notebooks) after ray.init
        return
    ray.init(address=address, include_dashboard=False if address is None else None,
             log_to_driver=False, logging_level=logging.WARNING,
             runtime_env={"env_vars": worker_env()})


# Before a reused worker takes its next trial, Tune ends the last trial's training thread and
# waits for it this many seconds (its default, 2), then fails the next trial ("Trainable runner
# reuse requires reset_config() to be implemented and return True"). The thread's exit frees the
# model and collects garbage: on a loaded machine that took longer than 2 s, and trials failed
# with nothing wrong. A thread that is stuck still fails the reuse, after this long.
THREAD_TIMEOUT_S = "60"


def worker_env() -> dict[str, str]:
    """What every worker of the search gets in its environment, a cluster's too (a local
    instance's workers inherit the rest of this process's)."""
    return {"TUNE_FUNCTION_THREAD_TIMEOUT_S": os.environ.get("TUNE_FUNCTION_THREAD_TIMEOUT_S",
                                                             THREAD_TIMEOUT_S)}


@contextlib.contextmanager
def session(address: str | None = None) -> Iterator[None]:
    """Ray for the duration of a block (several searches share it), shut down after."""
    started = not ray.is_initialized()
    start(address)
    try:
        yield
    finally:
        if started and ray.is_initialized():
            ray.shutdown()


@dataclass(frozen=True)
class TuneRun:
    """How Tune runs a search's trials: the search's ``options`` (their one set of defaults),
    and what this run adds to them."""

    name: str  # the experiment's folder under ``options.storage_path``
    trials: int  # trials to run now
    steps: int  # the scheduler's full budget
    eval_every: int
    options: SearchOptions
    concurrent: int = 1  # trials that run at once (what the resources allow, at most max)


def run_tuner(searcher: TuneSearcher, job: TrialJob | StudentJob, run: TuneRun,
              stop: Callable[[], bool] | None = None) -> TrialStatus:
    """Run ``run.trials`` trials; returns ``COMPLETED``, ``INTERRUPTED`` (Ctrl-C) or
    ``STOPPED`` (a full results disk). ``stop``: checked at every step, True stops every trial
    (e.g. the storage failed).

    Ray restarts a trial whose worker died once in place (``max_failures=1``); if that fails
    too, the searcher retries it as a new Tune trial (``WORKER_RETRIES``): Tune may run that
    many more trials, and the searcher's ``suggest`` decides when the search ends.
    """
    opts = run.options
    scheduler = (_Halving(Halving(Rungs.for_training(run.steps, run.eval_every),
                                  maximize=searcher.direction is Direction.MAXIMIZE),
                          searcher.metric)
                 if opts.scheduler == "asha" else FIFOScheduler())
    monitor = _Monitor(searcher, run, Progress("search", total=run.trials, unit="trials",
                                               quiet=opts.quiet))
    tuner = tune.Tuner(
        tune.with_resources(_trainable, {"cpu": opts.cpus_per_trial,
                                         "gpu": opts.gpus_per_trial}),
        param_space={JOB_KEY: job},
        tune_config=tune.TuneConfig(search_alg=_Adapter(searcher, run.trials,
                                                        opts.max_concurrent),
                                    scheduler=scheduler,
                                    num_samples=run.trials * (1 + WORKER_RETRIES),
                                    reuse_actors=opts.reuse_actors,
                                    trial_dirname_creator=lambda trial: f"trial_{trial.trial_id}"),
        run_config=tune.RunConfig(
            name=run.name, storage_path=str(opts.storage_path.resolve()), verbose=0,
            callbacks=[monitor], stop=None if stop is None else _StopWhen(stop),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            failure_config=tune.FailureConfig(max_failures=1)))
    try:
        with _handlers_kept():
            tuner.fit()  # its ResultGrid is not read: the study is the record, failed trials too
    except KeyboardInterrupt:  # a second Ctrl-C; the first one Tune handles itself, stopping
        monitor.bar.abandon()  # the run and returning, and the searcher's abandon() finds
        return TrialStatus.INTERRUPTED  # the trials it left open (workers.search reports that)
    except Exception as err:  # Tune's own writes (experiment state, error files) on a full disk
        if not disk_full(err):
            raise
        searcher.stop_for(RayFailure("disk", "No space left on device"))
        monitor.bar.abandon()
        return TrialStatus.STOPPED
    monitor.bar.close("done" if monitor.finished >= run.trials else "stopped")
    return TrialStatus.COMPLETED


@contextlib.contextmanager
def _handlers_kept() -> Iterator[None]:
    """Tune catches SIGINT (and SIGUSR1) to end its run and leaves its handler installed after
    the run: the first Ctrl-C in whatever the process does next (the next search of an
    experiment, a benchmark's replays) would only print Tune's warning. The process's own
    handlers come back when the run ends."""
    if threading.current_thread() is not threading.main_thread():
        yield  # Tune installs nothing off the main thread
        return
    names = [signal.SIGINT, *([signal.SIGUSR1] if hasattr(signal, "SIGUSR1") else [])]
    kept = {sig: signal.getsignal(sig) for sig in names}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            if handler is not None:  # None: installed from outside Python, cannot be set back
                signal.signal(sig, handler)


class _Halving(FIFOScheduler):
    """Tune's scheduler over ``workers.search.schedule.Halving`` (public ``TrialScheduler``
    API): FIFO's placement, successive halving's stops at the search's milestones."""

    def __init__(self, halving: Halving, metric: str) -> None:
        super().__init__()
        self.halving, self.score = halving, metric

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        if STEP not in result or self.score not in result:  # Tune's own results
            return TrialScheduler.CONTINUE
        keep = self.halving.judge(trial.trial_id, int(result[STEP]), float(result[self.score]))
        return TrialScheduler.CONTINUE if keep else TrialScheduler.STOP


PROGRESS_EVERY_S = 60.0  # a progress line between finished trials, when not on a terminal


def capacity(cpus_per_trial: float, gpus_per_trial: float) -> int:
    """Trials Ray can run at once on its instance (a cluster's CPUs and GPUs)."""
    resources = ray.cluster_resources()
    count = int(resources.get("CPU", 1) // cpus_per_trial) if cpus_per_trial else 10**6
    if gpus_per_trial > 0:
        count = min(count, int(resources.get("GPU", 0) // gpus_per_trial))
    return max(1, count)


class _StopWhen(tune.Stopper):
    """Stops the whole run once ``predicate()`` is True (Tune's public ``Stopper`` API)."""

    def __init__(self, predicate: Callable[[], bool]) -> None:
        self.predicate: Callable[[], bool] | None = predicate

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return self.stop_all()

    def stop_all(self) -> bool:
        return self.predicate is not None and self.predicate()

    def __getstate__(self) -> dict[str, Any]:
        return {"predicate": None}  # Tune pickles its stopper: no study or URL in it


def _trainable(config: dict[str, Any]) -> None:
    """The function trainable: ``workers.search.trial.train_trial`` (a student search's:
    ``workers.search.student_trial.student_trial``) with Tune's report and checkpoint."""
    node = ray.get_runtime_context().get_node_id()
    job: TrialJob | StudentJob = config[JOB_KEY]
    trial = student_trial if isinstance(job, StudentJob) else train_trial

    def report(result: TrialReport, checkpoint: Path | None) -> None:
        tune.report(result.to_result(job.metric), checkpoint=None if checkpoint is None
                    else tune.Checkpoint.from_directory(str(checkpoint)))

    restored = tune.get_checkpoint()  # set when Tune restarts this trial after a failure
    with tempfile.TemporaryDirectory(prefix="trial-") as workdir, \
            (restored.as_directory() if restored else contextlib.nullcontext()) as restore:
        trial(job, config[TRIAL_KEY], report, Path(workdir), node,  # type: ignore[arg-type]
              Path(restore) if restore else None)


class _Adapter(Searcher):
    """Tune's searcher interface over ``StudySearcher`` (public ``Searcher`` API only).

    Tune pickles its searcher into the experiment state: the pickle holds no study, storage or
    URL. Resuming goes through the study (``workers.search --resume``), never Tune's state.
    """

    def __init__(self, inner: TuneSearcher, total: int, max_concurrent: int | None = None
                 ) -> None:
        super().__init__(metric=inner.metric, mode=inner.direction.mode)
        self.inner: TuneSearcher | None = inner
        self.total = total  # trials to finish in this run
        # the concurrency limit is ours, not Tune's ConcurrencyLimiter: a trial Tune ends
        # without telling its search algorithm (``_Monitor._tell_untold``) would hold one of
        # the limiter's places forever
        self.max_concurrent = max_concurrent

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict[str, Any],
                              **spec: Any) -> bool:
        return True  # metric and mode come from the study

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        assert self.inner is not None
        running = len(self.inner.trials) - len(self.inner.done)
        if self.max_concurrent is not None and running >= self.max_concurrent:
            return None  # Tune asks again later
        config = self.inner.suggest(trial_id, self.total)
        if config == "end":  # Tune's documented end-of-search value,
            return Searcher.FINISHED  # type: ignore[return-value]  # a str its stub omits
        return None if config == "wait" else config  # None: Tune asks again later

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        if self.inner is not None:
            self.inner.report(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None,
                          error: bool = False) -> None:
        # A trial Ray failed is told by the monitor's on_trial_error, which Tune calls next
        # with the trial, whose recorded error names the failure (``ray_failure``).
        if self.inner is not None and not error:
            self.inner.complete(trial_id, result)

    def save(self, checkpoint_path: str) -> None:
        pass  # the study is the record

    def restore(self, checkpoint_path: str) -> None:
        raise RuntimeError("resume a search with `python -m workers.search ... --resume`: the "
                           "study database, not Ray's experiment state, is the record")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "inner": None}


def _error_text(trial: Any) -> str | None:
    """The error Tune recorded for ``trial`` (its ``error.txt``), or None."""
    path = getattr(trial, "error_file", None)
    if not path:
        return None
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


class _Monitor(tune.Callback):
    """Heartbeats for the open trials, the checkpoint of each trial recorded in the study, and
    the search's progress: trials finished / running / total, the best so far and, once a
    trial has finished, the time left (a bar on a terminal, else one line per finished
    trial). The counts by state and the best are the searcher's, which classified each trial
    when it told the study (Tune tells the searcher before its callbacks)."""

    def __init__(self, searcher: TuneSearcher, run: TuneRun, bar: Progress) -> None:
        self.searcher, self.total, self.bar = searcher, run.trials, bar
        self.interval = run.options.heartbeat_interval / 2
        self.finished = 0  # trials finished in this run (not one failed and retried)
        self.last_beat = 0.0
        self.work = estimate.Work(run.steps, run.trials)
        self.concurrent, self.name = run.concurrent, run.name.rsplit("-", 2)[0]
        self.announced = False  # the estimate from the first trials' steps was said
        self.last_line = time.monotonic()  # the last progress line (not on a terminal)

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        self._tell_untold(iteration, trials)
        if time.monotonic() - self.last_beat >= self.interval:
            self.searcher.beat()
            self.last_beat = time.monotonic()
            self.bar.refresh()  # a terminal's bar shows the time passing between trials

    def _tell_untold(self, iteration: int, trials: list[Any]) -> None:
        """Tell the searcher of each trial Ray ended in error without telling it: Ray errors a
        trial whose reused worker failed ``reset_config`` (the last trial's thread still alive
        after ``TUNE_FUNCTION_THREAD_TIMEOUT_S``) but calls no searcher or callback, and a
        search waiting for that trial never ends."""
        searcher = self.searcher
        for trial in trials:
            key = trial.trial_id
            if trial.status == "ERROR" and key in searcher.trials and key not in searcher.done:
                self.on_trial_error(iteration, trials, trial)

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.work.start(time.monotonic())

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any,
                        result: dict[str, Any], **info: Any) -> None:
        """Progress in steps; an evaluation a retry reports again (at or before the step it
        continues from) trains nothing."""
        step, resumed = result.get(STEP), int(result.get(RESUMED) or 0)
        if step is None or (resumed and step <= resumed):
            return
        now = time.monotonic()
        self.work.report(trial.trial_id, int(step), resumed, now)
        if not self.announced:
            said = estimate.measured(self.work, self.concurrent)
            if said is not None:
                self.announced = True
                self.bar.write(f"search {self.name}: {said}")
        if not self.bar.tty and now - self.last_line >= PROGRESS_EVERY_S:
            self.last_line = now
            left = self.work.left(now)
            self.bar.write(f"search: training at steps {self.work.running()}"
                           + ("" if left is None else f"; ~{duration(left)} left"))
        elif self.bar.tty:
            self.bar.event(self._describe(len(self.work.at)), eta=self.work.left(now),
                           steps=self.work.running())

    def on_checkpoint(self, iteration: int, trials: list[Any], trial: Any, checkpoint: Any,
                      **info: Any) -> None:
        self.searcher.record_checkpoint(trial.trial_id, str(checkpoint.path))

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any,
                          **info: Any) -> None:
        death = self.searcher.deaths.get(trial.trial_id)  # a full disk the trial reported
        if death is not None:
            self.bar.write(death.describe())
            self.work.finish(trial.trial_id, counted=False)
            return
        self._finished(trials, trial)

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any,
                         **info: Any) -> None:
        line = self.searcher.recovered(trial.trial_id, ray_failure(_error_text(trial)))
        if line is not None:
            self.bar.write(line)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.searcher.complete(trial.trial_id, None, error=True,
                               failure=ray_failure(_error_text(trial)))
        death = self.searcher.deaths.get(trial.trial_id)
        if death is not None:
            self.bar.write(death.describe())
        if death is not None and (death.retry is not None or death.failure.kind == "disk"):
            self.work.finish(trial.trial_id, counted=False)  # its retry is the one that counts
            return
        self._finished(trials, trial)

    def _finished(self, trials: list[Any], trial: Any) -> None:
        self.finished += 1
        self.work.finish(trial.trial_id)
        running = [t for t in trials if t.status == "RUNNING" and t is not trial]
        self.bar.update(1)
        self.bar.event(self._describe(len(running)), eta=self.work.left(time.monotonic()))

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its callbacks into the experiment state: like the adapter's, that pickle
        # holds no study, storage or URL, and no stream or bar of this process.
        return {**self.__dict__, "searcher": None, "bar": None}

    def _describe(self, running: int) -> str:
        """The counts and the best so far; on a terminal's one-line bar, the best first and
        without its architecture."""
        counts, top = self.searcher.counts, self.searcher.best
        stopped, failed = counts["PRUNED"], counts["FAIL"]
        best = "no full-budget trial yet"
        if top is not None:
            best = f"best {self.searcher.metric} {top.value:.4g} (trial {top.number}"
            best += ")" if self.bar.tty else f": {top.describe()})"
        if self.bar.tty:
            return f"{best}, {running} running, {stopped} stopped early, {failed} failed"
        return (f"{counts['COMPLETE']} complete, {stopped} stopped early, {failed} failed, "
                f"{running} running; {best}")

# The names ``workers.search`` exports them by (a block's Ray, the process's).
ray_session = session
start_ray = start
