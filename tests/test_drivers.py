"""One driver per study, end to end on real Ray and SQLite: a second driver started while the
first runs is refused in one line naming it (with or without --resume) and the study ends with
exactly its trials, none trained twice; two drivers started at the same instant on a database
that does not exist yet both open it and one of them runs the study."""

from __future__ import annotations

import time
from pathlib import Path

from tests.helpers.search import SMOKE, check_consistent, finish, launch, load, run, wait_for


def _study_exists(url: str, name: str) -> bool:
    try:
        load(url, name)
        return True
    except KeyError:
        return False


def _one_line_refusal(stderr: str, pid: int) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr[-3000:]
    assert "another driver is running it (driver pid " f"{pid} on" in lines[0], lines[0]


def test_a_second_driver_is_refused_before_it_runs_anything(tmp_path: Path,
                                                             ray_cluster: dict[str, str]) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    args = [*SMOKE, "--storage", url, "--study", "one", "--trials", "8"]
    first = launch(tmp_path, *args, ray=ray_cluster)
    wait_for(lambda: _study_exists(url, "one"), 120)
    time.sleep(2.0)  # study created, no trial finished yet: where two drivers used to share it
    for extra in ([], ["--resume"]):
        second = run(tmp_path, *args, *extra, ray=ray_cluster)
        assert second.returncode == 2, second.stderr[-3000:]
        _one_line_refusal(second.stderr, first.pid)
    _, err = finish(first, 300)
    assert first.returncode == 0, err[-3000:]
    study = load(url, "one")
    check_consistent(study, 8)  # exactly 8 counted, no architecture trained twice
    assert len(study.trials) == 8 + sum(t.user_attrs.get("status") == "duplicate"
                                        for t in study.trials)


def test_two_drivers_at_the_same_instant_on_a_new_database(tmp_path: Path,
                                                            ray_cluster: dict[str, str]) -> None:
    """Both create the database (race-free), then the lease lets one run the study."""
    url = f"sqlite:///{tmp_path / 'new.db'}"
    args = [*SMOKE, "--storage", url, "--study", "two", "--trials", "2"]
    drivers = [launch(tmp_path, *args, ray=ray_cluster), launch(tmp_path, *args, ray=ray_cluster)]
    ended = [(p.returncode, err) for p in drivers for _, err in [finish(p, 300)]]
    assert sorted(code for code, _ in ended) == [0, 2], [err[-2000:] for _, err in ended]
    refused = next(err for code, err in ended if code == 2)
    winner = next(p for p in drivers if p.returncode == 0)
    _one_line_refusal(refused, winner.pid)
    check_consistent(load(url, "two"), 2)
