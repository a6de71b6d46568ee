"""The held-out protocol: the corpus registry (userdata.corpora: roles, determinism, sizes), the
fixed rules (alloc.heuristics), the verdicts (experiments.heldout_report: a plan built
to be better, worse or within the noise; development and held-out never pooled), and the
experiment end to end at smoke size (experiments.heldout), resumed from its ledger."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from alloc import PlanSettings, calibrate, read_allocator_inputs
from alloc.errors import PlanError
from alloc.heuristics import HEURISTICS, heuristic_arch
from alloc.profiling.patterns import later_head_count
from arch import ArchConfig, HeadGroup, LayerSpec
from common.errors import UsageError
from common.files import write_csv
from experiments import heldout, heldout_sets
from experiments.heldout_report import (
    BEST_EACH,
    PLAN,
    CorpusVerdict,
    against_picks,
    against_rules,
    holm_by_corpus,
    judge,
    over_corpora,
    sets,
)
from userdata import corpora as registry
from userdata.corpora import DEVELOPMENT, HELD_OUT, ProtocolError

# --- the registry --------------------------------------------------------------------------------


def test_the_registry_declares_three_development_and_five_held_out_corpora_of_other_kinds(
        ) -> None:
    dev, held = registry.names(DEVELOPMENT), registry.names(HELD_OUT)
    assert dev == ("code", "docs", "records")
    assert len(held) >= 5 and not set(dev) & set(held)
    assert not {registry.CORPORA[n].kind for n in dev} & {registry.CORPORA[n].kind for n in held}
    with pytest.raises(UsageError, match="'nope': not a registered corpus; choose from code"):
        registry.corpus("nope")


@pytest.mark.parametrize("name", registry.names(HELD_OUT))
def test_a_held_out_corpus_is_present_and_the_same_bytes_twice(tmp_path: Path,
                                                               name: str) -> None:
    write = registry.corpus(name).write

    def digest(folder: Path) -> tuple[int, str]:
        data = b"".join(p.read_bytes() for p in sorted(write(folder, 0.05).rglob("*.txt")))
        return len(data), hashlib.sha256(data).hexdigest()

    size, first = digest(tmp_path / "a")
    assert size == pytest.approx(50_000, abs=100)  # cut at the size asked for: it holds more
    assert digest(tmp_path / "b") == (size, first)


# --- the fixed rules -----------------------------------------------------------------------------


def template(width: int) -> ArchConfig:
    layer = LayerSpec("mhsa", (HeadGroup(3, 8, width // 3 if width % 3 == 0 else 8),), 2.0,
                      "extract")
    return ArchConfig(d_model=width, layers=(layer, LayerSpec("mhsa", (HeadGroup(2, 8),), 2.0)),
                      max_seq_len=64, vocab_size=256)


@pytest.mark.parametrize(("width", "name", "heads"), [
    (64, "head-dim-64", "1x64"), (256, "head-dim-64", "4x64"), (32, "head-dim-64", "1x32"),
    (64, "head-dim-32", "2x32"), (512, "head-dim-32", "16x32"), (64, "uniform-8", "8x8"),
    (64, "uniform-1", "1x64"),
])
def test_a_rule_gives_every_layer_its_heads_and_keeps_the_rest(width: int, name: str,
                                                              heads: str) -> None:
    arch = heuristic_arch(template(width), name)
    assert [layer.heads_str for layer in arch.layers] == [heads, heads]
    assert [layer.mlp_ratio for layer in arch.layers] == [2.0, 2.0]
    assert [layer.role for layer in arch.layers] == ["extract", "process"]
    assert all(sum(g.count * g.v_dim for g in layer.heads) == width for layer in arch.layers)


def test_a_rule_that_cannot_divide_the_width_or_is_unknown_is_refused() -> None:
    with pytest.raises(PlanError, match="8 heads do not divide the width 12"):
        heuristic_arch(template(12), "uniform-8")
    with pytest.raises(PlanError, match="'uniform-3': not a registered rule"):
        heuristic_arch(template(64), "uniform-3")
    assert {"head-dim-64", "head-dim-32", "uniform-1", "uniform-8"} <= set(HEURISTICS)


# --- the verdicts --------------------------------------------------------------------------------


ARCHS = {PLAN: "p", "uniform-1": "u1", "uniform-2": "u2"}
SHARED = (0.0, 0.03, -0.02)  # a seed effect every model shares
BEST = 2.0 + sum(SHARED) / 3  # uniform-2's mean


def losses(plan_offset: float, noise: tuple[float, ...]) -> dict[str, dict[int, float]]:
    """Three seeds that move every model together (a shared seed effect), uniform-2 the best
    rule, the plan ``plan_offset`` above it plus ``noise`` per seed."""
    return {"uniform-1": {s: 2.10 + SHARED[s] for s in range(3)},
            "uniform-2": {s: 2.00 + SHARED[s] for s in range(3)},
            PLAN: {s: 2.00 + plan_offset + SHARED[s] + noise[s] for s in range(3)}}


def verdict(plan_offset: float, noise: tuple[float, ...] = (0.0, 0.001, -0.001),
            role: str = HELD_OUT, name: str = "c") -> CorpusVerdict:
    return judge(name, role, "text", 1.0, losses(plan_offset, noise), ARCHS,  # type: ignore[arg-type]
                 {})[0]


def test_a_plan_worse_on_every_seed_is_worse_better_is_better_noise_is_inconclusive() -> None:
    worse = verdict(0.03)
    assert worse.best == "uniform-2" and worse.verdict == "worse"
    assert worse.p_worse is not None and worse.p_worse < 0.05
    assert worse.difference == pytest.approx(0.03) and worse.relative == pytest.approx(0.03 / BEST)
    assert not worse.within_margin  # 1.5% above the best: not within 1%
    better = verdict(-0.03)
    assert better.verdict == "better" and better.high < 0
    unclear = verdict(0.0, (0.02, -0.03, 0.015))
    assert unclear.verdict == "inconclusive" and unclear.low < 0 < unclear.high
    # the shared seed effect (SD 0.025) is in every model's loss, not in the differences
    assert unclear.seed_sd > 0.02 and verdict(0.03).difference_sd < 0.002


def test_a_seed_on_which_a_model_diverged_is_left_out_of_every_model() -> None:
    by = losses(0.03, (0.0, 0.001, -0.001))
    by["uniform-1"][2] = math.nan
    v, rows = judge("c", HELD_OUT, "text", 1.0, by, ARCHS, {})
    assert v.seeds == 2 and all(r["seeds"] == 2 for r in rows)


def test_the_twin_differs_from_the_plan_in_the_later_layers_only() -> None:
    def arch(first: str, later: str) -> ArchConfig:
        def layer(heads: str) -> LayerSpec:
            count, dim = map(int, heads.split("x"))
            return LayerSpec("mhsa", (HeadGroup(count, dim),), 2.0)
        return ArchConfig(d_model=64, layers=(layer(first), layer(later)), max_seq_len=64,
                          vocab_size=256)

    rules = {name: heuristic_arch(arch("4x16", "4x16"), name) for name in HEURISTICS}
    assert heldout.twin_of({PLAN: arch("4x16", "2x32"), **rules}) == "uniform-4"
    assert heldout.twin_of({PLAN: arch("1x64", "2x32"), **rules}) == "head-dim-64"  # the first
    assert heldout.twin_of({PLAN: arch("4x16", "4x16"), **rules}) == ""  # the rule itself
    # the plan against its twin, paired seed by seed (uniform-1, 0.10 - 0.001 x seed above it)
    v, _ = judge("c", HELD_OUT, "text", 1.0, losses(0.0, (0.0, 0.001, 0.002)), ARCHS, {},
                 twin="uniform-1")
    assert v.twin == "uniform-1" and v.twin_difference == pytest.approx(-0.099)
    assert v.twin_high is not None and v.twin_high < 0
    assert verdict(0.0).twin == "" and verdict(0.0).twin_difference is None


def test_the_plan_against_the_picks_summarises_one_set_alone() -> None:
    rows = [{"role": HELD_OUT, "plan_minus_pick_relative": x} for x in (-0.02, -0.021, -0.019)]
    rows.append({"role": DEVELOPMENT, "plan_minus_pick_relative": 0.5})
    line = against_picks(rows, HELD_OUT)
    assert line.startswith("over the 3 held-out corpora: plan - pick = -2.00% [")
    assert line.endswith("better")  # an interval below 0 over these three
    assert against_picks(rows, DEVELOPMENT) == ""  # one corpus: no interval over corpora


def test_the_held_out_verdict_refuses_a_development_corpus() -> None:
    held = [verdict(0.01, name=f"h{k}") for k in range(3)]
    with pytest.raises(ProtocolError, match="'d' is a development corpus, in the held-out set"):
        over_corpora([*held, verdict(-0.5, role=DEVELOPMENT, name="d")], HELD_OUT)
    with pytest.raises(ProtocolError, match="'h0' is a held-out corpus, in the development"):
        over_corpora(held[:1], DEVELOPMENT)


def test_a_set_counts_worse_corpora_as_one_family_too() -> None:
    # one corpus a little worse (p ~0.04 alone), one clearly (p ~0.0002), one level
    held = [verdict(0.002, name="h0"), verdict(0.0, name="h1"), verdict(0.03, name="h2")]
    assert 0.05 / 3 < held[0].p_worse < 0.05  # type: ignore[operator]
    summary = sets(held)[HELD_OUT]
    assert summary is not None and (summary.worse, summary.worse_holm) == (2, 1)
    # h2 is the smallest (times 3), h0 the next (times 2)
    assert holm_by_corpus(held)["h0"] == pytest.approx(2 * held[0].p_worse)  # type: ignore[operator]
    _, rows = judged((0.002, 0.0, 0.03))
    best = {r.rule: r for r in against_rules(rows, HELD_OUT)}[BEST_EACH]
    assert (best.worse, best.worse_holm) == (2, 1)


def test_development_and_held_out_are_summarised_apart() -> None:
    held = [verdict(0.01 * k, name=f"h{k}") for k in range(3)]
    dev = [verdict(-0.5, role=DEVELOPMENT, name="d")]  # a plan far better where it was tuned
    alone, mixed = sets(held), sets([dev[0], *held])
    assert alone[DEVELOPMENT] is None and mixed[HELD_OUT] == alone[HELD_OUT]
    summary = mixed[HELD_OUT]
    assert summary is not None and summary.corpora == 3 and summary.worse == 2
    assert summary.relative == pytest.approx(0.01 / BEST)  # the mean of 0, 0.01 and 0.02 above
    development = mixed[DEVELOPMENT]
    assert development is not None and development.relative == pytest.approx(-0.5 / BEST)


def judged(offsets: tuple[float, ...], role: str = HELD_OUT, prefix: str = "h"
           ) -> tuple[list[CorpusVerdict], list[dict[str, Any]]]:
    """One corpus per offset (the plan that far above uniform-2), its verdict and model rows."""
    verdicts, rows = [], []
    for k, offset in enumerate(offsets):
        v, table = judge(f"{prefix}{k}", role, "text", 1.0,  # type: ignore[arg-type]
                         losses(offset, (0.0, 0.001, -0.001)), ARCHS, {})
        verdicts.append(v)
        rows += table
    return verdicts, rows


def test_the_plan_against_one_rule_on_every_corpus_is_the_mean_of_its_relative_differences(
        ) -> None:
    offsets = (-0.02, 0.0, 0.01)
    verdicts, rows = judged(offsets)
    _, development = judged((-0.5,), DEVELOPMENT, "d")  # never in the held-out rows
    rules = {r.rule: r for r in against_rules([*development, *rows], HELD_OUT)}
    assert list(rules) == ["uniform-1", "uniform-2", BEST_EACH]
    assert all(r.corpora == 3 for r in rules.values())
    # brute force: uniform-1 is 2.10 + the shared seed effect; the plan 2.00 + offset + it
    one = [sum((2.0 + o + SHARED[s] + n) - (2.10 + SHARED[s])
               for s, n in enumerate((0.0, 0.001, -0.001))) / 3 / (2.10 + sum(SHARED) / 3)
           for o in offsets]
    assert rules["uniform-1"].relative == pytest.approx(sum(one) / 3)
    assert rules["uniform-1"].verdict == "better" and rules["uniform-1"].better == 3
    assert rules["uniform-1"].arch == "u1" and rules[BEST_EACH].arch == "u2"  # one on each
    # the per-corpus best (uniform-2 everywhere here) is the set's headline
    assert rules[BEST_EACH].relative == pytest.approx(over_corpora(verdicts, HELD_OUT).relative)
    assert rules[BEST_EACH].worse == sum(v.verdict == "worse" for v in verdicts) == 1
    assert against_rules(development, DEVELOPMENT) == []  # one corpus: no interval


def test_runs_of_several_folders_pool_into_one_set_and_a_corpus_counts_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, first = judged((-0.02, 0.0))
    _, second = judged((0.01,), prefix="g")
    stem = "heldout-steps9"
    for folder, rows in (("a", first), ("b", second)):
        (tmp_path / folder).mkdir()
        write_csv(tmp_path / folder / f"{stem}.csv", rows)
    folders = [str(tmp_path / "a"), str(tmp_path / "b")]
    assert heldout_sets.main(["--stem", stem, "--format", "json", *folders]) == 0
    pooled = json.loads(capsys.readouterr().out)
    expected = [dataclasses.asdict(r) for r in against_rules([*first, *second], HELD_OUT)]
    assert [r["rule"] for r in pooled["rules"]] == [r["rule"] for r in expected]
    for got, want in zip(pooled["rules"], expected):  # read back from CSV text: the same sums
        assert got["relative"] == pytest.approx(want["relative"])
        assert (got["worse"], got["better"], got["corpora"]) == (
            want["worse"], want["better"], 3)
    assert pooled["corpora"][HELD_OUT] == ["g0", "h0", "h1"]
    # the same folder twice would count its corpora twice; a folder without the run: refused
    write_csv(tmp_path / "a" / "heldout_runs.csv", [{"corpus": "h0", "seed": 0}])
    for argv, rule in ((["--stem", stem, folders[0], folders[0]], "'h0' is also in"),
                       (["--stem", "heldout", folders[0]], "holds no heldout.csv"),
                       (["--stem", "heldout_runs", folders[0]], "not a heldout models' table")):
        assert heldout_sets.main(argv) == 2
        err = capsys.readouterr().err
        assert rule in err and err.count("\n") == 1 and "Traceback" not in err


# --- the experiment ------------------------------------------------------------------------------


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, Any]:
    code = heldout.main(["--smoke-test", "--quiet", "--format", "json",
                         "--out", str(tmp_path / "out"), *flags])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return dict(json.loads(captured.out))


def test_smoke_run_judges_each_set_apart_and_a_rerun_trains_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "mine.txt"
    mine.write_text("the quick brown fox jumps over the lazy dog; " * 400)
    result = run(tmp_path, capsys, "--corpus", "docs", "--data", str(mine))
    roles = {c["corpus"]: c["role"] for c in result["corpora"]}
    assert roles == {"docs": DEVELOPMENT, "mine": HELD_OUT}  # your data is held-out
    assert {role for role, s in result["sets"].items() if s} == {DEVELOPMENT, HELD_OUT}
    for c in result["corpora"]:
        assert c["seeds"] == 2 and c["best"] in HEURISTICS and c["verdict"] in (
            "worse", "better", "inconclusive")
        models = {m["model"] for m in result["models"] if m["corpus"] == c["corpus"]}
        assert models == {PLAN, *HEURISTICS}
    out = tmp_path / "out"
    for name in ("heldout.csv", "heldout_corpora.csv", "heldout_sets.csv", "heldout_runs.csv",
                 "heldout.txt"):
        assert (out / name).stat().st_size > 0
    # another length of training and of pilot: their own trainings, profile and tables, the
    # default run's untouched
    table = (out / "heldout.txt").read_text()
    longer = run(tmp_path, capsys, "--corpus", "docs", "--steps", "6", "--pilot-steps", "5")
    assert longer["stem"] == "heldout-steps6-pilot5" and longer["recipe"]["steps"] == 6
    assert (out / "heldout.txt").read_text() == table
    assert [p.name for p in (out / "docs").glob("profile-*pilot5.yaml")]
    given = run(tmp_path, capsys, "--corpus", "docs", "--steps", str(heldout.SMOKE.steps),
                "--no-train")  # the default length, given: the default's tables, one name
    assert given["stem"] == "heldout" and given["corpora"] == result["corpora"][:1]
    with (out / "heldout-steps6-pilot5_runs.csv").open(newline="") as handle:
        assert {r["steps"] for r in csv.DictReader(handle)} == {"6"}
    ledger = (out / "docs" / "runs.csv").read_text()

    def refuse(*args: object) -> None:
        raise AssertionError("a re-run trained a model its ledger holds")

    monkeypatch.setattr(heldout, "train_one", refuse)
    again = run(tmp_path, capsys, "--corpus", "docs", "--data", str(mine))
    assert again["corpora"] == result["corpora"]
    assert (out / "docs" / "runs.csv").read_text() == ledger
    # a third seed asked for without training: the report stays on the two every model has
    partial = run(tmp_path, capsys, "--corpus", "docs", "--seeds", "3", "--no-train")
    assert [c["seeds"] for c in partial["corpora"]] == [2]


def rescale_ledger(ledger: Path, keep: Any, factor: Any) -> None:
    """Every row of ``ledger`` whose seed ``keep`` refuses gets its loss times ``factor(row)``."""
    with ledger.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for r in rows:
        if not keep(int(r["seed"])):
            r["val_loss"] = str(float(r["val_loss"]) * factor(r))
    write_csv(ledger, rows)


def test_calibration_fits_its_own_seeds_and_no_verdict_seed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    calibrated = ("--corpus", "docs", "--calibrate", "--calibration-seeds", "2")
    first = run(tmp_path, capsys, *calibrated)
    out, (calibration,) = tmp_path / "out", first["calibrations"]
    seeds = {int(r["seed"]) for r in heldout.read_ledger(out / "docs" / "runs.csv")}
    assert seeds == {0, 1, heldout.CALIBRATION_SEED, heldout.CALIBRATION_SEED + 1}
    assert calibration["seeds"] == "1000 1001" and calibration["pick"] in HEURISTICS
    assert first["corpora"][0]["plan"] == calibration["plan"]  # the verdict judges that plan
    pick = next(m for m in first["models"] if m["model"] == calibration["pick"])
    assert calibration["role"] == DEVELOPMENT
    assert calibration["plan_minus_pick_relative"] == pytest.approx(
        calibration["plan_minus_pick"] / pick["loss"])  # what the set's "plan - pick" averages
    assert (out / "heldout-calibrated2_calibration.csv").exists()
    assert (out / "docs" / "constants-calibrated2.yaml").exists()

    def refuse(*args: object) -> None:
        raise AssertionError("a --no-train run trained")

    train_one = heldout.train_one

    monkeypatch.setattr(heldout, "train_one", refuse)
    # the verdict's seeds moved (uniform-8 three times worse): the fit and the plan do not
    rescale_ledger(out / "docs" / "runs.csv", lambda s: s >= heldout.CALIBRATION_SEED,
                   lambda r: 3.0 if r["model"] == "uniform-8" else 1.0)
    moved = run(tmp_path, capsys, *calibrated, "--no-train")
    assert moved["calibrations"] == first["calibrations"]
    assert moved["corpora"][0]["best"] != "uniform-8"
    # the calibration's seeds moved (every model but one head of 16 twice as bad): they decide
    rescale_ledger(out / "docs" / "runs.csv", lambda s: s < heldout.CALIBRATION_SEED,
                   lambda r: 1.0 if r["arch"].startswith("mhsa 1x16") else 2.0)
    refit = run(tmp_path, capsys, *calibrated, "--no-train")
    assert refit["calibrations"][0]["pick"] == "head-dim-64"  # the first rule of one head
    assert refit["calibrations"][0]["order"] - refit["calibrations"][0]["width_order"] < 0
    assert refit["calibrations"][0]["plan"].startswith("mhsa 1x16")
    # a fit that explains nothing (R² <= 0) keeps the default plan
    fit = calibrate.fit

    def explains_nothing(*args: Any, **kwargs: Any) -> Any:
        raw, fitted = fit(*args, **kwargs)
        return raw, dataclasses.replace(fitted, r2=-0.01)

    # the constants calibrated here (one head), judged at another width: tables of their own
    monkeypatch.setattr(heldout, "train_one", train_one)
    wider = run(tmp_path, capsys, "--corpus", "docs", "--budget", "32", "--corpus-constants",
                "constants-calibrated2.yaml")
    assert wider["sizes"]["budget"] == 32 and wider["stem"] == "heldout-D32-constants-calibrated2"
    assert (out / "heldout-D32-constants-calibrated2.txt").exists()
    with (out / "heldout-D32-constants-calibrated2_runs.csv").open(newline="") as handle:
        runs = list(csv.DictReader(handle))  # its models' trainings, not the ledger's D = 16 ones
    assert {r["arch"] for r in runs} == {m["arch"] for m in wider["models"]}
    assert {int(r["seed"]) for r in runs} == {0, 1}
    assert wider["corpora"][0]["plan"].startswith("mhsa 1x32")  # one head, as at D = 16
    monkeypatch.setattr(calibrate, "fit", explains_nothing)
    kept = run(tmp_path, capsys, *calibrated, "--no-train")
    assert kept["calibrations"][0]["informative"] is False
    assert kept["calibrations"][0]["plan"] == kept["calibrations"][0]["default_plan"]
    assert kept["corpora"][0]["plan"] == kept["calibrations"][0]["default_plan"]


def test_the_later_layers_check_keeps_the_rule_only_where_the_plan_beats_its_twin(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    fit = calibrate.fit

    def explains_nothing(*args: Any, **kwargs: Any) -> Any:  # the calibrated plan: the default
        raw, fitted = fit(*args, **kwargs)
        return raw, dataclasses.replace(fitted, r2=-0.01)

    monkeypatch.setattr(calibrate, "fit", explains_nothing)
    checked = ("--corpus", "docs", "--calibrate", "--calibration-seeds", "2",
               "--check-later-layers")
    first = run(tmp_path, capsys, *checked)
    assert first["stem"] == "heldout-calibrated2-checked"
    (calibration,) = first["calibrations"]
    plan, twin = calibration["checked_arch"], calibration["twin_arch"]
    assert plan == calibration["default_plan"] and twin != plan
    assert twin.split(" | ")[1] == plan.split(" | ")[0]  # the plan's first layer in both
    ledger = tmp_path / "out" / "docs" / "runs.csv"
    trained = {(r["arch"], int(r["seed"])) for r in heldout.read_ledger(ledger)}
    assert {(a, s) for a in (plan, twin) for s in calibration_seeds(2)} <= trained

    def refuse(*args: object) -> None:
        raise AssertionError("a --no-train run trained")

    monkeypatch.setattr(heldout, "train_one", refuse)

    def judged(factor: float) -> dict[str, Any]:
        """The plan's calibration losses times ``factor``, then the report again."""
        rescale_ledger(ledger, lambda s: s < heldout.CALIBRATION_SEED,
                       lambda r: factor if r["arch"] == plan else 1.0)
        return run(tmp_path, capsys, *checked, "--no-train")

    beaten = judged(0.5)  # the plan below its twin: the rule stays
    assert beaten["calibrations"][0]["later_layers"] == "rule"
    assert beaten["corpora"][0]["plan"] == plan
    kept = judged(4.0)  # the twin below the plan: the later layers copy the first
    assert kept["calibrations"][0]["later_layers"] == "first layer's heads"
    assert kept["corpora"][0]["plan"] == kept["calibrations"][0]["plan"] == twin


