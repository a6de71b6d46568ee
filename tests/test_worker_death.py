"""A trial whose Ray worker dies is retried, at any concurrency (real Ray, no stubs).

Two trials run at once and each one's worker is SIGKILLed twice: before its first report (Ray
restarts it in place, from scratch) and, in that restart, after its first report (Ray's one
restart is spent, Tune fails the trial). The study then retries each once more as a new trial
from its last checkpoint: both attempts stay in the study, the search counts the trial once and
exits 0, and the user reads one line of ours per worker death, none of Tune's tracebacks.
Ray's own words of a death never reach stdout: ``--format json`` prints one document. A trial
Ray fails for another reason (a reused worker that could not be reset) is named as such.
The workers are found, and held at the chosen moment, through the tests' own
``$TRANSFORMER_ALLOC_TEST_PIDS`` hook (``tests.helpers.trial_hooks``). The searcher's side of
it (what Tune runs next, the retry and its record) is also checked without Ray.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from alloc.settings import PlanSettings
from arch import ModelIO
from search_spaces import load_space
from studies.storage import open_storage
from studies.trials import RESUMED, Direction
from tests.helpers.search import SMOKE, check_consistent, finish, launch, load, run, wait_for
from tests.helpers.trial_hooks import hooked_env
from workers.search.failures import RayFailure, ray_failure
from workers.search.protocol import TRIAL_KEY, TrialReport, TrialSpec
from workers.search.searcher import (
    StudySearcher,
    finished_count,
    requeue_ray_failures,
    retried_numbers,
)
from workers.search.seeding import BoundPredictor

FIRST_REPORT = 10  # the smoke space's eval_every: the step of a trial's first report
DIED = "its worker died (SYSTEM_ERROR: "  # Ray's exit type of a killed worker, then its words


def held(pids: Path, moment: str, count: int, skip: set[int]) -> set[int]:
    """The pids of ``count`` workers (not in ``skip``) that reached ``moment`` and wait there."""
    def found() -> set[int]:
        return {int(p.name.split("-")[0]) for p in pids.glob(f"*-{moment}")
                if not p.name.startswith("hold")} - skip

    wait_for(lambda: len(found()) >= count, 120)
    return found()


def kill(workers: set[int], pids: Path, moment: str) -> None:
    """SIGKILL ``workers`` (held at ``moment``), then let the next ones past ``moment``."""
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    (pids / f"hold-{moment}").unlink()


def test_a_worker_killed_before_and_after_its_first_report_is_retried(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    pids = tmp_path / "pids"
    pids.mkdir()
    for moment in ("start", str(FIRST_REPORT)):
        (pids / f"hold-{moment}").touch()
    proc = launch(tmp_path, *SMOKE, "--storage", url, "--study", "w", "--trials", "2",
                  "--max-concurrent", "2", "--scheduler", "fifo", "--format", "json",
                  env=hooked_env(pids=pids))
    try:
        first = held(pids, "start", 2, set())
        kill(first, pids, "start")  # before any report: Ray restarts both in place
        again = held(pids, str(FIRST_REPORT), 2, first)
        kill(again, pids, str(FIRST_REPORT))  # the restarts, after a checkpoint: Ray gives up
        out, err = finish(proc, 240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(out)["trials"], out  # one document: Ray's words went to stderr
    study = load(url, "w")
    check_consistent(study, 2)
    trials = study.get_trials()
    retried = retried_numbers(trials)
    counted = [t for t in trials if t.number not in retried]
    assert [t.state for t in counted] and all(
        t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in counted), _states(trials)
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert len(failed) == 2 and {t.number for t in failed} == retried, _states(trials)
    for t in failed:
        assert "worker died" in t.user_attrs["error"] and t.user_attrs["restarts"] == 1
        (retry,) = [r for r in trials if r.system_attrs.get("failed_trial") == t.number]
        assert retry.state in (TrialState.COMPLETE, TrialState.PRUNED), _states(trials)
        assert retry.user_attrs[RESUMED] == FIRST_REPORT  # from the failed one's checkpoint
        assert retry.user_attrs.get("error") is None and retry.user_attrs.get("restarts") is None
        # One line of ours per death, numbered: the in-place restart, then the study's retry,
        # each with what Ray said of the process (a SIGKILL is a SYSTEM_ERROR exit to Ray).
        assert err.count(f"trial {t.number}, attempt ") == 2, err[-3000:]
        assert f"trial {t.number}, attempt 1: {DIED}" in err, err[-3000:]
        assert "; Ray restarts it in place from scratch" in err, err[-3000:]
        assert f"trial {t.number}, attempt 2: {DIED}" in err, err[-3000:]
        assert f"; retried as trial {retry.number} from step {FIRST_REPORT}" in err, err[-3000:]
        assert t.user_attrs["error"].startswith(DIED), t.user_attrs["error"]
        assert t.user_attrs["error"].endswith(f"); retried as a new trial from step "
                                              f"{FIRST_REPORT}"), t.user_attrs["error"]
    # Tune's tracebacks and end-of-run summaries are not the user's to read.
    for noise in ("Traceback", "Trial task failed", "Trials did not complete"):
        assert noise not in err, err[-3000:]
    assert not re.search(r"\bERROR\b", err), err[-3000:]  # Tune's log level (not SYSTEM_ERROR)
    assert "search: done, 2/2 trials in " in err, err[-3000:]


def test_a_worker_rays_memory_monitor_kills_is_named_with_the_nodes_memory(
        tmp_path: Path) -> None:
    """Ray's memory monitor kills a worker within a quarter second once the node's memory is
    over its threshold: every attempt of the trial dies so, each death named with the memory
    Ray measured (not "its worker died"), and the search ends as a fault (exit 1)."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    env = {**os.environ, "RAY_memory_usage_threshold": "0.01",  # any node is over 1% used
           "RAY_memory_monitor_refresh_ms": "100"}
    done = run(tmp_path, *SMOKE, "--storage", url, "--study", "m", "--trials", "1", env=env)
    err = done.stderr
    assert done.returncode == 1 and "all 1 trials failed" in err, err[-3000:]
    killed = "Ray's memory monitor killed its worker (the node ran low on memory: "
    for attempt in range(1, 5):  # Ray's restart and the study's retry, each restarted once
        assert f"attempt {attempt}: {killed}" in err, err[-3000:]
    assert "worker died" not in err, err[-3000:]
    failed = load(url, "m").get_trials()
    assert len(failed) == 2 and all(t.state == TrialState.FAIL for t in failed)
    assert all(re.match(re.escape(killed) + r"[\d.]+GB used / [\d.]+GB limit\)",
                        t.user_attrs["error"]) for t in failed), [t.user_attrs for t in failed]


