"""The launcher end to end (real Ray, real study databases): the smoke search on SQLite and
PostgreSQL then ``studies best``, failures recorded with their error, ASHA-stopped trials kept
apart, resume after Ctrl-C and after a SIGKILLed driver, and no password on disk."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from sqlalchemy.engine import make_url

from arch import ArchConfig, HeadGroup, LayerSpec
from search_spaces import load_space
from studies import add_record
from studies.cli import main as studies_main
from studies.trials import CHECKPOINT, RESUMED
from tests.helpers.search import (
    SMOKE,
    assert_records_are_the_trained_models,
    check_consistent,
    launch,
    load,
    ray_tmp,
    run,
    wait_for,
)
from tests.helpers.trial_hooks import hooked_env
from workers.search.options import SearchOptions
from workers.search.searcher import finished_count


@pytest.mark.parametrize(("task", "space"), [("ngram", "heads_vs_dim.yaml"),
                                             ("memorize", "aot_vs_standard.yaml")])
@pytest.mark.usefixtures("shared_ray")
def test_study_records_the_trained_model(task: str, space: str, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """In this process, on its Ray (``shared_ray``): ``python -m workers.search`` as a
    command is the other tests' (the smoke search, failures, resume)."""
    from workers.search.cli import main as search_main

    url = f"sqlite:///{tmp_path / 's.db'}"
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    ctrl_c = signal.getsignal(signal.SIGINT)
    code = search_main(["--space", space, "--task", task, "--smoke-test", "--trials", "3",
                        "--scheduler", "fifo", "--storage", url, "--study", "rec", "--format",
                        "json", "--storage-path", str(tmp_path / "results")])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    # Tune's Ctrl-C handler ends with its run: the process's next Ctrl-C is its own again.
    assert signal.getsignal(signal.SIGINT) is ctrl_c
    study = load(url, "rec")
    assert_records_are_the_trained_models(study, task, tmp_path)
    # A grid larger than --trials: the points not run are not left WAITING, and the summary
    # says how many there are.
    assert not study.get_trials(states=(TrialState.WAITING,))
    grid = len(load_space(space).grid()) if space == "heads_vs_dim.yaml" else 3
    assert json.loads(out)["not_run"] == grid - 3


def test_smoke_search_then_studies_best(storage_url: str, study_name: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str],
                                        ray_cluster: dict[str, str]) -> None:
    secret = ""
    if storage_url.startswith("postgresql"):  # trust auth accepts any password: plant one
        secret = "pw-" + study_name[-8:]
        storage_url = make_url(storage_url).set(password=secret).render_as_string(False)
    proc = run(tmp_path, *SMOKE, "--storage", storage_url, "--study", study_name, ray=ray_cluster)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "best per-layer allocation" in proc.stdout and "python -m studies export" in proc.stdout
    # Progress on a stderr that is no terminal: the estimate before Ray starts, one line per
    # finished trial, the end; no bar's redraws, and nothing of Ray's token notice.
    assert " per trial (40 steps at " in proc.stderr and " for 6 trial(s) at " in proc.stderr
    finished = [line for line in proc.stderr.splitlines() if line.startswith("search: ")
                and " trials (" in line]
    assert [line.split()[1] for line in finished] == [f"{k}/6" for k in range(1, 7)]
    assert "search: done, 6/6 trials in " in proc.stderr
    assert "\r" not in proc.stderr and "Token authentication" not in proc.stderr
    plain = storage_url.replace(f":{secret}@", "@")
    study = load(plain, study_name)
    check_consistent(study, 6)
    # Each trial is classified once, by the searcher as it tells the study: the last progress
    # line counts the study's states.
    complete, stopped, failed = (len(study.get_trials(states=(state,))) for state in (
        TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL))
    assert finished[-1].split("; ")[1].startswith(
        f"{complete} complete, {stopped} stopped early, {failed} failed"), finished[-1]
    assert_records_are_the_trained_models(study, "modadd", tmp_path)
    seeds = {t.user_attrs.get("seed") for t in study.trials}
    assert "allocator" in seeds and study.trials[0].user_attrs["seed"] == "allocator"
    assert study.user_attrs["space_name"] == "aot_vs_standard"
    assert studies_main(["best", "--storage", plain, "--study", study_name]) == 0
    assert "attention" in capsys.readouterr().out
    if secret:
        leaks = subprocess.run(["grep", "-rl", secret, str(tmp_path), str(ray_tmp(tmp_path))],
                               capture_output=True, text=True).stdout
        assert not leaks and secret not in proc.stdout + proc.stderr, leaks


