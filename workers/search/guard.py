"""A search whose storage fails stops cleanly: every call the Tune side makes on the study goes
through ``GuardedSearcher``.

Tune calls the searcher from its event loop (ask a trial, record a result, tell a finished one)
and the monitor calls it at every heartbeat. A failing database there used to end the search in
a 100-line traceback with trials left RUNNING. Under the guard, each call is retried while its
fault may pass (``studies.faults.guarded``: a lost connection, for ``PATIENCE_S``); a fault
that persists is kept in ``fault``, every later call returns None without touching the
database, and ``should_stop`` tells Tune to stop the run (``workers.search.tune`` stops on it).
The driver then tries once to mark the open trials interrupted and raises the fault as one line.
If the database cannot take that either, the trials stay RUNNING with lapsing heartbeats, which
``--resume`` fails, marks and retries from their checkpoints (``studies.storage.reap_trials``).

The heartbeat also renews the driver's lease on the study (``studies.lease``): a lease another
driver took over (this one looked dead) stops the run the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol, TypeVar

from optuna.trial import Trial, TrialState

from studies import (
    PATIENCE_S,
    Lease,
    LeaseLostError,
    StorageFaultError,
    fail_marked,
    guarded,
    redact,
    retry_failed,
)
from studies.trials import Direction, TrialRecord, TrialStatus
from workers.search.failures import Death, RayFailure
from workers.search.protocol import TrialSpec
from workers.search.searcher import Best, StudySearcher, retry_history

log = logging.getLogger(__name__)
T = TypeVar("T")
Suggestion = dict[str, TrialSpec] | Literal["wait", "end"]


class TuneSearcher(Protocol):
    """What the Tune side (``workers.search.tune``) calls: a ``StudySearcher``, or the guard
    over one."""

    @property
    def metric(self) -> str: ...
    @property
    def direction(self) -> Direction: ...
    @property
    def trials(self) -> Mapping[str, Trial]: ...  # every trial asked, by Tune's id
    @property
    def done(self) -> set[str]: ...  # the trials told
    @property
    def deaths(self) -> Mapping[str, Death]: ...
    @property
    def counts(self) -> Mapping[str, int]: ...
    @property
    def best(self) -> Best | None: ...

    def suggest(self, key: str, total: int) -> Suggestion: ...
    def report(self, key: str, result: Mapping[str, Any]) -> None: ...
    def record_checkpoint(self, key: str, path: str) -> None: ...
    def recovered(self, key: str, failure: RayFailure | None = None) -> str | None: ...
    def complete(self, key: str, result: Mapping[str, Any] | None, error: bool = False,
                 failure: RayFailure | None = None) -> TrialRecord | None: ...
    def beat(self) -> None: ...
    def stop_for(self, failure: RayFailure) -> None: ...


class GuardedSearcher:
    """``StudySearcher`` with every call that reaches the study guarded against storage faults
    (each returns None once the storage has failed); what it holds in memory is read as is."""

    def __init__(self, inner: StudySearcher, url: str, lease: Lease | None = None,
                 patience: float = PATIENCE_S) -> None:
        self.inner, self.url, self.lease, self.patience = inner, url, lease, patience
        self.fault: StorageFaultError | None = None

    def call(self, action: Callable[[], T]) -> T | None:
        """``action()`` under the guard; None once the storage has failed."""
        if self.fault is not None:
            return None
        try:
            return guarded(action, self.url, self.patience, before_retry=self.fail_orphans)
        except StorageFaultError as fault:
            self.fault = fault
            log.debug("storage fault: %s", fault)
            return None

    # --- the searcher's memory: no storage behind it ---------------------------------------

    @property
    def metric(self) -> str:
        return self.inner.metric

    @property
    def direction(self) -> Direction:
        return self.inner.direction

    @property
    def trials(self) -> Mapping[str, Trial]:
        return self.inner.trials

    @property
    def done(self) -> set[str]:
        return self.inner.done

    @property
    def deaths(self) -> Mapping[str, Death]:
        return self.inner.deaths

    @property
    def counts(self) -> Mapping[str, int]:
        return self.inner.counts

    @property
    def best(self) -> Best | None:
        return self.inner.best

    # --- calls that reach the study ---------------------------------------------------------

    def suggest(self, key: str, total: int) -> Suggestion:
        """The searcher's next trial for Tune, and the end of the search once the storage has
        failed (Tune consults its stopper only when a trial reports: with none running, it
        would ask for a trial forever)."""
        config = self.call(lambda: self.inner.suggest(key, total))
        return "end" if self.fault is not None or config is None else config

    def ask(self, key: str) -> dict[str, TrialSpec] | None:
        return self.call(lambda: self.inner.ask(key))

    def report(self, key: str, result: Mapping[str, Any]) -> None:
        self.call(lambda: self.inner.report(key, result))

    def record_checkpoint(self, key: str, path: str) -> None:
        self.call(lambda: self.inner.record_checkpoint(key, path))

    def recovered(self, key: str, failure: RayFailure | None = None) -> str | None:
        return self.call(lambda: self.inner.recovered(key, failure))

    def complete(self, key: str, result: Mapping[str, Any] | None, error: bool = False,
                 failure: RayFailure | None = None) -> TrialRecord | None:
        return self.call(lambda: self.inner.complete(key, result, error, failure))

    def stop_for(self, failure: RayFailure) -> None:
        self.call(lambda: self.inner.stop_for(failure))

    def abandon(self, status: TrialStatus) -> list[int] | None:
        """The searcher's ``abandon``; None once the storage has failed."""
        return self.call(lambda: self.inner.abandon(status))

    def fail_orphans(self) -> list[int]:
        """FAIL the RUNNING trials this driver asked but never handed out: an ask whose
        connection dropped after Optuna created the trial, then asked again. With the lease no
        other driver runs trials of this study, so they are orphans: recorded as not trained
        (status ``orphan``, not counted against ``--trials``). An orphan that was a dead
        worker's retry is enqueued again, so the retry still runs, from the same checkpoint."""
        inner = self.inner
        handed_out = {trial.number for trial in inner.trials.values()}
        orphans = [t for t in inner.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                   if t.number not in handed_out]
        for trial in orphans:
            fail_marked(inner.storage, inner.study, trial.number, TrialStatus.ORPHAN,
                        "asked as the database connection dropped, then asked again; not run")
            if retry_history(trial):
                retry_failed(inner.study, trial.number)
        return [t.number for t in orphans]

    def beat(self) -> None:
        """The trials' heartbeats, and the lease's."""
        self.call(self.inner.beat)
        lease = self.lease
        if lease is None or self.fault is not None:
            return
        if not self.call(lease.renew) and self.fault is None:  # renewed: the lease was gone
            self.fault = LeaseLostError(
                f"study {self.inner.study.study_name!r} in {redact(self.url)}: another driver "
                "took over its lease (this one looked dead: no heartbeat for "
                f"{lease.ttl:.0f} s); this driver stopped, the other one runs it")

    def should_stop(self) -> bool:
        """Whether the run must stop: the storage failed, the lease was lost, or a trial found
        the results disk full."""
        return self.fault is not None or self.inner.halt is not None
