"""How long a search will take (``workers.search.estimate``): before Ray starts, from a few timed
training steps; during the search, from the finished trials' times and how many run at once."""

from __future__ import annotations

import pytest

from workers.search import estimate
from workers.search.estimate import TrialEstimate


def test_time_left_counts_the_running_and_the_pending_trials_at_once() -> None:
    assert estimate.remaining([], [5.0], 3, 2) is None  # nothing finished: no estimate yet
    # trials of 10 s, 2 at once: one running for 4 s (6 s left) and 3 pending (30 s)
    assert estimate.remaining([8.0, 12.0], [4.0], 3, 2) == pytest.approx(18.0)
    # the last running trial decides when nothing is pending
    assert estimate.remaining([10.0], [1.0, 9.0], 0, 2) == pytest.approx(9.0)
    assert estimate.remaining([10.0], [30.0], 0, 1) == 0.0  # past the mean: nothing known left


def test_the_estimate_says_its_basis_and_the_trials_at_once() -> None:
    timed = TrialEstimate(step_s=0.5, eval_s=0.1, steps=2000, evaluations=20, eval_batches=10,
                          timed=8, basis="the allocator's plan")
    assert timed.trial_s == pytest.approx(1000 + 20)
    text = estimate.describe(timed, trials=20, concurrent=2, scheduler="asha")
    assert text.startswith("~17 min 00 s per trial (2,000 steps at 500 ms/step")
    assert "timed over 8 steps of the allocator's plan here" in text
    assert "~2 h 50 min for 20 trial(s) at 2 at once" in text and "ASHA" in text
    assert "ASHA" not in estimate.describe(timed, 20, 2, "fifo")


def test_trials_at_once_are_what_the_cpus_allow_and_the_flags_cap() -> None:
    import os

    cpus = os.cpu_count() or 1
    assert estimate.at_once(1.0, 0.0, None, 1000) == cpus
    assert estimate.at_once(1.0, 0.0, 1, 1000) == 1
    assert estimate.at_once(1.0, 0.0, None, 1) == 1
    assert estimate.at_once(cpus * 2.0, 0.0, None, 1000) == 1


def test_the_probe_times_a_few_steps_of_the_first_starting_point() -> None:
    from search_spaces import RandomSuggester, load_space
    from workers.search.driver import trial_job
    from workers.search.options import SearchOptions, training_budget
    from workers.search.searcher import Start
    from workers.tasks import make_task

    space = training_budget(load_space("aot_vs_standard.yaml"), smoke_test=True)
    task = make_task("modadd", "smoke")
    point, _ = space.sample(RandomSuggester(3), task.io)
    timed = estimate.probe(space, task, trial_job(task, SearchOptions()),
                           [Start("allocator", space.encode(point))])
    assert timed.basis == "the allocator's plan" and 1 <= timed.timed <= 8
    assert timed.steps == 40 and timed.evaluations == 4 and timed.step_s > 0
    unseeded = estimate.probe(space, task, trial_job(task, SearchOptions()), [])
    assert unseeded.basis == "a random point of the space"