def test_failed_trials_are_recorded_and_the_search_goes_on(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    faults = [{"kind": "raise", "match": '"mixit"'}, {"kind": "nan", "match": '"mssa"'}]
    proc = run(tmp_path, *SMOKE, "--storage", url, "--study", "f", "--trials", "8",
               "--scheduler", "fifo", "--max-concurrent", "1", env=hooked_env(faults=faults))
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = load(url, "f")
    check_consistent(study, 8)
    kinds = {"raise": 0, "nan": 0, "ok": 0}
    for t in study.trials:
        arch = t.user_attrs["arch"]
        if '"mixit"' in arch:
            assert t.state == TrialState.FAIL and "injected failure" in t.user_attrs["error"]
            kinds["raise"] += 1
        elif '"mssa"' in arch:
            assert t.state == TrialState.FAIL and "non-finite" in t.user_attrs["error"]
            assert t.user_attrs["steps_reached"] >= 1  # where it diverged is recorded
            kinds["nan"] += 1
        else:
            assert t.state == TrialState.COMPLETE
            kinds["ok"] += 1
    assert all(kinds.values()), kinds


def _stop(proc: subprocess.Popen[str], how: str) -> None:
    """Stop the driver ``how``; a clean stop (SIGINT as Ctrl-C, SIGTERM alike) marks its trials,
    says one line and exits 128 + the signal."""
    if how == "sigkill":
        os.kill(proc.pid, signal.SIGKILL)  # the driver only: its Ray processes must go too
        proc.wait(10)
        return
    proc.send_signal(signal.SIGINT if how == "sigint" else signal.SIGTERM)
    assert proc.wait(60) == (130 if how == "sigint" else 143)
    _, err = proc.communicate()
    # Our advice is the only one: Ray's own (Tuner.restore) would not resume the study,
    # and its native SIGTERM handler's stack dump ("*** SIGTERM received ... PC: @") goes.
    assert "continue with --resume" in err and "Tuner.restore" not in err, err[-3000:]
    assert "SIGTERM received" not in err and "PC: @" not in err, err[-3000:]
    said = "interrupted: trials" if how == "sigint" else "terminated: trials"
    assert said in err, err[-3000:]


# Ctrl-C and then SIGTERM stop one study in turn (each resumed), so the second stop also
# meets a resumed driver; SIGKILL kills a driver on its own Ray, which must go with it (the
# resumes join the test's node: where the study resumes is not what is tested).
@pytest.mark.parametrize("stops", [("sigint", "sigterm"), ("sigkill",)], ids="+".join)
def test_resume_after_interrupt_or_killed_driver(tmp_path: Path, stops: tuple[str, ...],
                                                 ray_cluster: dict[str, str]) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    # The last stop, at 2 finished per stop, leaves trials running or waiting under CI's load.
    args = [*SMOKE, "--storage", url, "--study", "r", "--trials", str(2 * len(stops) + 4),
            "--heartbeat-interval", "1", "--grace-period", "3"]
    before: dict[int, tuple[TrialState, float | None]] = {}
    for i, how in enumerate(stops):
        ray = None if how == "sigkill" else ray_cluster
        proc = launch(tmp_path, *args, *(["--resume"] if i else []), ray=ray)

        def some_done(at_least: int = 2 * (i + 1)) -> bool:
            try:
                return finished_count(load(url, "r")) >= at_least
            except KeyError:
                return False

        wait_for(some_done, 120)
        _stop(proc, how)
        now = {t.number: (t.state, t.value) for t in load(url, "r").trials
               if t.state in (TrialState.COMPLETE, TrialState.PRUNED)}
        assert all(now[n] == v for n, v in before.items())  # nothing finished lost or redone
        before = now
        if how != "sigkill":  # a clean stop leaves nothing RUNNING
            assert not load(url, "r").get_trials(states=(TrialState.RUNNING,))
    again = run(tmp_path, *args, "--resume", ray=ray_cluster)
    assert again.returncode == 0, again.stderr[-3000:]
    if "sigkill" in stops:  # its lease is taken over at once: its pid is gone from this host
        assert f"took over from its last driver (driver pid {proc.pid} on" in again.stderr
    study = load(url, "r")
    check_consistent(study, 2 * len(stops) + 4)
    after = {t.number: (t.state, t.value) for t in study.trials}
    assert all(after[n] == v for n, v in before.items())  # no finished trial lost or redone
    # A retried trial whose failed original had checkpointed continued from that checkpoint.
    by_number = {t.number: t for t in study.trials}
    for t in study.trials:
        original = t.system_attrs.get("failed_trial")
        if original is not None and CHECKPOINT in by_number[original].user_attrs \
                and t.state == TrialState.COMPLETE:
            assert t.user_attrs.get(RESUMED, 0) > 0, (t.number, original)


def test_ray_says_nothing_a_search_must_not_follow_or_need_not_read() -> None:
    """Tune's resume advice (a search resumes from its study), Ray's token notice and the
    metrics warning of an interrupted trial are dropped; Ray's other records are kept."""
    import logging

    from ray._private.authentication import authentication_token_setup

    from workers.search import tune

    tune.quiet_ray_advice()
    tune.quiet_ray_advice()  # idempotent: one filter per logger
    assert len(logging.getLogger("ray.tune.tune").filters) == 1
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    def logged(name: str, emit: object) -> list[str]:
        seen.clear()
        logger, handler = logging.getLogger(name), Keep()
        logger.addHandler(handler)
        try:
            emit()  # type: ignore[operator]
        finally:
            logger.removeHandler(handler)
        return list(seen)

    resume = ('Experiment has been interrupted, but the most recent state was saved.\n'
              'Resume experiment with: Tuner.restore(path="x", trainable=...)')
    tune_log = logging.getLogger("ray.tune.tune")
    assert logged("ray.tune.tune", lambda: tune_log.warning(resume)) == []
    assert logged("ray.tune.tune", lambda: tune_log.warning("Stop signal received")) == [
        "Stop signal received"]
    # Ray's own notice, emitted by Ray's own function: dropped as long as Ray words it so.
    assert logged(authentication_token_setup.logger.name,
                  authentication_token_setup._warn_token_auth_enabled) == []
    analysis = logging.getLogger("ray.tune.analysis.experiment_analysis")
    assert logged(analysis.name, lambda: analysis.warning("Failed to fetch metrics")) == []


def test_the_flags_default_to_the_search_options() -> None:
    """One set of defaults: every ``SearchOptions`` field but ``points`` (Python only) has its
    flag under its name, and the flags left out give ``SearchOptions()``."""
    from workers.search.cli import build_parser

    args = build_parser().parse_args(["--space", "x.yaml"])
    names = {f.name for f in dataclasses.fields(SearchOptions)} - {"points"}
    assert names <= set(vars(args))
    assert SearchOptions(**{name: getattr(args, name) for name in names}) == SearchOptions()
    flipped = build_parser().parse_args(["--space", "x.yaml", "--no-reuse-actors",
                                         "--no-checkpoints", "--quiet"])
    assert (flipped.reuse_actors, flipped.checkpoints, flipped.quiet) == (False, False, True)


def test_cli_errors_are_one_line_and_touch_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """In this process (``main`` is what ``python -m workers.search`` exits with; argparse's
    own checks exit 2 through ``SystemExit``)."""
    from workers.search.cli import main as search_main

    def search(*args: str) -> tuple[int, str]:
        try:
            code = search_main([*args, "--storage-path", str(tmp_path / "results")])
        except SystemExit as exit_:
            code = int(exit_.code or 0)
        return code, capsys.readouterr().err

    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 's.db'}"
    cases = [
        ([*SMOKE[:1], "nope.yaml", *SMOKE[2:]], "--space: search space 'nope.yaml'"),
        ([*SMOKE[:3], "sudoku", "--smoke-test"], "argument --task: invalid choice: 'sudoku'"),
        ([*SMOKE, "--resume"], "--resume: no study"),
        ([*SMOKE, "--storage", "mysql://u:hunter2@h/db"], "scheme 'mysql' is not supported"),
    ]
    for args, message in cases:
        code, err = search(*args, *(["--storage", url] if "--storage" not in args else []),
                           "--study", "e")
        assert code == 2 and message in err, err
        assert len(err.strip().splitlines()) == 1 and "hunter2" not in err
    assert not (tmp_path / "results").exists()
    study = optuna.create_study(study_name="taken", storage=url)
    study.enqueue_trial({"x": 1})
    code, err = search(*SMOKE, "--storage", url, "--study", "taken")
    assert code == 2 and "pass --resume" in err
    assert len(load(url, "taken").trials) == 1


