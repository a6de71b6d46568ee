"""The four paper experiments at smoke size: each runs through the product, writes its CSV and
PNG, and shows the finding that holds at this size."""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
from pathlib import Path

import optuna
import pytest
import torch
import yaml

from alloc.constants import read_constants
from arch import ArchConfig, HeadGroup, LayerSpec, param_count
from experiments import (
    compress,
    corpora,
    denoise,
    kv_compress,
    kv_methods,
    llama_compress,
    mixit,
    saturation,
    tradeoff,
)
from studies import open_storage
from workers.checkpoints import load
from workers.models.model import build_model, count_params
from workers.tasks import fit_arch, make_task

ROOT = Path(__file__).resolve().parents[1]


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(handle))


SEARCHING = {"corpora": corpora, "mixit": mixit, "tradeoff": tradeoff}


def run_experiment(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch,
                   capsys: pytest.CaptureFixture[str], *extra: str) -> dict:  # type: ignore[type-arg]
    """``experiments.NAME --smoke-test --format json EXTRA`` in this process, on the
    test process's Ray (``shared_ray``: a subprocess cost a Python, torch and Ray import more,
    and a Ray of its own a ``ray.init`` more)."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / name
    capsys.readouterr()
    code = SEARCHING[name].main(["--smoke-test", "--out", str(out), "--format", "json", *extra])
    printed = capsys.readouterr()
    assert code == 0, printed.err[-3000:]
    assert (out / f"{name}.png").stat().st_size > 10_000
    return json.loads(printed.out)  # type: ignore[no-any-return]


# On the process's Ray node, as every in-process search here: a local Ray started and shut
# down in this process left the node's next search with every trial's actor cancelled before
# it ran ("all references to the actor were removed"), 4 failures in the suite.
@pytest.mark.usefixtures("shared_ray")
@pytest.mark.parametrize("status", ["interrupted", "stopped"])
def test_a_search_that_stops_ends_the_experiment_in_one_line(
        status: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A search an experiment or a table runs that ends early (Ctrl-C, a full disk) is a fault
    the same command continues: one line, exit code 1, no traceback."""
    import workers.search

    monkeypatch.setattr(workers.search, "run_search",
                        lambda *args, **kwargs: argparse.Namespace(status=status))
    code = tradeoff.main(["--smoke-test", "--out", str(tmp_path / "t")])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.splitlines() == [
        f"python -m experiments.tradeoff: error: search tradeoff-ngram ended {status}; "
        "its finished trials are kept: run the same command again to continue it"], err


def test_denoise_snr_grows_at_every_layer(tmp_path: Path) -> None:
    assert denoise.main(["--smoke-test", "--out", str(tmp_path)]) == 0
    rows = read_csv(tmp_path / "denoise.csv")
    for update in denoise.UPDATES:
        for noise in ("0.2", "0.5"):
            mine = [r for r in rows if r["noise"] == noise and r["update"] == update]
            snr = [float(r["snr"]) for r in mine]
            assert len(snr) == denoise.SMOKE.layers + 1
            # as in the AoT paper's Fig. 4
            assert all(b > a for a, b in itertools.pairwise(snr)), snr
            for r in mine[1:]:
                assert 0 < float(r["tau_noise"]) < float(r["tau"]) <= 1
                assert float(r["rate"]) == pytest.approx(
                    float(r["snr"]) / snr[int(r["layer"]) - 1])
                if update == "eq4":  # Thm 3.1's rate, with tau read off the layer
                    assert float(r["rate"]) == pytest.approx(float(r["predicted_rate"]),
                                                             abs=0.02)
    assert (tmp_path / "denoise.png").stat().st_size > 10_000


