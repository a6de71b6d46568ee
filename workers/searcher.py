"""``OptunaSearch`` made safe for a study in a SQL database (SPEC §6, §7).

Stock Ray 2.60 ``OptunaSearch`` + Optuna 5 lose or corrupt trials in four ways this class closes:

* ASHA-stopped trials were told COMPLETE with their partial value: here a trial is COMPLETE only if
  its last result reached the full ``steps``; otherwise it is PRUNED with ``steps_reached``.
* A trial that raised or produced NaN was told with a warning at best: here it is FAIL with the
  error in the user attr ``error``.
* Optuna heartbeats cover ``study.optimize`` only: the driver records a heartbeat for every trial it
  has asked (``beat``), so ``optuna.storages.fail_stale_trials`` (``studies.storage.reap_stale``)
  can fail and retry the trials of a driver that died.
* The searcher is pickled into Ray's ``tuner.pkl`` and searcher checkpoints: here the pickled state
  holds no storage and no study (the URL is password-free anyway, see ``workers.search``).

Telling an already finished trial (a resumed or duplicated completion) is logged and skipped
instead of raising ``UpdateFinishedTrialError``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import optuna
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.storages._heartbeat import is_heartbeat_enabled
from optuna.trial import FrozenTrial, Trial, TrialState
from ray.tune.search.optuna import OptunaSearch

from search_spaces import ModelIO, SearchSpace
from studies import records as rec
from studies.storage import retry_failed
from workers.trial import ERROR, NODE, STATUS, STEP

log = logging.getLogger(__name__)
Predictor = Callable[[Any], float | None]


class StudySearcher(OptunaSearch):
    """Samples ``space`` define-by-run and records every trial in the study as SPEC §6 says."""

    def __init__(self, space: SearchSpace, *, io: ModelIO, study: optuna.Study, metric: str,
                 mode: str, steps: int, predict: Predictor,
                 sampler: optuna.samplers.BaseSampler) -> None:
        self.search_space, self.io, self.steps, self.predict = space, io, steps, predict
        self.study = study
        self.last: dict[str, dict[str, Any]] = {}
        super().__init__(space=self._define, metric=metric, mode=mode, sampler=sampler,
                         study_name=study.study_name, storage=study._storage)

    # --- sampling ---------------------------------------------------------------------------

    def _define(self, trial: Trial) -> dict[str, Any]:
        """Define-by-run: sample the architecture that will be trained (wired to the task's
        input/output and length) and write what is known before training."""
        arch, train = self.search_space.sample(trial, self.io)
        for key, value in rec.trial_attrs(arch, predicted_error=self.predict(arch),
                                          status="running").items():
            trial.set_user_attr(key, value)
        self._beat(trial._trial_id)
        return {"arch": arch.to_json(), "train": train}

    # --- results ----------------------------------------------------------------------------

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        self.last[trial_id] = result
        value = result.get(self.metric)
        if STEP in result and value is not None and math.isfinite(value):
            # A trial reaped while it ran (its driver looked dead) is finished: ignore the rest.
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                self._ot_trials[trial_id].report(value, result[STEP])

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None,
                          error: bool = False) -> None:
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None or trial_id in self._completed_trials:
            return
        if result is not None and result.get(STEP) != self.last.get(trial_id, {}).get(STEP):
            self.on_trial_result(trial_id, result)  # Tune skips it when a trial is stopped
        result = result or self.last.get(trial_id)
        state, value, attrs = self.classify(result, error)
        self._completed_trials.add(trial_id)
        self.last.pop(trial_id, None)
        tell(self.study, ot_trial, state, value, attrs)

    def classify(self, result: Mapping[str, Any] | None, error: bool
                 ) -> tuple[TrialState, float | None, dict[str, Any]]:
        """(state, value, user attrs) of a finished trial from its last result."""
        result = result or {}
        value, step = result.get(self.metric), result.get(STEP)
        attrs: dict[str, Any] = {rec.STEPS_REACHED: step, rec.TOKENS_PER_S:
                                 result.get("tokens_per_s"), NODE: result.get(NODE)}
        if error:
            return TrialState.FAIL, None, {**attrs, rec.STATUS: "failed", ERROR:
                                           "the worker died or the trial raised in Ray; see the "
                                           "trial's error.txt in the Ray experiment directory"}
        if result.get(STATUS) == "failed":
            return TrialState.FAIL, None, {**attrs, rec.STATUS: "failed",
                                           ERROR: result.get(ERROR)}
        if value is None or not math.isfinite(value):
            return TrialState.FAIL, None, {**attrs, rec.STATUS: "failed",
                                           ERROR: f"no finite {self.metric} reported"}
        if step is None or step < self.steps:
            return TrialState.PRUNED, None, {**attrs, rec.STATUS: "stopped"}
        return TrialState.COMPLETE, float(value), {**attrs, rec.STATUS: "completed"}

    # --- liveness and cleanup ---------------------------------------------------------------

    def _beat(self, trial_id: int) -> None:
        storage = self.study._storage  # RDBStorage, or Optuna's cache around it
        if is_heartbeat_enabled(storage):
            storage.record_heartbeat(trial_id)  # type: ignore[attr-defined]

    def beat(self) -> None:
        """Record a heartbeat for every trial this driver asked and has not told yet."""
        for trial_id, ot_trial in self._ot_trials.items():
            if trial_id not in self._completed_trials:
                self._beat(ot_trial._trial_id)

    def abandon(self, status: str) -> list[int]:
        """FAIL every trial still open (the search was interrupted) and re-enqueue its params.

        Returns:
            Numbers of the trials failed.
        """
        failed = []
        for trial_id, ot_trial in self._ot_trials.items():
            if trial_id in self._completed_trials:
                continue
            self._completed_trials.add(trial_id)
            if tell(self.study, ot_trial, TrialState.FAIL, None, {rec.STATUS: status}):
                retry_failed(self.study, ot_trial.number)
                failed.append(ot_trial.number)
        return failed

    # --- pickling: Ray writes the searcher to disk; keep the storage out ---------------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(study=None, _ot_study=None, _storage=None, _ot_trials={}, last={})
        return state

    def save(self, checkpoint_path: str) -> None:
        numbers = {tid: t.number for tid, t in self._ot_trials.items()}
        with open(checkpoint_path, "w") as f:
            json.dump({"trials": numbers, "completed": sorted(self._completed_trials)}, f)

    def restore(self, checkpoint_path: str) -> None:
        raise RuntimeError("resume a search with `python -m workers.search ... --resume`: the "
                           "study database, not Ray's experiment state, is the record")


def tell(study: optuna.Study, trial: Trial, state: TrialState, value: float | None,
         attrs: Mapping[str, Any]) -> bool:
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


def retried_numbers(trials: list[FrozenTrial]) -> set[int]:
    """Numbers of failed trials that have a retry copy (they do not count as finished)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        numbers = (RetryHeartbeatStaleTrialCallback.retried_trial_number(t) for t in trials)
        return {n for n in numbers if n is not None}


def finished_count(study: optuna.Study) -> int:
    """Trials that count against ``--trials``: COMPLETE, PRUNED, and FAIL without a retry."""
    trials = study.get_trials(deepcopy=False)
    retried = retried_numbers(trials)
    done = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    return sum(t.state in done and t.number not in retried for t in trials)
