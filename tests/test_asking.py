"""Asking for a trial whose point no other trial has trained or is training: a proposal of
such a point is recorded as a duplicate and asked again, an untried point after
``MAX_REDRAWS`` of them; a failed trial's point may be asked again (its retry)."""

from __future__ import annotations

import random

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from studies.trials import TrialStatus
from workers.search.asking import MAX_REDRAWS, ask_new

X = {"x": CategoricalDistribution([1, 2, 3])}


def _ask(study: optuna.Study) -> optuna.Trial:
    """``ask_new`` with a sampler that always proposes x = 1, and x = 3 the untried point."""

    def propose_one() -> tuple[optuna.Trial, None]:
        study.enqueue_trial({"x": 1})
        return study.ask(X), None

    trial, _ = ask_new(study, propose_one, lambda: [{"x": 3}], random.Random(0))
    return trial


@pytest.mark.parametrize("state", [TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING])
def test_a_point_trained_or_training_is_not_asked_twice(state: TrialState) -> None:
    study = optuna.create_study()
    study.enqueue_trial({"x": 1})
    first = study.ask(X)
    if state != TrialState.RUNNING:  # RUNNING: asked, not told (a retry in flight)
        study.tell(first, 0.5 if state == TrialState.COMPLETE else None, state=state)
    trial = _ask(study)
    assert trial.params == {"x": 3}  # the untried point, once the redraws are spent
    duplicates = [t for t in study.trials
                  if t.user_attrs.get("status") == str(TrialStatus.DUPLICATE)]
    assert [t.user_attrs["duplicate_of"] for t in duplicates] == [0] * MAX_REDRAWS
    assert all(t.state == TrialState.FAIL for t in duplicates)


def test_a_failed_point_may_be_asked_again() -> None:
    study = optuna.create_study()
    study.enqueue_trial({"x": 1})
    study.tell(study.ask(X), None, state=TrialState.FAIL)
    trial = _ask(study)
    assert trial.params == {"x": 1} and trial.number == 1