def test_saturation_jacobian_falls_like_one_over_n_and_students_fit(tmp_path: Path) -> None:
    assert saturation.main(["--smoke-test", "--out", str(tmp_path)]) == 0
    jac = read_csv(tmp_path / "jacobian.csv")
    for key in ("head0", "all_heads"):
        norms = [float(r[key]) for r in jac]
        assert all(b < a for a, b in itertools.pairwise(norms)), norms  # decreases with N
        n = [int(r["seq_len"]) for r in jac]
        assert -1.3 < saturation.slope(n, norms) < -0.7  # like 1/N
    for r in jac:  # Gershgorin: ||J|| <= 2 max s(1 - s) <= 1/2, and the paper's bound
        assert float(r["all_heads"]) <= min(0.5, float(r["bound"])) + 1e-12
    students = read_csv(tmp_path / "students.csv")
    qk = saturation.SMOKE.d_model // saturation.SMOKE.heads
    for r in students:
        assert float(r["trained_mse"]) <= float(r["svd_init_mse"]) * 1.5 + 1e-12
        if int(r["rank"]) >= qk:  # the SVD of the teacher's map is exact at full rank
            assert float(r["svd_init_mse"]) < 1e-12
    assert (tmp_path / "saturation.png").stat().st_size > 10_000
    # Per layer, on both teachers (documentation prose and the stdlib's code): the slope of
    # ||J|| vs N from the rows, and at this size (barely trained: small logits) every layer
    # saturates like 1/N.
    layers = read_csv(tmp_path / "layers.csv")
    assert {r["teacher"] for r in layers} == {"docs", "code"}
    for name in ("docs", "code"):
        for layer in range(saturation.SMOKE.layers):
            mine = [r for r in layers if r["teacher"] == name and int(r["layer"]) == layer]
            assert [int(r["seq_len"]) for r in mine] == list(saturation.SMOKE.lengths)
            value = saturation.slope([int(r["seq_len"]) for r in mine],
                                     [float(r["jacobian"]) for r in mine])
            assert -1.3 < value < -0.7
            assert all(0 < float(r["entropy"]) <= 1 + 1e-9 for r in mine)