# What Ray 2.60 recorded (error.txt) for a worker SIGKILLed in a method, an actor cancelled
# before it ran, an actor whose constructor raised and a worker its memory monitor killed,
# shortened where marked.
_SIGKILLED = """Failure # 1 (occurred at 2026-12-06_08:10:02)
The actor died unexpectedly before finishing this task.
\tclass_name: A
\tpid: 13768
The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker \
exit detail: Worker unexpectedly exits with a connection error code 2. End of file. Some common \
causes include: (1) the process was killed by the OOM killer due to high memory usage, (2) ray \
stop --force was called, or (3) the worker crashed unexpectedly due to SIGSEGV or another \
unexpected error.
"""
_CONSTRUCTOR = """Failure # 1 (occurred at 2026-12-06_08:11:40)
The actor died because of an error raised in its creation task, ray::A.__init__() (pid=14034)
  File "/tmp/die2.py", line 5, in __init__
    def __init__(self): import no_such_module_xyz
ModuleNotFoundError: No module named 'no_such_module_xyz'
"""
_CANCELLED = """Failure # 1 (occurred at 2026-12-06_08-28-20)
The actor died unexpectedly before finishing this task.
\tclass_name: ImplicitFunc
The actor is dead because all references to the actor were removed including lineage ref count.
The actor never ran - it was cancelled before it started running.
"""
_MEMORY = """Failure # 2 (occurred at 2026-12-06_08:14:21)
1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: \
192.0.2.2, ID: d070a6dbd5) was 1.09GB used / 23.54GB limit (0.046479)
OOM kill reason: Memory usage 1116971008B exceeded threshold of 1011047744B (4.0% of \
25276194816B limit)
[...]
Refer to the documentation on how to address the out of memory issue: ...
"""


def test_rays_recorded_errors_name_the_failure_and_what_ray_said() -> None:
    died = ray_failure(_SIGKILLED)
    assert died == RayFailure("died", "SYSTEM_ERROR: Worker unexpectedly exits with a "
                                      "connection error code 2")
    assert ray_failure(_CANCELLED) == RayFailure(
        "died", "The actor never ran - it was cancelled before it started running")
    start = ray_failure(_CONSTRUCTOR)
    assert start == RayFailure("start", "ModuleNotFoundError: No module named "
                                        "'no_such_module_xyz'")
    assert start.describe() == ("its worker raised before the trial began (ModuleNotFoundError: "
                                "No module named 'no_such_module_xyz')")
    # A trial that failed twice: its last failure is the one named.
    assert ray_failure(_SIGKILLED + _MEMORY) == RayFailure("memory", "1.09GB used / 23.54GB "
                                                                     "limit")
    assert ray_failure(_MEMORY + _SIGKILLED).kind == "died"
    assert ray_failure(None) == ray_failure("  \n") == RayFailure("died")
    assert ray_failure("Failure # 1 (occurred at x)\nray.exceptions.RaySystemError: lost") == \
        RayFailure("ray", "ray.exceptions.RaySystemError: lost")


