"""The study-safe ``OptunaSearch`` without Ray running: state classification, the curve, the
heartbeat reaper for ask/tell trials, abandoning on interrupt, pickling without the storage."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from alloc.plan import PlanSettings
from search_spaces import ModelIO, load_space
from studies.storage import StorageSettings, open_storage, reap_dead
from workers.search import Predictor
from workers.searcher import StudySearcher, finished_count, retried_numbers

STEPS = 30


@pytest.fixture
def searcher(tmp_path: Path) -> StudySearcher:
    url = f"sqlite:///{tmp_path / 's.db'}"
    storage = open_storage(url, StorageSettings(heartbeat_interval=1, grace_period=2, retries=1))
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    space = load_space("aot_vs_standard").with_train(steps=STEPS, eval_every=10)
    return StudySearcher(space, io=ModelIO(3, vocab_size=14), study=study, metric="acc",
                         mode="max", steps=STEPS,
                         predict=Predictor(PlanSettings(budget=128, layers=2, seq_len=3)),
                         sampler=optuna.samplers.RandomSampler(seed=0))


def result(step: int | None, acc: float, **extra: object) -> dict[str, object]:
    return {"acc": acc, **({"step": step} if step is not None else {}), **extra}


def test_classify(searcher: StudySearcher) -> None:
    assert searcher.classify(result(STEPS, 0.5), False)[:2] == (TrialState.COMPLETE, 0.5)
    assert searcher.classify(result(10, 0.9), False)[0] == TrialState.PRUNED  # ASHA stopped it
    assert searcher.classify(result(STEPS, float("nan")), False)[0] == TrialState.FAIL
    state, _, attrs = searcher.classify(result(None, float("-inf"), status="failed",
                                               error="boom"), False)
    assert state == TrialState.FAIL and attrs["error"] == "boom"
    assert searcher.classify(result(10, 0.9), True)[0] == TrialState.FAIL
    assert searcher.classify(None, False)[0] == TrialState.FAIL


def test_trials_record_arch_curve_and_state(searcher: StudySearcher) -> None:
    config = searcher.suggest("a")
    assert config is not None and "arch" in config and "L0.attention" in config
    for step in (10, 20, STEPS):
        searcher.on_trial_result("a", result(step, step / 100, tokens_per_s=5.0))
    searcher.on_trial_complete("a", result(STEPS, STEPS / 100, tokens_per_s=5.0))
    searcher.suggest("b")
    searcher.on_trial_result("b", result(10, 0.05))
    searcher.on_trial_complete("b", result(20, 0.06))  # stopped: Tune skipped on_trial_result
    a, b = searcher.study.trials
    assert a.state == TrialState.COMPLETE and a.value == 0.3
    assert a.intermediate_values == {10: 0.1, 20: 0.2, STEPS: 0.3}
    assert a.user_attrs["steps_reached"] == STEPS and a.user_attrs["predicted_error"] > 0
    assert b.state == TrialState.PRUNED and b.user_attrs["steps_reached"] == 20
    assert b.intermediate_values == {10: 0.05, 20: 0.06}
    searcher.on_trial_complete("a", result(STEPS, 0.9))  # a second completion changes nothing
    assert searcher.study.trials[0].value == 0.3


def test_reaper_fails_and_retries_trials_of_a_dead_driver(searcher: StudySearcher) -> None:
    searcher.suggest("a")
    searcher.suggest("b")
    searcher.on_trial_complete("a", result(STEPS, 0.4))
    storage = searcher.study._storage._backend  # type: ignore[attr-defined]
    searcher.beat()
    assert reap_dead(searcher.study, storage, wait=0.5) == [1]  # its driver still beats
    time.sleep(2.5)  # the driver "died": no more heartbeats past the grace period
    assert reap_dead(searcher.study, storage, wait=5) == []
    states = [t.state for t in searcher.study.trials]
    assert states == [TrialState.COMPLETE, TrialState.FAIL, TrialState.WAITING]
    assert retried_numbers(searcher.study.trials) == {1}
    assert finished_count(searcher.study) == 1
    retry = searcher.study.trials[2]
    assert retry.params == searcher.study.trials[1].params
    searcher.on_trial_complete("b", result(STEPS, 0.5))  # the late completion is ignored
    assert searcher.study.trials[1].state == TrialState.FAIL


def test_abandon_fails_open_trials_and_requeues_them(searcher: StudySearcher) -> None:
    searcher.suggest("a")
    searcher.suggest("b")
    searcher.on_trial_complete("a", result(STEPS, 0.4))
    assert searcher.abandon("interrupted") == [1]
    b = searcher.study.trials[1]
    assert b.state == TrialState.FAIL and b.user_attrs["status"] == "interrupted"
    waiting = searcher.study.get_trials(states=(TrialState.WAITING,))
    assert len(waiting) == 1 and waiting[0].params == b.params
    # The re-enqueued trial is asked next and samples the same architecture.
    searcher.suggest("c")
    assert searcher.study.trials[2].user_attrs["arch_id"] == b.user_attrs["arch_id"]


def test_pickled_searcher_holds_no_storage(searcher: StudySearcher, tmp_path: Path) -> None:
    searcher.suggest("a")
    blob = pickle.dumps(searcher)
    assert str(tmp_path).encode() not in blob and b"sqlite" not in blob
    assert pickle.loads(blob).search_space.name == "aot_vs_standard"
