"""The prior sampler in the launcher (real Ray: the test process's, ``shared_ray``): a smoke
search records the prior and the calibration in the study; a search warm-started from it copies
its finished trials and trains as many new ones; a space with fewer points than ``--trials``
trains each point once and ends."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from alloc.prior.bound import point_key
from alloc.prior.sampler import CALIBRATION_ATTR, PRIOR_ATTR
from common.files import write_yaml
from studies.trials import WARM_START_FROM, TrialStatus
from tests.helpers.search import check_consistent
from workers.search.cli import main as search_main
from workers.search.searcher import finished_count
from workers.search.warmstart import WARM_START_ATTR


@pytest.mark.usefixtures("shared_ray")
def test_prior_search_warm_start_and_a_space_smaller_than_the_trials(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 's.db'}"
    # At width 64: the space's own 256 (3 layers, MLP 4x) trains 3 s a trial at smoke size
    prior = ["--space", "allocator_neighbourhood.yaml", "--task", "ngram", "--sampler", "prior",
             "--smoke-test", "--trials", "2", "--budget", "64", "--storage", url,
             "--storage-path", str(tmp_path / "results")]
    three = tmp_path / "three.yaml"
    write_yaml(three, {"name": "three", "budget": 32, "depth": 1, "sampler": "tpe",
                       "layers": [{"layers": "all", "heads": [1, 2, 4]}]})
    assert search_main([*prior, "--study", "p1"]) == 0
    assert search_main([*prior, "--study", "p2", "--warm-start", "p1"]) == 0
    assert search_main(["--space", str(three), "--task", "modadd", "--smoke-test",
                        "--trials", "6", "--scheduler", "fifo", "--storage", url,
                        "--study", "t", "--storage-path", str(tmp_path / "results")]) == 0

    first = optuna.load_study(study_name="p1", storage=url)
    check_consistent(first, 2)
    assert first.user_attrs[PRIOR_ATTR]["prior"] == "allocator"
    assert first.user_attrs[CALIBRATION_ATTR][0]["from_trial"] == 0  # the constants it used

    second = optuna.load_study(study_name="p2", storage=url)
    copied = [t for t in second.trials if WARM_START_FROM in t.user_attrs]
    finished = first.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert second.user_attrs[WARM_START_ATTR]["copied"] == len(copied) == len(finished)
    assert sorted((point_key(t.params), str(t.value)) for t in copied) == \
        sorted((point_key(t.params), str(t.value)) for t in finished)
    assert finished_count(second) == 2  # the copies do not count against --trials

    small = optuna.load_study(study_name="t", storage=url)
    trained = [t for t in small.trials if t.user_attrs.get("status") != TrialStatus.DUPLICATE]
    assert sorted(t.params["L0.g0.count"] for t in trained) == [1, 2, 4]
    assert all(t.state == TrialState.COMPLETE for t in trained)


def test_warm_start_errors_are_one_line_and_create_no_study(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    base = ["--space", "heads_vs_dim.yaml", "--task", "ngram", "--smoke-test", "--storage", url,
            "--storage-path", str(tmp_path / "results")]
    for argv, message in ((["--warm-start", "nosuch"], "--warm-start 'nosuch': no such study"),
                          (["--warm-start", "x", "--study", "x"], "is the study this search"),
                          (["--warm-start", "../x"], "--warm-start '../x': must be"),
                          (["--sampler", "bayes"], "invalid choice: 'bayes'"),
                          (["--prior-temperature", "0"], "--prior-temperature")):
        try:
            code = search_main([*base, *argv])
        except SystemExit as exit_:  # argparse's own checks exit with 2
            code = int(exit_.code or 0)
        assert code == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
    assert optuna.get_all_study_names(storage=url) == []
