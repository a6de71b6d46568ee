"""``--warm-start STUDY``: start a search from another study of the same database.

Two things carry over. The bound's constants that study calibrated last (``calibration`` attr,
written by the prior sampler) become this search's allocator constants, whatever its task or
budget, unless that fit is too poor to mean anything (R² below ``MIN_R2``, or fewer than
``MIN_ARCHITECTURES`` architectures): then none, and ``WarmStart.ignored`` says why. Its
finished trials (COMPLETE and PRUNED) are copied with Optuna's public ``add_trials``
only when they measured the same thing (same task, task fields and training steps) and only the
points this space contains: a loss on another task is not a result of this one. Copies keep
their values, curves and records, are marked ``warm_start_from``, count as known points (never
trained again) but not against ``--trials``.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from alloc import CALIBRATION_ATTR, Constants
from arch import ModelIO
from common.errors import Problem, excerpt, printable
from search_spaces import SearchSpace
from studies.trials import WARM_START_FROM, WARM_START_TRIAL
from workers.errors import WarmStartError
from workers.search.searcher import not_trained

WARM_START_ATTR = "warm_start"  # study user attr: what was carried over, from where
MEASURE_KEYS = ("task", "task_fields", "steps")  # study attrs: same measurement


# A calibration carries over only when its fit means something: the fitted bound explains at
# least half of the variance of log-loss across the architectures (R², ``alloc.calibrate``; a
# fit with R² near 0 predicts no better than the mean loss, and its constants are whatever the
# optimiser stopped at), on at least twice as many architectures as it fits parameters (3
# constants and the scale: on 4 architectures the fit has no residual degree of freedom, so
# even a high R² says nothing). Only the study's last fit counts: an earlier one that passes
# was overruled by more architectures.
MIN_R2 = 0.5
MIN_ARCHITECTURES = 8


@dataclass(frozen=True)
class WarmStart:
    """What a warm start carries over."""

    study: str
    constants: Constants | None  # its last calibrated constants, if it calibrated and they fit
    source: optuna.Study
    ignored: str | None = None  # why its last constants were not carried (one clause)


def open_source(name: str, storage: optuna.storages.BaseStorage) -> WarmStart:
    """The study to warm-start from and its last calibrated constants (None when it never
    calibrated, or its last fit is too poor to carry: ``ignored`` says why)."""
    try:
        source = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        names = optuna.get_all_study_names(storage=storage)
        listed = ", ".join(printable(n) for n in names) or "(none)"
        raise WarmStartError.of([Problem("warm_start", repr(name), "no such study in this "
                                         f"database; studies: {listed}")]) from None
    fitted = [c for c in source.user_attrs.get(CALIBRATION_ATTR, [])
              if isinstance(c, Mapping) and c.get("architectures")]
    if not fitted:
        return WarmStart(name, None, source)
    last = fitted[-1]
    ignored = poor_fit(last)
    if ignored is not None:
        return WarmStart(name, None, source, f"study {name}'s constants ignored ({ignored})")
    constants = None
    with contextlib.suppress(KeyError, TypeError, ValueError):
        constants = Constants(float(last["c_proj"]), float(last["c_head"]), float(last["order"]),
                              float(last.get("width_order", 0.0)))  # absent before §2.3: 0
    return WarmStart(name, constants, source)


def poor_fit(calibration: Mapping[str, Any]) -> str | None:
    """Why a recorded calibration (``architectures``, ``r2``) is too poor to carry, or None."""
    count, r2 = calibration.get("architectures"), calibration.get("r2")
    if not isinstance(count, int) or not isinstance(r2, int | float) or r2 != r2:
        return f"its fit records no R² or architecture count: {excerpt(dict(calibration))}"
    if r2 < MIN_R2:
        return f"fit R² {r2:.3g} < {MIN_R2:g} on {count} architectures"
    if count < MIN_ARCHITECTURES:
        return (f"fit on {count} architectures < {MIN_ARCHITECTURES} (4 parameters fitted), "
                f"R² {r2:.3g}")
    return None


def copy_trials(warm: WarmStart, study: optuna.Study, space: SearchSpace, io: ModelIO,
                measure: Mapping[str, Any]) -> dict[str, Any]:
    """Copy ``warm``'s finished trials that measured ``measure`` (the study attrs of this
    search) on points of ``space`` into ``study`` (once: a resumed search does not copy again);
    returns what the study records of the warm start."""
    mine = study.user_attrs.get(WARM_START_ATTR)
    if isinstance(mine, Mapping) and mine.get("study") == warm.study:
        return dict(mine)
    record: dict[str, Any] = {"study": warm.study, "constants": None if warm.constants is None
                              else warm.constants.as_flags(), "copied": 0, "not_in_space": 0}
    if warm.ignored is not None:
        record["constants_ignored"] = warm.ignored
    differ = [k for k in MEASURE_KEYS if warm.source.user_attrs.get(k) != measure.get(k)]
    if differ:
        record["trials_not_copied"] = f"its {', '.join(differ)} differ from this search's"
    else:
        copies = [c for t in warm.source.get_trials(deepcopy=False, states=(
            TrialState.COMPLETE, TrialState.PRUNED)) if not not_trained(t)
            for c in [_copy(t, warm.study, space, io)]]
        record["not_in_space"] = sum(c is None for c in copies)
        kept = [c for c in copies if c is not None]
        study.add_trials(kept)
        record["copied"] = len(kept)
    study.set_user_attr(WARM_START_ATTR, record)
    return record


def _copy(trial: FrozenTrial, name: str, space: SearchSpace, io: ModelIO) -> FrozenTrial | None:
    """``trial`` as a trial of ``space`` (its params and distributions as this space samples
    them), or None when its point is not in the space."""
    probe = optuna.create_study()  # in memory: replays the point through the space's sampling
    with warnings.catch_warnings():  # a param the space does not have is re-sampled: refused
        warnings.simplefilter("ignore")
        probe.enqueue_trial(dict(trial.params))
        replay = probe.ask()
        space.sample(replay, io)
    if replay.params != trial.params:
        return None
    return optuna.trial.create_trial(
        state=trial.state, value=trial.value,  # a pruned trial's: its last reported value
        params=replay.params, distributions=replay.distributions,
        intermediate_values=dict(trial.intermediate_values),
        user_attrs={**trial.user_attrs, WARM_START_FROM: name, WARM_START_TRIAL: trial.number})
