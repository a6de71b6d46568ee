"""``--warm-start``: a study's calibrated constants carry over only when their fit means
something (``MIN_R2``, ``MIN_ARCHITECTURES``); otherwise none, with the reason in one clause,
also recorded in the new study's ``warm_start`` attr."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest

from alloc.constants import Constants
from alloc.prior.sampler import CALIBRATION_ATTR
from search_spaces import PROBE_IO, load_space
from workers.search.warmstart import (
    MIN_ARCHITECTURES,
    MIN_R2,
    WARM_START_ATTR,
    copy_trials,
    open_source,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)
RAW = {"c_proj": 1.0, "c_head": 1.0, "order": 2.0, "from_trial": 0, "architectures": 0,
       "r2": None, "spearman": None, "source": "the plan's"}


def fit(architectures: int, r2: float | None) -> dict[str, Any]:
    return {"c_proj": 0.0123, "c_head": 45.6, "order": 5.9, "from_trial": 4,
            "architectures": architectures, "r2": r2, "spearman": 0.2,
            "source": "fitted on the study"}


def source(tmp_path: Path, *calibrations: dict[str, Any]) -> optuna.storages.BaseStorage:
    tmp_path.mkdir(parents=True, exist_ok=True)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 's.db'}")
    study = optuna.create_study(storage=storage, study_name="src")
    if calibrations:
        study.set_user_attr(CALIBRATION_ATTR, list(calibrations))
    return storage


@pytest.mark.parametrize(("last", "reason"), [
    (fit(4, 2e-15), "study src's constants ignored (fit R² 2e-15 < 0.5 on 4 architectures)"),
    (fit(20, 0.31), "study src's constants ignored (fit R² 0.31 < 0.5 on 20 architectures)"),
    (fit(6, 0.97), "study src's constants ignored (fit on 6 architectures < 8 (4 parameters "
                   "fitted), R² 0.97)"),
    (fit(9, None), "study src's constants ignored (its fit records no R² or architecture "
                   "count: "),
])
def test_a_meaningless_calibration_is_not_carried(tmp_path: Path, last: dict[str, Any],
                                                   reason: str) -> None:
    # An earlier fit that would pass does not count: the last, on more architectures, overrules.
    warm = open_source("src", source(tmp_path, RAW, fit(12, 0.9), last))
    assert warm.constants is None
    assert warm.ignored is not None and warm.ignored.startswith(reason), warm.ignored
    study = optuna.create_study()
    record = copy_trials(warm, study, load_space("aot_vs_standard"), PROBE_IO,
                         {"task": "another"})
    assert record["constants"] is None and record["constants_ignored"] == warm.ignored
    assert study.user_attrs[WARM_START_ATTR] == record


def test_a_fit_that_explains_the_losses_is_carried(tmp_path: Path) -> None:
    good = fit(MIN_ARCHITECTURES, MIN_R2)
    warm = open_source("src", source(tmp_path, RAW, good))
    assert warm.constants == Constants(0.0123, 45.6, 5.9) and warm.ignored is None


def test_a_study_that_never_calibrated_carries_nothing_and_says_nothing(tmp_path: Path) -> None:
    for calibrations in ((), (RAW,)):  # the plan's own constants are no calibration
        warm = open_source("src", source(tmp_path / str(len(calibrations)), *calibrations))
        assert warm.constants is None and warm.ignored is None
