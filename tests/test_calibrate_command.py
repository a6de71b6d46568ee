"""``python -m workers.calibrate`` at smoke size (D = 32, 2 layers, 4 steps, 2 seeds, on this
process's Ray): a study is written, a run stopped short is continued by ``--resume`` without a
finished trial trained again, the plan is written once, at the end, and is what the fit and the
later layers' check chose (a check that must train gets its own study); bad input is one line
and exit 2 before any work."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import optuna
import pytest

from alloc import calibrate
from arch import ArchConfig, HeadGroup
from studies import engine, open_storage, query
from workers import calibration
from workers.calibrate import main

WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven",
         "wizards", "quietly", "judge", "boxing", "matches")


def corpus(tmp_path: Path) -> Path:
    rng = random.Random(0)
    path = tmp_path / "corpus.txt"
    path.write_text(" ".join(rng.choice(WORDS) for _ in range(6000)))
    return path


def argv(tmp_path: Path, *extra: str) -> list[str]:
    return ["--data", str(corpus(tmp_path)), "--budget", "32", "--layers", "2", "--out",
            str(tmp_path / "plan.yaml"), "--storage", url(tmp_path), "--storage-path",
            str(tmp_path / "ray"), "--smoke-test", "--steps", "4", "--seq-len", "32",
            "--format", "json", *extra]


def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 's.db'}"


def trials(tmp_path: Path, study: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=study, storage=url(tmp_path)).get_trials()


def writes(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every file the calibration writes, in order."""
    written: list[Path] = []
    write = calibration.write_atomic

    def counting(path: Path, text: str) -> None:
        written.append(Path(path))
        write(path, text)

    monkeypatch.setattr(calibration, "write_atomic", counting)
    monkeypatch.setattr(calibrate, "write_atomic", counting)  # the constants' writer
    return written


@pytest.mark.usefixtures("shared_ray")
def test_a_study_is_written_resumed_and_the_plan_written_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import workers.search as search

    out = tmp_path / "plan.yaml"
    run_search = search.run_search
    with monkeypatch.context() as patch:  # a first run that stops after 4 of its 10 trainings
        patch.setattr(search, "run_search",
                      lambda *a, **k: run_search(*a, **{**k, "trials": 4}))
        assert main(argv(tmp_path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "needs a finite loss on every seed" in err[-1] and not out.exists()
    first = {t.number: (t.datetime_start, t.value) for t in trials(tmp_path, "calibrate")}
    assert len(first) == 4

    written = writes(monkeypatch)
    assert main(argv(tmp_path, "--resume")) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert "profiling" not in captured.err  # the first run's profile: the same default plan
    done = trials(tmp_path, "calibrate")
    # 5 distinct models at D = 32 (heads of 64 and of 32 are one head, as uniform-1) x 2 seeds
    assert len(done) == 10 and all(t.state.name == "COMPLETE" for t in done)
    assert {t.number: (t.datetime_start, t.value) for t in done if t.number in first} == first
    assert written == [out.with_name("plan-constants.yaml"), out]  # once each, at the end
    plan = ArchConfig.from_yaml(out.read_text())
    assert plan.describe() == result["plan"] == result["calibrated_plan"]
    later = result["later_layers"]
    assert (later["verdict"] == "rule") == (later["plan_loss"] < later["twin_loss"])
    assert result["studies"] == ["calibrate"]  # the twin (2x16 everywhere) is uniform-2
    # the losses fitted are the study's means over the seeds, paired by train.seed
    _, points = query.seed_points(engine(open_storage(url(tmp_path), read_only=True)),
                                  "calibrate")
    means = {p.first.arch.describe(): p.value.mean for p in points if p.first.arch}
    assert all(set(p.values) == {1000, 1001} for p in points)
    assert result["losses"]["uniform-2"] == pytest.approx(means[later["twin"]])
    assert result["losses"]["plan"] == pytest.approx(means[result["default_plan"]])

    # A plan the fit changes, whose twin the first study has: only the plan trains, in the
    # check study; the first study's trainings are read, none repeated.
    recalibrate = calibration.recalibrate

    def narrower(default: Any, observations: Any) -> Any:
        made = recalibrate(default, observations)
        first_layer = made.plan.arch.layers[0]
        later_layer = dataclasses.replace(made.plan.arch.layers[1], heads=tuple(
            HeadGroup(g.count, 8, g.v_dim) for g in first_layer.heads))
        arch = dataclasses.replace(made.plan.arch, layers=(first_layer, later_layer))
        return dataclasses.replace(made, plan=dataclasses.replace(made.plan, arch=arch))

    monkeypatch.setattr(calibration, "recalibrate", narrower)
    written.clear()
    assert main(argv(tmp_path, "--resume")) == 0
    checked = json.loads(capsys.readouterr().out)
    assert len(trials(tmp_path, "calibrate")) == 10
    assert len(trials(tmp_path, "calibrate-check")) == 2  # the new plan at both seeds
    assert checked["studies"] == ["calibrate", "calibrate-check"]
    assert checked["calibrated_plan"].endswith("| mhsa 2x8/16 mlp4")
    kept = checked["later_layers"]["plan_loss"] < checked["later_layers"]["twin_loss"]
    assert checked["plan"] == (checked["calibrated_plan"] if kept
                               else checked["later_layers"]["twin"])
    assert ArchConfig.from_yaml(out.read_text()).describe() == checked["plan"]
    assert written == [out.with_name("plan-constants.yaml"), out]


def test_bad_input_is_one_line_and_exit_2_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = corpus(tmp_path)
    base = ["--data", str(data), "--budget", "32", "--layers", "2", "--out",
            str(tmp_path / "plan.yaml"), "--storage", url(tmp_path), "--storage-path",
            str(tmp_path / "ray")]

    def refused(*args: str) -> str:
        code = main([*base, *args])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        return err

    assert "--budget 36: must be a multiple of 8" in refused("--budget", "36")
    assert "--layers 1: must be in 2.." in refused("--layers", "1")
    assert "--seeds 0: must be in 1..20" in refused("--seeds", "0")
    assert "--data" in refused("--data", str(tmp_path / "missing.txt"))
    assert "--out" in refused("--out", str(tmp_path / "no" / "plan.yaml"))
    assert "--resume: no study 'calibrate' to continue" in refused("--resume")
    optuna.create_study(study_name="calibrate", storage=url(tmp_path))
    assert "--study 'calibrate': already exists; pass --resume" in refused()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "s.db"]
