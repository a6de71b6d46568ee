"""How long a search will take (``workers.search.estimate``): before Ray starts, from a few timed
training steps; during the search, from the finished trials' times and how many run at once."""

from __future__ import annotations

import itertools

import pytest

from workers.search import estimate
from workers.search.estimate import TrialEstimate


def simulate(prune: set[int]) -> tuple[list[float], list[float], list[str]]:
    """A search of 14 trials of 2,000 steps, 2 at once, 0.2 s per step, evaluating every 100
    steps; trials in ``prune`` stop at step 700. Returns the time left it said at each
    evaluation, the true time left then, and what the first trials measured."""
    work, said = estimate.Work(2000, 14), []
    told: list[str] = []
    queue, now, events = list(range(14)), 0.0, []
    running: dict[int, int] = {}  # trial -> step
    while queue or running:
        while queue and len(running) < 2:
            running[queue.pop(0)] = 0
            work.start(now)
        trial = min(running, key=lambda t: running[t])  # the one furthest behind trains on
        running[trial] += 100
        now += 100 * 0.2 / 2  # two trials share the time
        work.report(str(trial), running[trial], 0, now)
        said.append(work.left(now) or 0.0)
        events.append(now)
        if not told and (line := estimate.measured(work, 2)):
            told.append(line)
        if running[trial] == 2000 or (trial in prune and running[trial] == 700):
            work.finish(str(trial))
            del running[trial]
    true = [now - at for at in events]
    return said, true, told


@pytest.mark.parametrize("prune", [set(), {3, 5, 8, 12}])
def test_the_time_left_moves_with_the_steps_and_never_jumps_twofold(prune: set[int]) -> None:
    said, true, told = simulate(prune)
    for before, after in itertools.pairwise(said[5:]):  # consecutive updates, past the first
        if min(before, after) > 60:  # a minute or more left: within 2x of each other
            assert 0.5 <= after / before <= 2.0, (before, after)
    for estimate_s, real in zip(said[len(said) // 4:], true[len(true) // 4:]):
        assert estimate_s <= 1.6 * real + 30, (estimate_s, real)  # an upper bound, not wild
        if not prune:
            assert estimate_s == pytest.approx(real, rel=0.25, abs=30)
    assert told == ["measured on its first 2 trial(s) at 2 at once: 200 ms/step, ~6 min 40 s "
                    "per trial; at most ~46 min 40 s for 14 trial(s)"]


def test_a_retry_reporting_its_evaluations_again_trains_nothing() -> None:
    work = estimate.Work(2000, 2)
    work.report("a", 1200, 1000, 10.0)  # a retry from step 1000: its first new evaluation
    work.report("a", 1300, 1000, 20.0)
    assert work.rate(20.0) == pytest.approx(300 / 10.0)


def test_the_estimate_says_its_basis_and_the_trials_at_once() -> None:
    timed = TrialEstimate(step_s=0.5, eval_s=0.1, steps=2000, evaluations=20, eval_batches=10,
                          timed=8, basis="the allocator's plan")
    assert timed.trial_s == pytest.approx(1000 + 20)
    search = estimate.SearchEstimate(timed, trials=20, concurrent=2)
    text = estimate.describe(search, scheduler="asha")
    assert text.startswith("~17 min 00 s per trial (2,000 steps at 500 ms/step")
    assert "timed over 8 steps of the allocator's plan here) and ~1.2 s of Ray's" in text
    assert "~2 h 50 min for 20 trial(s) at 2 at once" in text and "ASHA" in text
    assert "load" not in text and "ASHA" not in estimate.describe(search, "fifo")
    assert "at load 3.5x the cores" in estimate.describe(
        estimate.SearchEstimate(timed, 20, 2, slowdown=3.5), "fifo")


@pytest.mark.parametrize(("trials", "concurrent", "reuse"), [(6, 2, True), (7, 2, False),
                                                             (1, 4, True), (14, 1, True)])
def test_a_search_is_rays_start_then_rounds_of_trials_with_rays_share(
        trials: int, concurrent: int, reuse: bool) -> None:
    # a smoke search's trials train for a second: Ray's start and bookkeeping are its time
    timed = TrialEstimate(step_s=0.03, eval_s=0.01, steps=40, evaluations=4, eval_batches=2,
                          timed=8, basis="the grid's first point")
    quiet = estimate.SearchEstimate(timed, trials, concurrent, reuse)
    rounds = -(-trials // concurrent)
    assert quiet.rounds == rounds
    workers = 1 if reuse else rounds
    assert quiet.start_s == pytest.approx(estimate.RAY_START_S + workers * estimate.WORKER_START_S)
    assert quiet.total_s == pytest.approx(quiet.start_s + rounds * (
        timed.trial_s + estimate.TRIAL_OVERHEAD_S))
    assert quiet.total_s > 2 * rounds * timed.trial_s  # Ray's parts dominate a tiny trial
    # a loaded machine slows Ray's parts; the trials' steps were timed under the load already
    loaded = estimate.SearchEstimate(timed, trials, concurrent, reuse, slowdown=3.0)
    assert loaded.total_s - rounds * timed.trial_s == pytest.approx(
        3.0 * (quiet.total_s - rounds * timed.trial_s))
    assert estimate.slowdown() >= 1.0


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
    from workers.search.seeding import Start
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
