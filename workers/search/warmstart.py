"""``--warm-start STUDY``: start a search from another study of the same database.

Two things carry over. The bound's constants that study calibrated last (``calibration`` attr,
written by the prior sampler) become this search's allocator constants, whatever its task or
budget. Its finished trials (COMPLETE and PRUNED) are copied with Optuna's public ``add_trials``
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

from alloc.constants import Constants
from alloc.sampler import CALIBRATION_ATTR
from arch import ModelIO
from search_spaces import SearchSpace
from workers.errors import WarmStartError
from workers.search.searcher import WARM_START_FROM, is_duplicate

WARM_START_ATTR = "warm_start"  # study user attr: what was carried over, from where
MEASURE_KEYS = ("task", "task_fields", "steps")  # study attrs: same measurement


@dataclass(frozen=True)
class WarmStart:
    """What a warm start carries over."""

    study: str
    constants: Constants | None  # its last calibrated constants, if it calibrated
    source: optuna.Study


def open_source(name: str, storage: optuna.storages.BaseStorage) -> WarmStart:
    """The study to warm-start from and its last calibrated constants."""
    try:
        source = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        names = optuna.get_all_study_names(storage=storage)
        raise WarmStartError(f"--warm-start {name!r}: no such study in this database; studies: "
                             f"{', '.join(names) or '(none)'}") from None
    fitted = [c for c in source.user_attrs.get(CALIBRATION_ATTR, [])
              if isinstance(c, Mapping) and c.get("architectures")]
    constants = None
    if fitted:
        last = fitted[-1]
        with contextlib.suppress(KeyError, TypeError, ValueError):
            constants = Constants(float(last["c_proj"]), float(last["c_head"]),
                                  float(last["order"]))
    return WarmStart(name, constants, source)


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
    differ = [k for k in MEASURE_KEYS if warm.source.user_attrs.get(k) != measure.get(k)]
    if differ:
        record["trials_not_copied"] = f"its {', '.join(differ)} differ from this search's"
    else:
        copies = [c for t in warm.source.get_trials(deepcopy=False, states=(
            TrialState.COMPLETE, TrialState.PRUNED)) if not is_duplicate(t)
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
        user_attrs={**trial.user_attrs, WARM_START_FROM: name, "warm_start_trial": trial.number})
