"""alloc.calibrate: constants fitted to a study's losses, and alloc.solve --constants."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml

from alloc import calibrate
from alloc.calibrate import Observation, fit, with_constants
from alloc.constants import Constants, read_constants
from alloc.plan import make_plan, predicted_error
from alloc.settings import PlanSettings
from alloc.solve import main as solve_main
from arch import ArchConfig, HeadGroup, LayerSpec
from studies import add_record, open_storage, set_study_attrs

optuna.logging.set_verbosity(optuna.logging.WARNING)
SETTINGS = PlanSettings(budget=64, layers=1, input_dim=16, kernel="ngram:4", seq_len=16, align=4)
TRUE = Constants(c_proj=0.3, c_head=2.5, order=1.5)
HEADS = (1, 2, 4, 8, 16)


def arch(heads: int) -> ArchConfig:
    layer = LayerSpec("mhsa", (HeadGroup(heads, 64 // heads),), mlp_ratio=0)
    return ArchConfig(d_model=64, layers=(layer,), max_seq_len=16, input_dim=16, output_dim=16)


def synthetic(constants: Constants, scale: float = 0.01) -> list[float]:
    s = with_constants(SETTINGS, constants)
    return [scale * predicted_error(s, arch(h).layers[0]) for h in HEADS]


def observations(losses: list[float]) -> list[Observation]:
    return [Observation(f"{h}x{64 // h}", arch(h).layers[0], y, i, 1)
            for i, (h, y) in enumerate(zip(HEADS, losses))]


def make_study(url: str, name: str, losses: list[float], direction: str = "minimize",
               repeats: int = 2) -> None:
    study = optuna.create_study(study_name=name, storage=open_storage(url), direction=direction)
    set_study_attrs(study, task="ngram", metric="mse", alloc_inputs=asdict(SETTINGS))
    for h, y in zip(HEADS, losses):
        for k in range(repeats):  # the architecture's other trials are worse: best-of keeps y
            add_record(study, arch(h), y * (1 + k), steps_reached=100)


def test_fit_recovers_the_constants_that_generated_the_losses() -> None:
    raw, cal = fit(SETTINGS, observations(synthetic(TRUE)))
    assert cal.r2 > 0.999999 and cal.spearman == pytest.approx(1.0)
    np.testing.assert_allclose(cal.predicted, synthetic(TRUE), rtol=1e-5)
    assert cal.scale == pytest.approx(0.01, rel=1e-4)
    assert raw.r2 < 0.5  # the default constants do not explain these losses


@pytest.mark.parametrize("seed", range(5))
def test_calibrated_fit_is_never_worse_than_the_raw_one(seed: int) -> None:
    rng = np.random.default_rng(seed)
    losses = list(rng.uniform(0.05, 2.0, size=len(HEADS)))
    raw, cal = fit(SETTINGS, observations(losses))
    assert cal.r2 >= raw.r2 - 1e-12
    assert cal.constants.c_proj > 0 and cal.constants.c_head > 0
    assert calibrate.ORDER_RANGE[0] <= cal.constants.order <= calibrate.ORDER_RANGE[1]


def test_fit_needs_four_architectures() -> None:
    with pytest.raises(calibrate.CalibrationError, match="at least 4 architectures"):
        fit(SETTINGS, observations(synthetic(TRUE))[:3])


def test_study_gives_best_loss_per_architecture(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    losses = synthetic(TRUE)
    make_study(url, "syn", losses)
    settings, obs = calibrate.observations_from_study(url, "syn")
    assert settings == SETTINGS
    assert [o.loss for o in obs] == pytest.approx(losses)
    assert all(o.trials == 2 for o in obs)


def test_cli_writes_constants_that_solve_accepts(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    make_study(url, "syn", synthetic(TRUE))
    out = tmp_path / "constants.yaml"
    assert calibrate.main(["--storage", url, "--study", "syn", "--out", str(out), "--plot",
                           str(tmp_path / "fit.png"), "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["calibrated"]["r2"] > 0.9999
    assert (tmp_path / "fit.png").stat().st_size > 0
    fitted = read_constants(out)
    assert fitted.c_proj == pytest.approx(TRUE.c_proj, rel=1e-3)
    # The re-solved allocation is the plan under the fitted constants.
    plan = make_plan(with_constants(SETTINGS, fitted))
    assert rep["allocation"]["calibrated"]["extract_layer"] == plan.arch.layers[0].heads_str
    base = ["--budget", "64", "--layers", "1", "--input-dim", "16", "--kernel", "ngram:4",
            "--seq-len", "16", "--align", "4", "--format", "json"]
    assert solve_main([*base, "--constants", str(out)]) == 0
    from_file = json.loads(capsys.readouterr().out)
    assert solve_main([*base, "--c-proj", str(fitted.c_proj), "--c-head", str(fitted.c_head),
                       "--order", str(fitted.order)]) == 0
    assert from_file == json.loads(capsys.readouterr().out)
    assert solve_main([*base, "--constants", str(out), "--order", "3"]) == 0  # the flag wins
    assert json.loads(capsys.readouterr().out)["inputs"]["order"] == 3


@pytest.mark.parametrize(("content", "message"), [
    ("c_proj: 1\nc_head: 1\n", "missing key 'order'"),
    ("c_proj: 1\nc_head: 1\norder: 0.5\n", "order = 0.5: must be a finite number >= 1"),
    ("c_proj: -1\nc_head: 1\norder: 2\n", "c_proj = -1: must be a finite number > 0"),
    ("c_proj: 1\nc_head: 1\norder: 2\nalpha: 3\n", "unknown key 'alpha'"),
    ("[1, 2]\n", "expected a mapping"),
])
def test_solve_rejects_bad_constants_files(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           content: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(content)
    out = tmp_path / "arch.yaml"
    assert solve_main(["--constants", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "--constants" in err
    assert not out.exists()


@pytest.mark.parametrize(("case", "message"), [
    ("missing", "no such study"),
    ("maximize", "maximised"),
    ("few", "at least 4 architectures"),
])
def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str,
                                 message: str) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    losses = synthetic(TRUE)
    if case == "maximize":
        make_study(url, "syn", losses, direction="maximize")
    elif case == "few":
        make_study(url, "syn", losses[:3])
    else:
        make_study(url, "other", losses)
    out = tmp_path / "c.yaml"
    assert calibrate.main(["--storage", url, "--study", "syn", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not out.exists()


def test_constants_round_trip(tmp_path: Path) -> None:
    from alloc.constants import to_yaml

    path = tmp_path / "c.yaml"
    path.write_text(to_yaml(TRUE, 0.5, {"study": "x"}))
    assert read_constants(path) == TRUE
    assert yaml.safe_load(path.read_text())["scale"] == 0.5