@pytest.mark.usefixtures("shared_ray")
def test_tradeoff_best_of_per_head_count_from_the_study(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    result = run_experiment(tmp_path, "tradeoff", monkeypatch, capsys)
    rows = read_csv(tmp_path / "tradeoff" / "tradeoff.csv")
    assert [int(r["heads"]) for r in rows] == [1, 2, 4, 8]  # 1 .. D/4 at D = 32
    study = optuna.load_study(study_name="tradeoff-ngram", storage=open_storage(
        f"sqlite:///{tmp_path / 'tradeoff' / 'tradeoff.db'}"))
    trials = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(trials) == 4 * 2  # every H, every seed
    for r in rows:  # best of lr and seed, by brute force over the study
        mine = [t.value for t in trials if t.params["L0.g0.count"] == int(r["heads"])]
        assert len(mine) == int(r["trials"]) == 2
        assert float(r["best_loss"]) == pytest.approx(min(mine))
    assert {t.params["train.seed"] for t in trials} == {0, 1}
    assert result["calibrated"]["r2"] >= result["raw"]["r2"] - 1e-12
    assert result["measured_best_heads"] == int(min(rows, key=lambda r: float(r["best_loss"]))[
        "heads"])
    read_constants(tmp_path / "tradeoff" / "constants.yaml")


@pytest.mark.usefixtures("shared_ray")
def test_mixit_kinds_per_task_from_the_studies(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    result = run_experiment(tmp_path, "mixit", monkeypatch, capsys)
    rows = read_csv(tmp_path / "mixit" / "mixit.csv")
    studies = {r["study"] for r in rows}
    assert studies == {"kinds-modadd", "memorize-d8", "memorize-d16"} | {
        f"kinds-retrieval-m{m}" for m in mixit.SMOKE_RETRIEVAL}
    d, depth = mixit.SMOKE_BUDGET, 2  # the kinds' spaces at the smoke budget
    for study in studies - {"memorize-d8", "memorize-d16"}:
        mine = {r["attention"]: r for r in rows if r["study"] == study}
        assert set(mine) == {"mhsa", "frozen_qk", "mixit", "mssa"}
        full = int(mine["mhsa"]["params_trainable"])
        # Frozen-QK and MixiT train no query/key maps: 2 D^2 fewer weights per layer.
        for kind in ("frozen_qk", "mixit"):
            assert int(mine[kind]["params_trainable"]) == full - 2 * d * d * depth
        for r in mine.values():
            assert 0.0 <= float(r["accuracy"]) <= 1.0
    # Bits per parameter from the model the trainer builds for the recorded architecture on
    # the memorize task (not from the recorded counts), for both kinds at both sizes.
    task = make_task("memorize", "smoke")
    n = task.n  # type: ignore[attr-defined]
    sweep = [r for r in rows if r["task"] == "memorize"]
    assert {(r["attention"], int(r["d_model"])) for r in sweep} == {
        (k, s) for k in ("mhsa", "mixit") for s in (8, 16)}
    for r in sweep:
        study = optuna.load_study(study_name=r["study"], storage=open_storage(
            f"sqlite:///{tmp_path / 'mixit' / 'mixit.db'}"))
        recorded = ArchConfig.from_json(study.trials[int(r["trial"])].user_attrs["arch"])
        trainable, _ = count_params(build_model(fit_arch(recorded, task)))
        assert int(r["params_trainable"]) == trainable
        expected = n * n * math.log2(n) * float(r["accuracy"]) / trainable
        assert float(r["bits_per_param"]) == pytest.approx(expected)
    assert len(result["rows"]) == len(rows) == (1 + len(mixit.SMOKE_RETRIEVAL)) * 4 + 4


def test_compress_allocator_and_uniform_students_at_equal_size(tmp_path: Path) -> None:
    assert compress.main(["--smoke-test", "--out", str(tmp_path)]) == 0
    rows = read_csv(tmp_path / "compress.csv")
    assert {r["plan"] for r in rows} == {"allocator", "uniform"}
    for tolerance in {r["tolerance"] for r in rows}:
        a, b = (next(r for r in rows if r["tolerance"] == tolerance and r["plan"] == name)
                for name in ("allocator", "uniform"))
        assert a["params_trainable"] == b["params_trainable"]  # equal size, by construction
        for r in (a, b):
            assert math.isfinite(float(r["svd_loss"])) and math.isfinite(
                float(r["finetuned_loss"]))
    assert (tmp_path / "compress.png").stat().st_size > 10_000


def test_llama_compress_plan_and_uniform_students_at_equal_kv_cache(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert llama_compress.main(["--smoke-test", "--out", str(tmp_path), "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    rows = read_csv(tmp_path / "llama_compress.csv")
    methods = ("uniform", *llama_compress.METHODS)
    assert len(rows) == len(methods) * len(llama_compress.SMOKE.ranks)
    for rank in llama_compress.SMOKE.ranks:
        uniform, by_error, by_loss = (
            next(r for r in rows if r["rank"] == str(rank) and r["method"] == m) for m in methods)
        assert uniform["qk_dims"] == " ".join([str(rank)] * llama_compress.SMOKE.layers)
        for planned in (by_error, by_loss):  # within the uniform cut's KV cache
            assert int(planned["kv_cache_bytes"]) <= int(uniform["kv_cache_bytes"])
        # each plan is the best under its rule that fits: no worse than the uniform cut there
        assert float(by_error["max_measured_error"]) <= float(uniform["max_measured_error"])
        assert float(by_loss["summed_loss_increase"]) <= float(
            uniform["summed_loss_increase"]) + 1e-12
        for r in (uniform, by_error, by_loss):
            assert math.isfinite(float(r["reduced_loss"]))
            assert math.isfinite(float(r["finetuned_loss"]))
    assert int(rows[0]["kv_cache_bytes"]) < result["teacher_kv_cache_bytes"]
    assert result["student_file_bytes"] < result["teacher_file_bytes"]
    assert (tmp_path / "teacher" / "config.json").exists()
    assert (tmp_path / "student" / "config.json").exists()
    assert (tmp_path / "llama_compress.png").stat().st_size > 10_000


def test_kv_compress_puts_every_method_at_every_size_on_any_teacher(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A teacher folder given by --teacher (a tiny Llama written by transformers), its
    calibration tokens and two held-out sources: every method at every size and calibration
    seed, each student caching exactly what its size says (the planned ones at most that), each
    scored per source with an interval against the best other method; a run that asks for
    fine-tuning after one that did not adds only the fine-tuned rows; a third measures nothing
    again."""
    from tests.helpers.llama import build, saved, token_folder

    teacher = saved(build("llama", num_key_value_heads=2), tmp_path / "teacher")
    data = token_folder(tmp_path / "calibration")
    evals = [token_folder(tmp_path / name) for name in ("held-a", "held-b")]
    argv = ["--teacher", str(teacher), "--data", str(data), "--eval", *map(str, evals),
            "--smoke-test", "--seq-len", "24", "--out", str(tmp_path / "out")]
    methods, fractions = kv_compress.METHODS, kv_compress.FRACTIONS
    assert kv_compress.main([*argv, "--finetune", "--quiet"]) == 0
    table = capsys.readouterr().out
    assert "nan" not in table  # a student below its floor says so, as its CSV row does
    cut_only = (tmp_path / "out" / "kv_compress.csv").read_text()
    assert len(cut_only.splitlines()) == 1 + 2 * 2 + 2 * 2 * len(fractions) * len(methods)
    assert kv_compress.main([*argv, "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (tmp_path / "out" / "kv_compress.csv").read_text().startswith(cut_only)
    rows = read_csv(tmp_path / "out" / "kv_compress.csv")
    students = [r for r in rows if r["method"] != "teacher"]
    # two seeds x sizes x methods, each scored on both sources, fine-tuned at 25% too
    assert len(students) == 2 * 2 * len(fractions) * len(methods) + 2 * 2 * len(methods)
    kv_width = load(teacher).arch.kv_width
    for r in students:
        fraction = float(r["fraction"])
        if r["layers"] == "below floor":  # a plan's smallest widths can exceed a size
            assert r["method"] in ("ours", "ours-latent", "ours-mla")
            assert math.isnan(float(r["loss"]))
            continue
        assert int(r["kv_units"]) <= round(fraction * kv_width), r
        if not r["method"].startswith("ours"):
            assert int(r["kv_units"]) == round(fraction * kv_width), r
        assert math.isfinite(float(r["perplexity"])) and r["source"] in ("held-a", "held-b")
    # no row dropped: every student stored has its summary row, one below its floor marked
    stored = {(float(r["fraction"]), r["stage"], r["source"], r["method"]) for r in students}
    assert {(s["fraction"], s["stage"], s["source"], s["method"])
            for s in result["summary"]} == stored
    below = [s for s in result["summary"] if s["below_floor"]]
    assert all(s["perplexity"] is None for s in below)
    assert ("below floor" in table) == any(s["stage"] == "cut" for s in below)
    summary = [s for s in result["summary"] if s["best_other"] is not None]
    assert summary and all(s["vs_best_other_low"] <= s["vs_best_other"] <=
                           s["vs_best_other_high"] for s in summary)
    assert {s["stage"] for s in summary} == {"cut", "finetuned"}
    assert (tmp_path / "out" / "kv_compress.png").stat().st_size > 10_000
    before = (tmp_path / "out" / "kv_compress.csv").read_text()

    def measured_again(*args: object) -> None:
        raise AssertionError("a run with every row stored calibrated again")

    monkeypatch.setattr(kv_compress, "calibration", measured_again)
    assert kv_compress.main([*argv, "--quiet"]) == 0
    assert (tmp_path / "out" / "kv_compress.csv").read_text() == before


def test_the_svd_baseline_is_the_separate_truncated_svd_of_keys_and_values(
        tmp_path: Path) -> None:
    """``svd``: each layer's key rows and value rows rebuilt as their own rank-``r``
    truncated SVDs (Eckart-Young), half the layer's units each."""
    from experiments.kv_methods import layer_units, mhsa, svd
    from tests.helpers.llama import build, saved

    teacher = load(saved(build("llama", num_key_value_heads=2), tmp_path / "t")).model
    student = svd(teacher, None, 0.25)  # type: ignore[arg-type]  # svd reads no sample
    half = layer_units(teacher.arch, 0.25) // 2
    for i in range(teacher.arch.n_layers):
        attn = mhsa(teacher, i)
        w = attn.qkv.weight.detach().double()
        split = [attn.qk_width, attn.k_width, attn.v_width]
        _, keys, values = w.split(split)
        latent = student.block(i).attn
        rebuilt = (latent.up.weight.double() @ latent.down.weight.double()).split(split[1:])
        for rows, part in zip((keys, values), rebuilt):
            u, s, vh = torch.linalg.svd(rows)
            best = (u[:, :half] * s[:half]) @ vh[:half]
            torch.testing.assert_close(part, best, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("weights", "total", "cap", "expected"), [
    ([1.0, 1.0, 2.0], 8, 10, [2, 2, 4]),  # in proportion, one unit each first
    ([10.0, 1.0], 10, 6, [6, 4]),  # a capped layer's share goes to the other
    ([0.0, 0.0, 0.0], 7, 5, [3, 2, 2]),  # no information: even
    ([5.0, 1.0], 20, 6, [6, 6]),  # both capped: what fits
])
def test_palus_widths_follow_the_fisher_information(weights: list[float], total: int, cap: int,
                                                    expected: list[int]) -> None:
    assert kv_methods.allocate(weights, total, cap) == expected


def test_a_uniform_student_matches_any_plans_size() -> None:
    layer = LayerSpec("mhsa", (HeadGroup(4, 32),), mlp_ratio=2.0)
    arch = ArchConfig(d_model=128, layers=(layer,) * 3, max_seq_len=16, vocab_size=256)
    for dims in ([8, 16, 28], [4, 4, 32], [12, 20, 24]):
        planned = ArchConfig.from_dict({**arch.to_dict(), "layers": [
            LayerSpec("mhsa", (HeadGroup(4, d, 32),), mlp_ratio=2.0).to_dict() for d in dims]})
        uniform = compress.uniform_like(arch, planned)
        assert param_count(uniform).trainable == param_count(planned).trainable
        qk = [g.qk_dim for x in uniform.layers for g in x.heads]
        assert max(qk) - min(qk) <= 1


@pytest.mark.parametrize(("argv", "message"), [
    (["--layers", "0"], "--layers: '0': must be an integer between 1 and 64"),
    (["--out", "FILE"], "exists and is not a folder"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          argv: list[str], message: str) -> None:
    (tmp_path / "FILE").write_text("keep")
    argv = [str(tmp_path / a) if a == "FILE" else a for a in argv]
    try:
        code = denoise.main(argv)
    except SystemExit as exit_:  # argparse's own errors exit from parse_args
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert (tmp_path / "FILE").read_text() == "keep"


@pytest.mark.usefixtures("shared_ray")
def test_corpora_grid_plans_before_and_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Two corpora (kept apart in every table), every grid point with both seeds, the two
    plans ranked in the grid. The third development corpus runs the same code: by default
    the experiment takes all three."""
    assert corpora.corpora_of(argparse.Namespace(corpus=None)) == ("code", "docs", "records")
    result = run_experiment(tmp_path, "corpora", monkeypatch, capsys,
                            "--corpus", "code", "--corpus", "records")
    out = tmp_path / "corpora"
    rows = read_csv(out / "corpora.csv")
    assert {r["corpus"] for r in rows} == {"code", "records"}
    assert [c["corpus"] for c in result["corpora"]] == ["code", "records"]
    for corpus in result["corpora"]:
        mine = [r for r in rows if r["corpus"] == corpus["corpus"]]
        assert len(mine) == corpus["points"] == 2  # heads (1, 2) x (1,) at smoke size
        assert sorted(int(r["rank"]) for r in mine) == [1, 2]
        for r in mine:  # the mean of the seeds ranks the point
            assert float(r["loss"]) == pytest.approx(
                (float(r["loss_seed0"]) + float(r["loss_seed1"])) / 2)
        after = yaml.safe_load((out / corpus["corpus"] / "profile-after.yaml").read_text())
        assert "pilot" in after and set(after["allocator"]["sources"]) >= {
            "kernel", "input_dim", "input_spectrum"}
        assert "pilot" not in yaml.safe_load((out / corpus["corpus"] / "profile-before.yaml")
                                             .read_text())
        assert corpus["after"]["inputs"].endswith("compression order 2")
        assert corpus["before"]["inputs"].endswith("compression order 1")
    plans = read_csv(out / "corpora_plans.csv")
    assert [(p["corpus"], p["when"]) for p in plans] == [
        (c["corpus"], w) for c in result["corpora"] for w in c["plans"]]
    assert {"before", "after"} <= set(result["corpora"][0]["plans"])
    assert_finalists_state_their_noise(result, out)


def assert_finalists_state_their_noise(result: dict, out: Path) -> None:  # type: ignore[type-arg]
    """Stage 2: every grid point a finalist at smoke size (2 <= --finalists), each with its
    seeds' mean and interval; the seed and evaluation noise in numbers and in words; a plan in
    the grid has a verdict, one beyond it none."""
    finalists = read_csv(out / "corpora_finalists.csv")
    for corpus in result["corpora"]:
        mine = [r for r in finalists if r["corpus"] == corpus["corpus"]]
        assert len(mine) == corpus["points"]
        assert sum(r["reference"] == "True" for r in mine) == 1
        for r in mine:
            assert r["seeds"] == "2" and float(r["low"]) <= float(r["loss"]) <= float(r["high"])
        noise = corpus["finalists"]["noise"]
        assert noise["seed_sd"] > 0 and noise["eval_se"] > 0  # the trials' val_loss_se
        assert noise["ratio"] == pytest.approx(noise["eval_se"] / noise["seed_sd"])
        assert corpus["grid_noise"]["eval_se"] > 0
        for label in corpus["plans"]:
            final = corpus[label]["final"]
            in_grid = corpus[label]["rank"] is not None
            assert (final["top_quartile"] is not None) == in_grid
            if in_grid:
                assert final["seeds"] == 2 and final["low"] <= final["loss"] <= final["high"]


def test_qk_depth_cuts_each_layer_and_each_third(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Every layer alone, then each third, cut to --dim query-key dims and scored on each
    held-out source; a verdict per source from the rank correlation and the paired thirds."""
    from experiments import qk_depth
    from tests.helpers.llama import build, saved, token_folder

    teacher = saved(build("llama", num_key_value_heads=2, num_hidden_layers=3),
                    tmp_path / "teacher")
    folders = [str(token_folder(tmp_path / name)) for name in ("cal", "a", "b")]
    assert qk_depth.main(["--teacher", str(teacher), "--data", folders[0], "--eval",
                          *folders[1:], "--dim", "4", "--seq-len", "24", "--sample-tokens",
                          "240", "--eval-tokens", "480", "--out", str(tmp_path / "out"),
                          "--format", "json", "--quiet"]) == 0
    result = json.loads(capsys.readouterr().out)
    cuts = {(r["cut"], r["source"]) for r in result["rows"]}
    assert cuts == {(c, s) for c in ("layer 0", "layer 1", "layer 2", "first third",
                                     "middle third", "last third") for s in ("a", "b")}
    assert len(result["verdicts"]) == 2 and all("Spearman" in v for v in result["verdicts"])
    assert qk_depth.main(["--teacher", str(teacher), "--data", folders[0], "--eval",
                          folders[1], "--dim", "16"]) == 2  # not below the heads' 16


def test_kv_compress_shows_a_student_below_its_floor_in_its_table(tmp_path: Path) -> None:
    """A method that cannot build a student at a size keeps its row in the summary and the
    printed table, marked ``below floor`` as in its CSV, never ``nan``, and the verdict is the
    lowest of the others."""
    import argparse

    store = kv_compress.Store(tmp_path)
    key = {"seed": 0, "fraction": 0.25, "stage": "cut", "source": "held"}
    losses = {"teacher": 2.0, "svd": 3.0}
    for method, loss in losses.items():
        fraction = 1.0 if method == "teacher" else 0.25
        row = {**key, "fraction": fraction, "method": method}
        store.add([{**row, "loss": loss, "perplexity": math.exp(loss), "layers": "k8/v8",
                    "params": 1, "kv_units": 8}],
                  [{**row, "window": w, "loss": loss + 0.1 * w} for w in range(3)])
    store.add([{**key, "method": "ours", "loss": math.nan, "perplexity": math.nan,
                "layers": kv_compress.BELOW_FLOOR, "params": 0, "kv_units": 0}], [])
    args = argparse.Namespace(fractions=[0.25], seeds=[0], methods=["svd", "ours"])
    summary = kv_compress.summarise(store, args, ["held"])
    assert [(s["method"], s["below_floor"]) for s in summary] == [("svd", False),
                                                                  ("ours", True)]
    verdicts = kv_compress.verdicts(summary)
    table = kv_compress.render({"summary": summary, "verdicts": verdicts, "out": "x",
                                "teacher": "t", "seeds": [0]})
    ours = next(line for line in table.splitlines() if " ours " in line)
    assert "below floor" in ours and "nan" not in table
    assert verdicts == [f"25.0% cut on held: lowest svd (perplexity {math.exp(3.1):.2f}, "
                        f"teacher {math.exp(2.1):.2f})"]
