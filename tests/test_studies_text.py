"""What ``python -m studies`` prints of what a database holds: a study name with control
characters is shown escaped, in its tables, its error lines and the commands it prints (which
still name the study); ``studies errors`` lists the failed trials with their errors, and a
search whose trials failed points at it."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from arch import ArchConfig, HeadGroup, LayerSpec
from common.errors import printable, shell_word
from studies import add_record, open_storage, set_study_attrs
from studies.cli import main

optuna.logging.set_verbosity(optuna.logging.WARNING)
HOSTILE = "bad\x1b[31m\x07\nname"  # turns a terminal red, rings it, breaks the line


def arch() -> ArchConfig:
    return ArchConfig(d_model=32, layers=(LayerSpec("mhsa", (HeadGroup(2, 16),)),),
                      max_seq_len=8, vocab_size=16)


def fail_trial(study: optuna.Study, error: str, status: str = "failed",
               steps: int | None = None) -> None:
    trial = study.ask()
    trial.set_user_attr("status", status)
    trial.set_user_attr("error", error)
    if steps is not None:
        trial.set_user_attr("steps_reached", steps)
    study.tell(trial, state=TrialState.FAIL)


def make_study(url: str, name: str, errors: list[str]) -> optuna.Study:
    study = optuna.create_study(storage=open_storage(url), study_name=name)
    set_study_attrs(study, task="ngram", metric="mse")
    add_record(study, arch(), 0.5, steps_reached=40)
    for error in errors:
        fail_trial(study, error, steps=10)
    return study


def assert_inert(text: str) -> None:
    """Nothing a terminal would act on: only printable characters and line ends."""
    assert all(c.isprintable() or c == "\n" for c in text), repr(text)


def test_a_name_with_control_characters_is_shown_escaped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    make_study(url, HOSTILE, ["RuntimeError: boom"])
    make_study(url, "plain", [])
    shown = printable(HOSTILE)
    assert shown == "bad\\x1b[31m\\x07\\nname"
    for argv, code in ((["list"], 0), (["best", "--study", HOSTILE], 0),
                       (["errors", "--study", HOSTILE], 0),
                       (["export", "--study", HOSTILE, "--out", str(tmp_path / "a.yaml")], 0),
                       (["best"], 2), (["best", "--study", HOSTILE + "x"], 2)):
        assert main([argv[0], "--storage", url, *argv[1:]]) == code, argv
        out, err = capsys.readouterr()
        assert_inert(out + err)
        if code == 2:  # one error line naming the studies, escaped
            assert err.count("\n") == 1 and shown in err, err
        elif argv[0] == "best":  # the export command names the study as the shell reads it
            line = next(x for x in out.splitlines() if x.startswith("export: "))
            assert f"--study {shell_word(HOSTILE)} --trial 0" in line
            word = line.split("--study ")[1].split(" --trial")[0]
            echoed = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True,
                                    text=True, check=True).stdout
            assert echoed == HOSTILE
        else:
            assert shown in out + err, (argv, out, err)


def test_errors_lists_each_failed_trial_with_its_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    traceback = "Traceback (most recent call last):\n  ...\nRuntimeError: injected"
    make_study(url, "f", ["CUDA out of memory", traceback])
    assert main(["errors", "--storage", url, "--study", "f"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "2 failed trial(s) of study f"
    assert lines[3].split() == ["1", "failed", "10", "CUDA", "out", "of", "memory"]
    assert lines[4].split(None, 3) == ["2", "failed", "10", printable(traceback)]
    assert main(["errors", "--storage", url, "--study", "f", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == [{"number": 1, "status": "failed", "steps_reached": 10,
                     "error": "CUDA out of memory"},
                    {"number": 2, "status": "failed", "steps_reached": 10, "error": traceback}]
    make_study(url, "ok", [])
    assert main(["errors", "--storage", url, "--study", "ok"]) == 0
    assert capsys.readouterr().out == "study ok: no failed trial\n"


def test_a_search_whose_trials_all_failed_points_at_their_errors(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workers.search.cli import outcome
    from workers.search.driver import SearchSummary

    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(storage=open_storage(url), study_name="all-failed")
    for n in range(3):
        fail_trial(study, f"RuntimeError: trial {n} diverged")
    summary = SearchSummary("all-failed", url, "completed", {"FAIL": 3}, [], 0)
    code, note = outcome(summary)
    assert code == 1 and note == (
        f"all 3 trials failed (their errors: python -m studies errors --storage {url} --study "
        "all-failed)")
    command = shlex.split(note.split("their errors: ")[1].rstrip(")"))
    assert command[:3] == ["python", "-m", "studies"] and main(command[3:]) == 0
    out = capsys.readouterr().out
    for n in range(3):
        assert f"    {n}  failed      -  RuntimeError: trial {n} diverged" in out.splitlines()
