"""The study side of a search without Ray: state classification, the curve, the heartbeat reaper
for ask/tell trials, abandoning on interrupt, starting points enqueued one at a time, and a
retried trial handed the checkpoint of the trial it retries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from alloc.settings import PlanSettings
from arch import ArchConfig, ModelIO
from search_spaces import load_space
from studies.storage import StorageSettings, open_storage, reap_trials
from studies.trials import CHECKPOINT, Direction, TrialStatus
from workers.search.protocol import TRIAL_KEY, TrialReport, TrialSpec
from workers.search.searcher import (
    Best,
    StudySearcher,
    finished_count,
    retried_numbers,
)
from workers.search.seeding import BoundPredictor, Start

STEPS = 30


def make(tmp_path: Path, starts: list[Start] | None = None, space: str = "aot_vs_standard",
         url: str | None = None, name: str = "s") -> StudySearcher:
    url = url or f"sqlite:///{tmp_path / 's.db'}"
    storage = open_storage(url, StorageSettings(heartbeat_interval=1, grace_period=2, retries=1))
    optuna.create_study(study_name=name, storage=storage, direction="maximize")
    study = optuna.load_study(study_name=name, storage=storage,
                              sampler=optuna.samplers.RandomSampler(seed=0))
    loaded = load_space(space).with_train(steps=STEPS, eval_every=10)
    return StudySearcher(loaded, io=ModelIO(3, vocab_size=14), study=study, storage=storage,
                         metric="acc", direction=Direction.MAXIMIZE, steps=STEPS,
                         predict=BoundPredictor(PlanSettings(budget=128, layers=2, seq_len=3)),
                         starts=starts or [])


@pytest.fixture
def searcher(tmp_path: Path) -> StudySearcher:
    return make(tmp_path)


def report(step: int | None, acc: float, status: TrialStatus = TrialStatus.RUNNING, **extra: Any
           ) -> TrialReport:
    return TrialReport(status, acc, "node", step, **extra)


def result(step: int | None, acc: float, **extra: Any) -> dict[str, Any]:
    """What Tune hands the searcher: the trial's report as a flat dict, plus Tune's own keys."""
    return {**report(step, acc, **extra).to_result("acc"), "training_iteration": 1}


def test_classify(searcher: StudySearcher) -> None:
    def classify(report: TrialReport | None, error: bool) -> tuple[str, float | None,
                                                                    dict[str, Any]]:
        """(state, value, the user attrs telling writes) of trial 0."""
        told = searcher.classify(report, error, 0)
        return told.state, told.value, told.told_attrs()

    assert classify(report(STEPS, 0.5), False)[:2] == ("COMPLETE", 0.5)
    assert classify(report(10, 0.9), False)[0] == "PRUNED"  # ASHA stopped it
    assert classify(report(STEPS, float("nan")), False)[0] == "FAIL"
    state, _, attrs = classify(report(7, float("-inf"), status=TrialStatus.FAILED,
                                      error="boom"), False)
    assert state == "FAIL" and attrs["error"] == "boom"
    assert attrs["steps_reached"] == 7  # where a diverged trial stopped is recorded
    assert classify(report(10, 0.9), True)[0] == "FAIL"
    assert classify(None, False)[0] == "FAIL"
    # The evaluation's noise travels with the trial: its loss and that loss's standard error.
    attrs = classify(report(STEPS, 0.5, val_loss=1.25, val_loss_se=0.01), False)[2]
    assert (attrs["val_loss"], attrs["val_loss_se"]) == (1.25, 0.01)


def test_a_report_round_trips_through_tunes_result_dict() -> None:
    sent = TrialReport("running", 0.5, "n1", 20, 1.5, 1.25, 900.0, resumed_from=10,
                       val_loss_se=0.02)
    assert TrialReport.from_result(result(20, 0.0) | sent.to_result("acc"), "acc") == sent
    assert TrialReport.from_result({"training_iteration": 3}, "acc") is None


def test_trials_record_arch_curve_and_state(searcher: StudySearcher, tmp_path: Path) -> None:
    config = searcher.ask("a")
    assert set(config) == {TRIAL_KEY} and isinstance(config[TRIAL_KEY], TrialSpec)
    assert config[TRIAL_KEY].resume_from is None
    for step in (10, 20, STEPS):
        searcher.report("a", result(step, step / 100, tokens_per_s=5.0))
    told = searcher.complete("a", result(STEPS, STEPS / 100, tokens_per_s=5.0))
    assert told is not None and (told.number, told.state, told.value) == (0, "COMPLETE", 0.3)
    searcher.ask("b")
    searcher.report("b", result(10, 0.05))
    # stopped: Tune skipped on_trial_result
    told = searcher.complete("b", result(20, 0.06))
    assert told is not None and (told.number, told.state, told.value) == (1, "PRUNED", None)
    a, b = searcher.study.trials
    assert a.state == TrialState.COMPLETE and a.value == 0.3
    assert a.intermediate_values == {10: 0.1, 20: 0.2, STEPS: 0.3}
    assert a.user_attrs["steps_reached"] == STEPS and a.user_attrs["predicted_error"] > 0
    assert b.state == TrialState.PRUNED and b.user_attrs["steps_reached"] == 20
    assert b.intermediate_values == {10: 0.05, 20: 0.06}
    assert searcher.complete("a", result(STEPS, 0.9)) is None  # a second one changes nothing
    assert searcher.study.trials[0].value == 0.3
    # Classified once, when told: the counts a progress line shows are the study's states.
    assert searcher.counts == {"COMPLETE": 1, "PRUNED": 1, "FAIL": 0}
    # What a resumed search's progress line starts from: the study's best so far (acc is
    # maximised: the higher of the two complete trials).
    searcher.ask("c")
    searcher.complete("c", result(STEPS, 0.2))
    assert searcher.best_so_far() == Best(0.3, 0, ArchConfig.from_json(a.user_attrs["arch"]))
    assert searcher.best == searcher.best_so_far()
    searcher.ask("d")
    searcher.complete("d", result(STEPS, 0.7))
    best = searcher.best_so_far()
    assert best is not None and (best.value, best.number) == (0.7, 3)
    assert searcher.best == searcher.best_so_far()
    assert make(tmp_path, name="s2").best is None  # a new study has no best yet


def test_reaper_fails_and_retries_trials_of_a_dead_driver(tmp_path: Path, storage_url: str,
                                                          study_name: str) -> None:
    """The resumed driver holds the lease: every RUNNING trial is a dead driver's, failed at
    once (no wait for heartbeats), each marked before it is failed."""
    searcher = make(tmp_path, url=storage_url, name=study_name)
    searcher.ask("a")
    searcher.ask("b")
    searcher.complete("a", result(STEPS, 0.4))
    searcher.beat()  # a live heartbeat does not save it: no other driver runs the study
    assert reap_trials(searcher.study, searcher.storage) == [1]
    states = [t.state for t in searcher.study.trials]
    assert states == [TrialState.COMPLETE, TrialState.FAIL, TrialState.WAITING]
    reaped = searcher.study.trials[1].user_attrs  # its record says why, not "running"
    assert reaped["status"] == "interrupted" and "driver stopped" in reaped["error"]
    assert retried_numbers(searcher.study.trials) == {1}
    assert finished_count(searcher.study) == 1
    retry = searcher.study.trials[2]
    assert retry.params == searcher.study.trials[1].params
    assert searcher.complete("b", result(STEPS, 0.5)) is None  # the late completion: ignored
    assert searcher.study.trials[1].state == TrialState.FAIL
    assert searcher.counts == {"COMPLETE": 1, "PRUNED": 0, "FAIL": 0}  # as the study says


def test_abandon_fails_open_trials_and_requeues_them(searcher: StudySearcher) -> None:
    searcher.ask("a")
    searcher.ask("b")
    searcher.complete("a", result(STEPS, 0.4))
    assert searcher.abandon("interrupted") == [1]
    b = searcher.study.trials[1]
    assert b.state == TrialState.FAIL and b.user_attrs["status"] == "interrupted"
    assert "re-enqueued" in b.user_attrs["error"]
    waiting = searcher.study.get_trials(states=(TrialState.WAITING,))
    assert len(waiting) == 1 and waiting[0].params == b.params
    # The re-enqueued trial is asked next and samples the same architecture.
    searcher.ask("c")
    assert searcher.study.trials[2].user_attrs["arch_id"] == b.user_attrs["arch_id"]


def test_a_retried_trial_gets_the_checkpoint_of_the_one_it_retries(
        searcher: StudySearcher, tmp_path: Path) -> None:
    searcher.ask("a")
    searcher.record_checkpoint("a", str(tmp_path / "checkpoint_000002"))
    searcher.abandon("interrupted")  # fails trial 0 and enqueues its retry
    spec = searcher.ask("b")[TRIAL_KEY]
    assert spec.resume_from == tmp_path / "checkpoint_000002"
    assert searcher.study.trials[0].user_attrs[CHECKPOINT] == str(spec.resume_from)
    searcher.record_checkpoint("b", str(tmp_path / "checkpoint_000005"))
    searcher.abandon("interrupted")  # the retry fails too: its retry takes the later one
    assert searcher.ask("c")[TRIAL_KEY].resume_from == tmp_path / "checkpoint_000005"
    searcher.complete("c", result(STEPS, 0.5))
    # Both failed links of the chain 0 -> 1 -> 2 were retried: one trial finished, not two.
    assert retried_numbers(searcher.study.trials) == {0, 1}
    assert finished_count(searcher.study) == 1
    assert searcher.ask("d")[TRIAL_KEY].resume_from is None  # a new trial starts from scratch


def test_starting_points_are_enqueued_one_at_a_time(tmp_path: Path) -> None:
    """A grid larger than the trials run leaves no point WAITING; points already in the study
    (a resumed search) are skipped."""
    grid = load_space("mixit_grid").grid()
    searcher = make(tmp_path, [Start("grid", p) for p in grid], space="mixit_grid")
    for key in ("a", "b", "c"):
        searcher.ask(key)
        searcher.complete(key, result(STEPS, 0.5))
    trials = searcher.study.trials
    assert [t.params for t in trials] == grid[:3]
    assert not searcher.study.get_trials(states=(TrialState.WAITING,))
    assert searcher.not_run() == len(grid) - 3
    again = StudySearcher(searcher.space, io=searcher.io, study=searcher.study,
                          storage=searcher.storage, metric="acc",
                          direction=Direction.MAXIMIZE, steps=STEPS, predict=searcher.predict,
                          starts=[Start("grid", p) for p in grid])
    again.ask("d")  # the first three are in the study already
    assert searcher.study.trials[3].params == grid[3]


def test_given_points_are_the_only_starts_and_must_be_in_the_space() -> None:
    """``SearchOptions.points``: a subset of a grid, in the order given, is what is enqueued
    (the sampler's own starting points are not); a point outside the space is refused."""
    from workers.errors import SearchError
    from workers.search.checks import check_points
    from workers.search.seeding import SearchPlan, starting_points

    space = load_space("mixit_grid")
    grid = space.grid()
    chosen = (grid[3], grid[0])
    settings = SearchPlan.make(PlanSettings(budget=space.budget, layers=space.depth, seq_len=8))
    assert [s.params for s in starting_points(space, settings, "grid", chosen)] == list(chosen)
    assert len(starting_points(space, settings, "grid")) == len(grid)
    check_points(space, chosen)
    with pytest.raises(SearchError, match="is not a point of space"):
        check_points(space, ({**grid[0], "train.seed": 99},))


def test_a_search_whose_every_trial_failed_exits_non_zero() -> None:
    from workers.search.cli import outcome
    from workers.search.driver import SearchSummary

    def summary(status: str = "completed", retried: list[int] | None = None,
                **counts: int) -> SearchSummary:
        return SearchSummary("s", "sqlite:///my studies.db", status, counts, retried or [], 0)

    code, note = outcome(summary(FAIL=3))
    assert code == 1 and note is not None and note.startswith("all 3 trials failed")
    assert "--storage 'sqlite:///my studies.db' --study s" in note  # shell-quoted, complete
    assert outcome(summary(FAIL=1, COMPLETE=2))[1].startswith("1 of 3 trials failed")
    assert outcome(summary(FAIL=1, COMPLETE=1, retried=[0])) == (0, None)  # its retry ran
    assert outcome(summary(COMPLETE=2)) == (0, None)
    assert outcome(summary("interrupted", FAIL=1, WAITING=1))[0] == 130


def test_a_seed_the_space_cannot_build_is_skipped_not_raised() -> None:
    """The plan is built for vector inputs; a space that ties embeddings cannot hold it."""
    from search_spaces import parse_space
    from workers.search.seeding import SearchPlan, seeds

    space = parse_space({"budget": 64, "depth": 2, "model": {"tie_embeddings": True},
                         "layers": [{"heads": [1, 2, 4, 8]}]})
    assert seeds(space, SearchPlan.make(PlanSettings(budget=64, layers=2, seq_len=8))) == []


def test_no_point_is_trained_twice_and_an_exhausted_space_ends_the_search(
        tmp_path: Path) -> None:
    """Random search of a 3-point space: proposals of finished points are recorded as not
    trained and re-asked (an untried point after three in a row), none counts against the
    trials, and once every point has a trial ``ask`` says the search is over."""
    from search_spaces import parse_space
    from studies.trials import DUPLICATE_OF

    searcher = make(tmp_path)
    searcher.space = parse_space({
        "name": "three", "budget": 32, "depth": 1, "sampler": "random",
        "layers": [{"layers": "all", "heads": [1, 2, 4]}],
        "train": {"steps": STEPS, "eval_every": 10}}, "<three>")
    asked = 0
    while (spec := searcher.ask(str(asked))) is not None:
        searcher.complete(str(asked), result(STEPS, 0.5))
        assert spec[TRIAL_KEY].arch.layers[0].n_heads in (1, 2, 4)
        asked += 1
    assert asked == 3 and finished_count(searcher.study) == 3
    trained = [t for t in searcher.study.trials if t.state == TrialState.COMPLETE]
    assert sorted(t.params["L0.g0.count"] for t in trained) == [1, 2, 4]
    for t in searcher.study.trials:
        if t.state == TrialState.FAIL:
            twin = searcher.study.trials[t.user_attrs[DUPLICATE_OF]]
            assert t.user_attrs["status"] == TrialStatus.DUPLICATE and twin.params == t.params


def drops_once(call: Any) -> tuple[Any, list[int]]:
    """``call`` wrapped so that its first call fails as a dropped database connection does
    (the driver's error under Optuna's wrapper), and the list that empties when it has."""
    import sqlite3

    drops = [1]

    def dropping(*args: Any, **kwargs: Any) -> Any:
        if drops:
            drops.pop()
            try:
                raise sqlite3.OperationalError("server closed the connection unexpectedly")
            except sqlite3.OperationalError as err:
                raise optuna.exceptions.StorageInternalError("lost") from err
        return call(*args, **kwargs)

    return dropping, drops


def test_a_tell_whose_connection_drops_is_retried_and_lands(searcher: StudySearcher,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """The guard retries a completion whose database connection dropped mid-write: the trial
    ends in its state with its value and attributes, counted once (not left RUNNING because
    the first attempt had already marked it done)."""
    from workers.search.guard import GuardedSearcher

    guarded = GuardedSearcher(searcher, "sqlite:///x.db", patience=30)
    guarded.ask("a")
    guarded.report("a", result(10, 0.1))
    dropping, drops = drops_once(searcher.study.tell)
    monkeypatch.setattr(searcher.study, "tell", dropping)
    told = guarded.complete("a", result(STEPS, 0.3))
    assert told is not None and (told.number, told.state, told.value) == (0, "COMPLETE", 0.3)
    assert guarded.fault is None and not drops
    (trial,) = searcher.study.trials
    assert trial.state == TrialState.COMPLETE and trial.value == 0.3
    assert trial.user_attrs["steps_reached"] == STEPS
    assert searcher.counts["COMPLETE"] == 1


def test_an_ask_whose_connection_drops_after_the_trial_was_made_hands_out_one_trial(
        searcher: StudySearcher, monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection that drops after Optuna made the trial (at its first heartbeat): the guard
    asks again, the first trial is recorded as an orphan, and only the trial handed to Tune
    counts as running. Before, the first trial stayed in the searcher's memory as running, was
    never handed out, and a search with one trial at a time waited for it forever."""
    from workers.search.guard import GuardedSearcher

    guarded = GuardedSearcher(searcher, "sqlite:///x.db", patience=30)
    dropping, drops = drops_once(searcher._beat)
    monkeypatch.setattr(searcher, "_beat", dropping)
    first = guarded.suggest("a", 1)  # one trial to run: before, "wait" for the lost one
    assert isinstance(first, dict) and not drops and guarded.fault is None
    assert list(guarded.trials) == ["a"] and guarded.trials["a"].number == 1
    orphan, handed = searcher.study.trials
    assert orphan.state == TrialState.FAIL and orphan.user_attrs["status"] == TrialStatus.ORPHAN
    assert handed.state == TrialState.RUNNING
    guarded.complete("a", result(STEPS, 0.3))
    assert guarded.suggest("b", 1) == "end"  # its one trial finished, nothing left RUNNING
    assert [t.state for t in searcher.study.trials] == [TrialState.FAIL, TrialState.COMPLETE]


def test_a_retry_whose_ask_loses_its_connection_is_enqueued_again(
        searcher: StudySearcher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dead worker's retry, dequeued as the connection drops: the guard records it as an
    orphan and enqueues it again, so the retry still runs from the dead trial's checkpoint (not
    a fresh trial in its place) and no retry is left counted as waiting."""
    from workers.search.guard import GuardedSearcher

    guarded = GuardedSearcher(searcher, "sqlite:///x.db", patience=30)
    searcher.ask("a")
    searcher.record_checkpoint("a", str(tmp_path / "checkpoint_000002"))
    searcher.complete("a", None, error=True)  # its worker died: a retry waits
    assert searcher.waiting == 1
    dropping, drops = drops_once(searcher._beat)
    monkeypatch.setattr(searcher, "_beat", dropping)
    spec = guarded.suggest("b", 1)
    assert isinstance(spec, dict) and not drops
    assert spec[TRIAL_KEY].resume_from == tmp_path / "checkpoint_000002"
    assert searcher.waiting == 0
    died, orphan, retry = searcher.study.trials
    assert died.user_attrs["status"] == TrialStatus.RAY_FAILED
    assert orphan.user_attrs["status"] == TrialStatus.ORPHAN
    assert retry.state == TrialState.RUNNING and guarded.trials["b"].number == retry.number