def test_a_trial_whose_reused_worker_fails_to_reset_is_retried(tmp_path: Path,
                                                              ray_cluster: dict[str, str]) -> None:
    """Ray errors a trial whose reused worker fails ``reset_config`` (the last trial's thread
    still alive after ``TUNE_FUNCTION_THREAD_TIMEOUT_S``, 2 s: a loaded machine, a long step)
    without telling the searcher, which then waited for it forever (a search hung 15 minutes
    in the suite). With the timeout at 0 every reuse of a stopped trial's worker fails: the
    search still ends, each such trial retried, the study consistent."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    done = run(tmp_path, *SMOKE, "--storage", url, "--study", "r", "--trials", "2",
               "--max-concurrent", "1", env={**os.environ, "TUNE_FUNCTION_THREAD_TIMEOUT_S": "0"},
               ray=ray_cluster)  # the search hands the variable to a joined node's workers
    err = done.stderr
    assert done.returncode == 0, err[-3000:]
    study = load(url, "r")
    check_consistent(study, 2)  # the second trial is the first reuse of a worker
    failed = [t for t in study.get_trials() if t.state == TrialState.FAIL]
    assert failed, _states(study.get_trials())  # the reset did fail, and was told
    reuse = "Ray could not reuse a worker for it"  # named: no worker died
    assert all(t.user_attrs["error"].startswith(reuse) for t in failed), [
        t.user_attrs["error"] for t in failed]
    assert "search: done, 2/2 trials in " in err, err[-3000:]
    assert f": {reuse}" in err and "worker died" not in err, err[-3000:]
    assert "Could not re-use actor" not in err, err[-3000:]


def searcher(tmp_path: Path) -> StudySearcher:
    storage = open_storage(f"sqlite:///{tmp_path / 'u.db'}")
    study = optuna.create_study(study_name="u", storage=storage, direction="maximize",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    return StudySearcher(load_space("aot_vs_standard").with_train(steps=30, eval_every=10),
                         io=ModelIO(3, vocab_size=14), study=study, storage=storage, metric="acc",
                         direction=Direction.MAXIMIZE, steps=30, predict=BoundPredictor(
                             PlanSettings(budget=128, layers=2, seq_len=3)))


def asked(s: StudySearcher, key: str) -> TrialSpec:
    """What ``suggest`` hands Tune for a new trial (not ``wait`` or ``end``)."""
    config = s.suggest(key, 2)
    assert isinstance(config, dict), config
    return config[TRIAL_KEY]


def result(step: int, acc: float, resumed: int = 0) -> dict[str, Any]:
    return TrialReport("running", acc, "node", step, resumed_from=resumed).to_result("acc")


def test_the_searcher_retries_a_dead_worker_once_and_never_runs_too_many(
        tmp_path: Path) -> None:
    """Two trials to finish, two at once: a trial whose worker died (Tune's error, after one
    restart in place) is FAIL and retried from its checkpoint, as the only third trial; a
    retry that dies too is not retried again; the run ends once nothing runs."""
    s = searcher(tmp_path)
    assert asked(s, "a").resume_from is None and asked(s, "b").resume_from is None
    assert s.suggest("x", 2) == "wait"  # two running make the two: none more, but a may die
    s.report("a", result(10, 0.1))
    s.record_checkpoint("a", str(tmp_path / "ckpt-a"))
    assert s.recovered("a") == ("trial 0, attempt 1: its worker died; Ray restarts it in "
                                "place from step 10")
    s.complete("a", None, error=True)
    assert s.deaths["a"].describe() == ("trial 0, attempt 2: its worker died; retried as "
                                        "trial 2 from step 10")
    assert asked(s, "c").resume_from == tmp_path / "ckpt-a"  # the failed one's checkpoint
    assert s.suggest("y", 2) == "wait"
    a, _, retry = s.study.get_trials()
    assert a.state == TrialState.FAIL and "worker died" in a.user_attrs["error"]
    assert a.user_attrs["restarts"] == 1 and a.user_attrs["status"] == "ray_failed"
    assert retry.system_attrs["failed_trial"] == 0 and retry.user_attrs["status"] == "running"
    assert all(retry.user_attrs.get(k) is None for k in ("error", "restarts", RESUMED))
    s.complete("c", None, error=True)  # the retry's worker died too: not retried again
    assert s.deaths["c"].retry is None and "retries are spent" in s.deaths["c"].describe()
    assert s.suggest("z", 2) == "wait"  # b still runs
    s.complete("b", result(30, 0.5))
    assert s.suggest("z", 2) == "end"
    assert len(s.study.trials) == 3 and finished_count(s.study) == 2
    assert s.counts == {"COMPLETE": 1, "PRUNED": 0, "FAIL": 1}  # the retried one not counted
    # --resume retries what failed for the machine, not for its point, without counting it
    assert s.study.trials[2].user_attrs["error"] == (
        "its worker died; its retries are spent; --resume retries it")
    assert requeue_ray_failures(s.study) == [2] and requeue_ray_failures(s.study) == []
    assert finished_count(s.study) == 1


def _states(trials: list[FrozenTrial]) -> list[tuple[int, str, object]]:
    return [(t.number, t.state.name, t.system_attrs.get("failed_trial")) for t in trials]
