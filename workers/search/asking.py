"""Asking the study for a trial that no other trial trains or has trained (``ask_new``): a
proposal of such a point is recorded as a duplicate (``skip_duplicate``: not trained, not
counted) and the sampler is asked again; after ``MAX_REDRAWS`` of them an untried point is
enqueued. ``tell`` finishes a trial once. No Ray here."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from alloc import point_key
from studies import records as rec
from studies.trials import TrialStatus

log = logging.getLogger(__name__)
Sampled = TypeVar("Sampled")
MAX_REDRAWS = 3  # proposals of finished points in a row before an untried point is enqueued


def ask_new(study: optuna.Study, ask: Callable[[], tuple[Trial, Sampled]],
            untried: Callable[[], list[dict[str, Any]] | None], rng: random.Random
            ) -> tuple[Trial, Sampled]:
    """A trial (and what ``ask`` sampled for it) whose point no other trial has finished or is
    training: proposals of such points are recorded as duplicates and
    re-asked; after ``MAX_REDRAWS`` of them a
    point of ``untried()`` is enqueued at random (None: a space too large to list, where the
    last proposal stands)."""
    for _ in range(MAX_REDRAWS):
        trial, sampled = ask()
        twin = twin_of(study, trial)
        if twin is None:
            return trial, sampled
        skip_duplicate(study, trial, twin)
    points = untried()
    if not points:
        return ask()
    study.enqueue_trial(rng.choice(points), user_attrs={rec.SEED: "untried"})
    return ask()


# A RUNNING twin counts too: a resumed search runs its interrupted trials' retries beside new
# proposals, and a proposal of a point a retry was training got trained twice (seen after two
# interrupts in a row). RUNNING trials are this driver's: the study's lease admits one driver,
# and a dead one's are marked failed when the next takes over. (A WAITING trial is never a
# twin: Optuna's ask hands out waiting trials before it samples.)
TWIN_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)


def twin_of(study: optuna.Study, trial: Trial) -> FrozenTrial | None:
    """The first other trial with exactly ``trial``'s params that finished or is training, if
    any."""
    key = point_key(trial.params)
    return next((t for t in study.get_trials(deepcopy=False, states=TWIN_STATES)
                 if t.number != trial.number and point_key(t.params) == key), None)


def skip_duplicate(study: optuna.Study, trial: Trial, twin: FrozenTrial) -> None:
    """Record ``trial`` (the same point as ``twin``) as not trained."""
    tell(study, trial, TrialState.FAIL, None, {
        rec.STATUS: str(TrialStatus.DUPLICATE), rec.DUPLICATE_OF: twin.number,
        rec.ERROR: f"the same point as trial {twin.number}: not trained, the sampler asked again"})


def tell(study: optuna.Study, trial: Trial, state: TrialState,
         value: float | Sequence[float] | None, attrs: Mapping[str, Any]) -> bool:
    """Set ``attrs`` and finish ``trial``; False (logged) if it had already finished."""
    try:
        for key, val in attrs.items():
            if val is not None:
                trial.set_user_attr(key, val)
        study.tell(trial, value, state=state)
    except optuna.exceptions.UpdateFinishedTrialError:
        log.warning("trial %d had already finished; its second completion is ignored",
                    trial.number)
        return False
    return True
