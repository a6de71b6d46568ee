"""alloc.calibrate: constants fitted to a study's losses, and alloc.solve --constants."""

from __future__ import annotations

import dataclasses
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
from alloc.errors import CalibrationError, ConstantsError
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


# --- the width order m (docs/theory.md §2.3, §6) -------------------------------------------------

# Losses generated where one wide head wins (m > n) or many heads do (m = 0 < n).
WIDE = Constants(c_proj=0.3, c_head=2.5, order=1.5, width_order=3.0)
NARROW = TRUE
WIDTHS = (64, 32)  # a second width separates n from m


def layer(heads: int, width: int = 64) -> LayerSpec:
    return LayerSpec("mhsa", (HeadGroup(heads, width // heads),), mlp_ratio=4.0)


def noisy(constants: Constants, layers: list[LayerSpec], seed: int,
          noise: float = 0.02) -> list[Observation]:
    """Observations whose log-losses are the bound's plus Gaussian noise of SD ``noise``."""
    s, rng = with_constants(SETTINGS, constants), np.random.default_rng(seed)
    return [Observation(x.heads_str, x, 0.01 * predicted_error(s, x) * float(
        np.exp(rng.normal(0, noise))), i, 1) for i, x in enumerate(layers)]


def uniform_heads(constants: Constants) -> tuple[int, int]:
    plan = make_plan(with_constants(SETTINGS, constants))
    return plan.uniform.count, plan.uniform.dim


def test_width_design_says_what_the_layers_identify() -> None:
    assert calibrate.width_design([layer(h) for h in HEADS]) == "difference"
    assert calibrate.width_design([layer(h, w) for w in WIDTHS for h in (1, 2, 4, 8)]) == "both"
    # Four observations cannot fit four constants and the scale: m held.
    assert calibrate.width_design([layer(1), layer(4), layer(1, 32), layer(8, 32)]) == "order"
    assert calibrate.width_design([layer(4, w) for w in (16, 32, 64)]) == "order"
    # Width and head count growing together: a line other than one width's, m held.
    assert calibrate.width_design([layer(1, 16), layer(2, 32), layer(4, 64)]) == "order"


def test_the_generating_constants_put_the_plan_where_the_test_says() -> None:
    # The premise of the two tests below: under WIDE one head of the full width is the bound's
    # best uniform layer, under NARROW (m = 0) several narrower heads are.
    assert uniform_heads(WIDE) == (1, 64)
    assert uniform_heads(NARROW)[0] > 1


@pytest.mark.parametrize("seed", range(3))
def test_one_width_recovers_m_minus_n_and_the_wide_head(seed: int) -> None:
    raw, cal = fit(SETTINGS, noisy(WIDE, [layer(h) for h in HEADS], seed))
    c = cal.constants
    assert cal.design == "difference"
    assert c.width_order > c.order  # fewer, wider heads win
    assert c.width_order - c.order == pytest.approx(WIDE.width_order - WIDE.order, abs=0.3)
    assert c.order == 1.0  # the smallest m that fits: n at its floor
    assert cal.r2 > 0.95 and raw.r2 < cal.r2
    assert uniform_heads(c) == (1, 64)


def two_widths() -> list[LayerSpec]:
    return [layer(h, w) for w in WIDTHS for h in HEADS if h <= w // SETTINGS.align]


def test_two_widths_recover_n_and_m_apart() -> None:
    _, cal = fit(SETTINGS, noisy(WIDE, two_widths(), 0))
    assert cal.design == "both"
    assert cal.constants.order == pytest.approx(WIDE.order, abs=0.3)
    assert cal.constants.width_order == pytest.approx(WIDE.width_order, abs=0.3)
    assert uniform_heads(cal.constants) == (1, 64)


def many_heads(constants: Constants) -> bool:
    """The bound's uniform layer has several heads, none wider than a token."""
    count, dim = uniform_heads(constants)
    return count > 1 and dim <= SETTINGS.input_dim


@pytest.mark.parametrize("seed", range(3))
def test_when_many_heads_win_one_width_keeps_them(seed: int) -> None:
    _, one = fit(SETTINGS, noisy(NARROW, [layer(h) for h in HEADS], seed))
    assert one.constants.width_order == 0.0  # n - m >= 1: no width order needed
    assert one.constants.order > 1.0
    assert many_heads(one.constants)


def test_when_many_heads_win_two_widths_keep_them() -> None:
    _, both = fit(SETTINGS, noisy(NARROW, two_widths(), 0))
    assert both.design == "both"
    assert both.constants.width_order == pytest.approx(0.0, abs=0.3)
    assert both.constants.width_order < both.constants.order
    assert many_heads(both.constants)


def test_constants_without_a_width_order_read_as_zero(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("c_proj: 1\nc_head: 2\norder: 3\n")  # a file written before m existed
    assert read_constants(path) == Constants(1.0, 2.0, 3.0, 0.0)
    from alloc.constants import to_yaml

    path.write_text(to_yaml(WIDE))
    assert read_constants(path) == WIDE
    path.write_text("c_proj: 1\nc_head: 2\norder: 3\nwidth_order: -1\n")
    with pytest.raises(ConstantsError, match="width_order = -1: must be a finite"):
        read_constants(path)


def test_solve_width_order_flag_gives_one_wide_head(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--budget", "256", "--layers", "1", "--input-dim", "64", "--kernel", "ngram:4",
            "--seq-len", "64", "--uniform", "--mlp-ratio", "2", "--format", "json"]
    assert solve_main(base) == 0
    assert json.loads(capsys.readouterr().out)["layers"][0]["heads"] == [
        {"count": 4, "qk_dim": 64, "v_dim": 64}]
    assert solve_main([*base, "--order", "1", "--width-order", "1.5"]) == 0
    assert json.loads(capsys.readouterr().out)["layers"][0]["heads"] == [
        {"count": 1, "qk_dim": 256, "v_dim": 256}]


# --- several tasks at once: shared constants, a scale each ------------------------------------


OTHER = PlanSettings(budget=64, layers=1, input_dim=16, kernel="exp:0.3", seq_len=16, align=4)


def group(name: str, settings: PlanSettings, constants: Constants,
          scale: float) -> calibrate.Group:
    """The bound's losses of ``settings`` under ``constants``, at ``scale``."""
    s = with_constants(settings, constants)
    return calibrate.Group(name, settings, tuple(
        Observation(f"{h}x{64 // h}", arch(h).layers[0],
                    scale * predicted_error(s, arch(h).layers[0]), i, 1)
        for i, h in enumerate(HEADS)))


def test_one_group_is_the_plain_fit() -> None:
    obs = observations(synthetic(TRUE))
    plain = fit(SETTINGS, obs)
    grouped = calibrate.fit_groups([calibrate.Group("", SETTINGS, tuple(obs))])
    assert grouped == plain and not plain[1].scales


def test_groups_share_the_constants_and_keep_their_own_scale_and_inputs() -> None:
    groups = [group("a", SETTINGS, WIDE, 0.01), group("b", OTHER, WIDE, 3.0)]
    raw, cal = calibrate.fit_groups(groups)
    # At one width only m - n is identified (and n moves the alpha term slightly): the fit
    # takes n = 1, so the losses are matched closely, not exactly.
    assert cal.design == "difference" and cal.r2 > 0.99 and cal.spearman == pytest.approx(1)
    assert cal.constants.width_order - cal.constants.order == pytest.approx(
        WIDE.width_order - WIDE.order, abs=0.3)
    expected = [o.loss for g in groups for o in g.observations]
    np.testing.assert_allclose(cal.predicted, expected, rtol=0.1)
    assert cal.scales[0] == pytest.approx(0.01, rel=0.1)
    assert cal.scales[-1] == pytest.approx(3.0, rel=0.1)
    assert raw.r2 < cal.r2
    # one scale for both would not fit: the groups' losses differ by a factor of 300
    _, pooled = fit(SETTINGS, [o for g in groups for o in g.observations])
    assert pooled.r2 < 0.9


def test_groups_need_three_constants_and_a_scale_each() -> None:
    g = group("a", SETTINGS, TRUE, 0.01)
    short = calibrate.Group("b", OTHER, g.observations[:1])
    with pytest.raises(CalibrationError, match="at least 5 architectures"):
        calibrate.fit_groups([calibrate.Group("a", SETTINGS, g.observations[:3]), short])
    with pytest.raises(CalibrationError, match="at least 3 architectures"):
        calibrate.fit_groups([])


def test_a_bound_that_prices_every_arm_alike_explains_nothing() -> None:
    # an extraction constant so large that every arm truncates every offset: one bound for all,
    # which explains none of the losses' spread (R² exactly 0, not a rounding error above it:
    # heldout --calibrate keeps the default plan only where R² <= 0)
    obs = tuple(observations([0.3, 0.2, 0.25, 0.4, 0.35]))
    flat = Constants(c_proj=1.0, c_head=1e9, order=1.0)
    assert np.ptp(calibrate.bounds(SETTINGS, obs, flat)) == 0
    scored = calibrate._score([calibrate.Group("", SETTINGS, obs)], flat)
    assert scored.r2 == 0.0 and scored.spearman == 0.0


def test_a_plan_recalibrated_on_its_rules_means_over_seeds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``mean_observations``: one observation per distinct model of the plan and the rules (a
    model two rules share counts once), its mean over the seeds, refused where a seed has no
    loss; ``recalibrate``: the plan made again from the fit, or the default kept where the
    fit explains nothing (R² <= 0)."""
    from alloc import PLAN, recalibrate, rule_archs, twin_arch
    from alloc.calibrate import mean_observations

    default = make_plan(PlanSettings(**{**asdict(SETTINGS), "layers": 2}))
    arms = rule_archs(default.arch)
    assert next(iter(arms)) == PLAN and arms["head-dim-64"] == arms["uniform-1"]  # one head
    twin = twin_arch(default.arch)
    assert all(layer.heads == default.arch.layers[0].heads for layer in twin.layers)
    s = with_constants(default.settings, TRUE)
    losses = {a.arch_id: {seed: 0.01 * predicted_error(s, a.layers[0]) * (1 + 0.01 * seed)
                          for seed in (7, 8)} for a in arms.values()}
    observed = mean_observations(arms, losses, (7, 8))
    assert len(observed) == len({a.arch_id for a in arms.values()}) == 5  # and 2x32 twice
    plan_loss = observed[0].loss
    assert plan_loss == pytest.approx(sum(losses[default.arch.arch_id].values()) / 2)
    with pytest.raises(CalibrationError, match="needs a finite loss on every seed"):
        mean_observations(arms, losses, (7, 8, 9))
    made = recalibrate(default, observed)
    assert made.informative and made.plan.settings.c_head == made.fitted.constants.c_head
    real = calibrate.fit
    monkeypatch.setattr(calibrate, "fit", lambda *a: (lambda raw, fitted: (
        raw, dataclasses.replace(fitted, r2=-0.01)))(*real(*a)))
    kept = recalibrate(default, observed)  # a fit no better than the losses' mean
    assert not kept.informative and kept.plan is default
