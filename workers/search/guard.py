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
from collections.abc import Callable
from typing import Any

from optuna.trial import TrialState

from studies.errors import LeaseLostError, StorageFaultError
from studies.faults import PATIENCE_S, guarded
from studies.lease import Lease
from studies.storage import fail_marked
from studies.urls import redact
from workers.search.searcher import ORPHAN, StudySearcher

log = logging.getLogger(__name__)


class GuardedSearcher:
    """``StudySearcher`` with every method call guarded against storage faults (same
    attributes; a method returns None once the storage has failed)."""

    def __init__(self, inner: StudySearcher, url: str, lease: Lease | None = None,
                 patience: float = PATIENCE_S) -> None:
        self.inner, self.url, self.lease, self.patience = inner, url, lease, patience
        self.fault: StorageFaultError | None = None

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.call(lambda: value(*args, **kwargs))
        return call

    def call(self, action: Callable[[], Any]) -> Any:
        """``action()`` under the guard; None once the storage has failed."""
        if self.fault is not None:
            return None
        try:
            return guarded(action, self.url, self.patience, before_retry=self.fail_orphans)
        except StorageFaultError as fault:
            self.fault = fault
            log.debug("storage fault: %s", fault)
            return None

    def suggest(self, key: str, total: int) -> Any:
        """The searcher's next trial for Tune, and the end of the search once the storage has
        failed (Tune consults its stopper only when a trial reports: with none running, it
        would ask for a trial forever)."""
        config = self.call(lambda: self.inner.suggest(key, total))
        return "end" if self.fault is not None else config

    def fail_orphans(self) -> list[int]:
        """FAIL the RUNNING trials this driver asked but never handed out: an ask whose
        connection dropped after Optuna created the trial, then asked again. With the lease no
        other driver runs trials of this study, so they are orphans: recorded as not trained
        (status ``orphan``, not counted against ``--trials``)."""
        inner = self.inner
        handed_out = {trial.number for trial in inner.trials.values()}
        orphans = [t.number for t in inner.study.get_trials(
            deepcopy=False, states=(TrialState.RUNNING,)) if t.number not in handed_out]
        for number in orphans:
            fail_marked(inner.storage, inner.study, number, ORPHAN,
                        "asked as the database connection dropped, then asked again; not run")
        return orphans

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