def test_study_names_and_result_paths_are_checked_before_anything_is_created(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A study name is a directory name too; a bad one, or a --storage-path that cannot be
    written, is one line and exit 2 with no database, study or Ray directory created."""
    from workers.search.cli import main as search_main

    url = f"sqlite:///{tmp_path / 's.db'}"
    (tmp_path / "file").write_text("")
    huge = tmp_path / "huge.yaml"
    huge.write_text("name: huge\nbudget: 65536\ndepth: 2\nlayers:\n  - heads: [1]\n")
    laughs = tmp_path / "laughs.yaml"
    laughs.write_text("a: &a [x, x, x]\nb: &b [*a, *a, *a]\ndescription: *b\nbudget: 64\n")
    cases = [(["--space", str(huge)], "GiB to train, more than the"),
             (["--space", str(laughs)], "line 2: aliases (*name) are not accepted"),
             (["--budget", "1000000000000"], "must be an integer between 1 and 65536"),
             (["--study", "../escape"], "--study '../escape': must be 1 to 100 letters"),
             (["--study", "x" * 300], "... (302 characters): must be 1 to 100"),
             (["--study", ""], "--study '': must be"),
             (["--study", "ok", "--storage-path", str(tmp_path / "file" / "sub")],
              "is not a directory")]
    for argv, message in cases:
        if argv[0] == "--budget":
            with pytest.raises(SystemExit) as exit_:  # argparse's own check
                search_main([*SMOKE, "--storage", url, *argv])
            assert exit_.value.code == 2
        else:
            assert search_main([*SMOKE, "--storage", url, *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "huge.yaml", "laughs.yaml"]
    # With --data, the data is profiled into --storage-path: only after the names are checked.
    (tmp_path / "corpus.txt").write_text("some text to profile. " * 500)
    named = tmp_path / "named.yaml"
    named.write_text("name: my space\nbudget: 32\ndepth: 1\nlayers:\n  - heads: [2]\n")
    for argv, message in (
            (["--space", "aot_vs_standard", "--data", str(tmp_path / "corpus.txt"),
              "--study", "../bad"], "--study '../bad': must be"),
            (["--space", "aot_vs_standard", "--data", str(tmp_path / "corpus.txt"),
              "--storage-path", str(tmp_path / "file" / "sub")], "is not a directory"),
            (["--space", str(named), "--task", "modadd"],
             "(the default from space 'my space'; give --study)")):
        assert search_main([*argv, "--smoke-test", "--storage", url]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "corpus.txt", "file", "huge.yaml", "laughs.yaml", "named.yaml"]
    # The Python API names the fields the command shows as flags.
    from workers.errors import SearchError
    from workers.search.checks import check_study_name, check_writable_dir

    with pytest.raises(SearchError, match=r"^study '\.\./bad': must be"):
        check_study_name("../bad")
    with pytest.raises(SearchError, match=r"^storage_path .*: '.*' is not a directory"):
        check_writable_dir("storage_path", tmp_path / "file" / "sub")


def test_resume_of_a_finished_study_answers_before_ray_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
        ) -> None:
    import types
    from unittest import mock

    import workers.search
    from workers.search.cli import main as search_main

    started = mock.Mock(side_effect=RuntimeError("Ray would start"))
    stub = types.ModuleType("workers.search.tune")
    stub.session = started  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "workers.search.tune", stub)
    monkeypatch.setattr(workers.search, "tune", stub, raising=False)
    url = f"sqlite:///{tmp_path / 's.db'}"
    argv = [*SMOKE, "--storage", url, "--study", "done", "--trials", "1",
            "--storage-path", str(tmp_path / "results")]
    with pytest.raises(RuntimeError, match="Ray would start"):
        search_main(argv)  # the study is created, then Ray would start
    study = optuna.load_study(study_name="done", storage=url)
    arch = ArchConfig(d_model=32, layers=(LayerSpec("mhsa", (HeadGroup(2, 16),)),),
                      max_seq_len=8, vocab_size=16)
    add_record(study, arch, 0.5, steps_reached=40)
    started.reset_mock()
    assert search_main([*argv, "--resume"]) == 0
    assert "already has its 1 trials" in capsys.readouterr().err
    started.assert_not_called()


@pytest.mark.parametrize(("space", "task", "sampler"),
                         [("aot_vs_standard.yaml", "modadd", "tpe"),
                          ("allocator_neighbourhood.yaml", "ngram", "prior")])
def test_a_search_makes_one_plan_and_reads_its_space_once(
        space: str, task: str, sampler: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole driver in process, Tune answering at once: the allocator's plan is made once
    (the plan, its uniform plan and the baseline are the seeds, the prior's anchor, the
    placeholders' neighbourhood and the predictor's settings), the space file read and parsed
    once."""
    import contextlib
    import types

    import alloc.plan
    import search_spaces.files
    import workers.search
    import workers.search.seeding
    from workers.search.cli import main as search_main

    calls: dict[str, int] = {"make_plan": 0, "read_yaml": 0, "parse_space": 0}

    def counted(name: str, original: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return original(*args, **kwargs)
        return wrapper

    plan = counted("make_plan", alloc.plan.make_plan)
    monkeypatch.setattr(alloc.plan, "make_plan", plan)
    monkeypatch.setattr(workers.search.seeding, "make_plan", plan)
    for name in ("read_yaml", "parse_space"):
        monkeypatch.setattr(search_spaces.files, name,
                            counted(name, getattr(search_spaces.files, name)))
    ran: list[int] = []
    stub = types.ModuleType("workers.search.tune")
    stub.session = lambda address=None: contextlib.nullcontext()  # type: ignore[attr-defined]
    stub.TuneRun = lambda **kw: types.SimpleNamespace(**kw)  # type: ignore[attr-defined]
    stub.capacity = lambda cpus, gpus: 1  # type: ignore[attr-defined]
    stub.run_tuner = (  # type: ignore[attr-defined]
        lambda searcher, job, run, stop=None: ran.append(run.trials) or "completed")
    monkeypatch.setitem(sys.modules, "workers.search.tune", stub)
    monkeypatch.setattr(workers.search, "tune", stub, raising=False)
    url = f"sqlite:///{tmp_path / 's.db'}"
    assert search_main(["--space", space, "--task", task, "--smoke-test", "--sampler", sampler,
                        "--trials", "2", "--storage", url, "--study", "once", "--quiet",
                        "--storage-path", str(tmp_path / "results")]) == 0
    assert ran == [2]  # the driver went as far as running the trials
    assert calls == {"make_plan": 1, "read_yaml": 1, "parse_space": 1}


def test_a_grid_that_takes_nothing_from_the_plan_profiles_its_data_without_a_pilot(
        tmp_path: Path) -> None:
    """A grid's points are its trials: the data's pilot training (minutes on a real corpus)
    would plan nothing, so the data is profiled without it; a TPE search, whose first trials
    are the allocator's plan, still gets the pilot."""
    from userdata import DataSpec, TaskSpec
    from workers.search.request import prepare

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text to profile, then search on. " * 400)
    grid = tmp_path / "grid.yaml"
    grid.write_text("name: g\nbudget: 32\ndepth: 1\nsampler: grid\n"
                    "layers:\n  - heads: [1, 2]\n")
    for sampler, piloted in ((None, False), ("tpe", True)):
        out = tmp_path / f"ray-{sampler}"
        prepare(grid, TaskSpec(data=DataSpec(str(corpus)), size="smoke"), storage=f"sqlite:///{tmp_path}/s.db",
                study=f"g-{sampler}", smoke_test=True, pilot_steps=2,
                options=SearchOptions(storage_path=out, sampler=sampler, quiet=True))
        profile = yaml.safe_load((out / "profile-corpus.txt.yaml").read_text())
        assert ("pilot" in profile) == piloted, (sampler, sorted(profile))


def test_a_resumed_seeded_sampler_draws_new_points_and_the_same_resume_the_same() -> None:
    """A random search resumed with its seed must not draw its first trials again: the
    resumed sampler's seed comes from the seed and the trials already there."""
    from workers.search.study import session_seed

    def draws(seed: int, study: optuna.Study, n: int) -> list[float]:
        study.sampler = optuna.samplers.RandomSampler(seed=seed)
        out = []
        for _ in range(n):
            trial = study.ask()
            out.append(trial.suggest_float("x", 0.0, 1.0))
            study.tell(trial, out[-1])
        return out

    first = optuna.create_study()
    before = draws(session_seed(7, 0), first, 5)
    assert session_seed(7, 0) == 7  # a new study is seeded as asked
    resumed = draws(session_seed(7, len(first.trials)), first, 5)
    assert not set(resumed) & set(before)
    assert draws(7, optuna.create_study(), 5) == before  # what the old resume drew again
    again = optuna.create_study()
    draws(7, again, 5)
    assert draws(session_seed(7, len(again.trials)), again, 5) == resumed