def test_a_pattern_pilot_gives_the_later_layers_and_nothing_else(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    default = run(tmp_path, capsys, "--corpus", "docs")["corpora"][0]["plan"].split(" | ")
    folder = tmp_path / "out" / "docs"
    short = read_allocator_inputs(folder / "profile-D16-L2-mlp2-T16-pilot8.yaml").patterns
    assert short is not None and default[1].startswith(
        f"mhsa {later_head_count(short[0], 16, PlanSettings.align)}x")
    # the second pilot's profile, its patterns set to the other count a D = 16 pilot allows
    mixed = ("--corpus", "docs", "--pattern-pilot-steps", "30")
    assert run(tmp_path, capsys, *mixed)["stem"] == "heldout-patterns30"
    long_profile = folder / "profile-D16-L2-mlp2-T16-pilot30.yaml"
    data = yaml.safe_load(long_profile.read_text())
    data["allocator"]["patterns"] = [2.0 if short[0] < 1.5 else 1.0]
    long_profile.write_text(yaml.safe_dump(data))
    plan = run(tmp_path, capsys, *mixed)["corpora"][0]["plan"].split(" | ")
    assert plan[0] == default[0]  # the first layer: the first pilot's profile
    count = later_head_count(data["allocator"]["patterns"][0], 16, PlanSettings.align)
    assert plan[1].startswith(f"mhsa {count}x") and plan[1] != default[1]  # the second's


def calibration_seeds(count: int) -> tuple[int, ...]:
    return tuple(range(heldout.CALIBRATION_SEED, heldout.CALIBRATION_SEED + count))


@pytest.mark.parametrize(("flags", "message"), [
    (["--check-later-layers"], "--check-later-layers: needs --calibrate"),
    (["--corpus", "docs", "--no-train"], "--no-train: corpus 'docs' has no profile"),
    (["--corpus", "nope"], "--corpus 'nope': not a registered corpus"),
    (["--data", "code"], "its name 'code' is taken"),
    (["--budget", "36"], "--budget 36: not a multiple of 8"),
    (["--corpus", "docs", "--corpus-constants", "c.yaml"], "docs has no"),
])
def test_a_bad_corpus_is_one_line_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
        message: str) -> None:
    code = heldout.main(["--smoke-test", "--out", str(tmp_path / "out"), *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "out").exists()


def test_calibrated_and_given_constants_are_refused_together(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        heldout.main(["--smoke-test", "--calibrate", "--constants", str(tmp_path / "fit.yaml"),
                      "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert exited.value.code == 2 and len(err.splitlines()) == 1, err
    assert "--constants: not allowed with argument --calibrate" in err
    assert not (tmp_path / "out").exists()


def test_later_heads_first_keeps_layer_zeros_heads_and_narrows_only_qk(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    default = run(tmp_path, capsys, "--corpus", "docs")["corpora"][0]["plan"]
    folder = tmp_path / "out" / "docs"
    profile = folder / "profile-D16-L2-mlp2-T16-pilot8.yaml"
    data = yaml.safe_load(profile.read_text())  # a measured count other than layer 0's heads
    first_count = int(default.split(" | ")[0].split()[1].split("x")[0])
    data["allocator"]["patterns"] = [1.0 if first_count > 1 else 4.0]
    profile.write_text(yaml.safe_dump(data))
    patterned = run(tmp_path, capsys, "--corpus", "docs")["corpora"][0]["plan"].split(" | ")
    result = run(tmp_path, capsys, "--corpus", "docs", "--later-heads", "first")
    assert result["stem"] == "heldout-laterfirst" and result["later_heads"] == "first"
    plan = result["corpora"][0]["plan"].split(" | ")
    assert plan[0] == patterned[0]  # the first layer: the same profile's
    # the later layer: layer 0's head count and value width, the pattern count ignored
    first, later = (layer.split()[1].split("x") for layer in plan)
    assert later[0] == first[0] != patterned[1].split()[1].split("x")[0]
    assert later[1].split("/")[-1] == first[1]
    assert "--later-heads first" in (tmp_path / "out" / "heldout-laterfirst.txt").read_text()
    # calibrated: its own constants file beside the default's
    calibrated = run(tmp_path, capsys, "--corpus", "docs", "--later-heads", "first",
                     "--calibrate", "--calibration-seeds", "2")
    assert calibrated["stem"] == "heldout-laterfirst-calibrated2"
    assert (folder / "constants-laterfirst-calibrated2.yaml").exists()
    code = heldout.main(["--smoke-test", "--out", str(tmp_path / "out2"), "--later-heads",
                         "first", "--pattern-pilot-steps", "30"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "no pattern is read" in err, err
    assert not (tmp_path / "out2").exists()


def test_another_depth_has_its_own_profile_plans_and_tables(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deeper = run(tmp_path, capsys, "--corpus", "docs", "--layers", "3")
    assert deeper["stem"] == "heldout-L3" and deeper["sizes"]["depth"] == 3
    assert all(m["arch"].count(" | ") == 2 for m in deeper["models"])  # every model: 3 layers
    assert (tmp_path / "out" / "docs" / "profile-D16-L3-mlp2-T16-pilot8.yaml").exists()
    assert (tmp_path / "out" / "heldout-L3.txt").exists()
    given = run(tmp_path, capsys, "--corpus", "docs", "--layers", str(heldout.SMOKE.depth))
    assert given["stem"] == "heldout"  # the default depth, given: the default's name


def test_it_runs_where_ray_optuna_and_sqlalchemy_are_not_installed(tmp_path: Path) -> None:
    """A bare GPU box has none of them; the held-out grid trains no search, so it needs none."""
    code = ("import sys; sys.modules.update(ray=None, optuna=None, sqlalchemy=None); "
            "from experiments.heldout import main; "
            f"sys.exit(main(['--smoke-test', '--corpus', 'docs', '--seeds', '2', '--out', "
            f"{str(tmp_path / 'out')!r}, '--quiet', '--format', 'json']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).parents[1], timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["corpora"][0]["corpus"] == "docs"
