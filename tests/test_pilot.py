"""The pilot profile (docs/theory.md §9.2) and the MLP-aware rule (§2.1): the pilot measures an
embedding dimension known by construction, the profile says which measurement each allocator
input came from, bad pilot flags are refused, and the order-2 compression term is the residual
of products of projected tokens and changes the plan for a stated reason."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from alloc.extract import ErrorModel
from alloc.plan import make_plan
from alloc.profiling.pilot import PilotRequest
from alloc.profiling.spectra import participation_ratio, signal_dim, variance_rank
from alloc.settings import PlanSettings
from alloc.solve import main as solve_main
from userdata import DataSpec
from workers.pilot import run_pilot
from workers.profile import main


def bits_corpus(folder: Path, bits: int, tokens: int = 200_000, flip: float = 0.1) -> Path:
    """nanoGPT ``train.bin``/``val.bin`` of ``2**bits`` tokens whose ``bits`` binary features
    are independent two-state Markov chains (each flips with probability ``flip``): the next
    token's log-probability is a sum over the features of the current token's, so a model needs
    exactly ``bits`` embedding directions, by construction."""
    rng = np.random.default_rng(bits)
    state = np.cumsum(rng.random((tokens, bits)) < flip, axis=0) % 2
    ids = (state * (1 << np.arange(bits))).sum(1).astype(np.uint16)
    folder.mkdir(parents=True, exist_ok=True)
    cut = int(0.9 * tokens)
    ids[:cut].tofile(folder / "train.bin")
    ids[cut:].tofile(folder / "val.bin")
    return folder


@pytest.mark.parametrize("bits", [4, 8])
def test_pilot_measures_a_known_embedding_dimension(bits: int, tmp_path: Path) -> None:
    spec = DataSpec(str(bits_corpus(tmp_path, bits)), vocab_size=1 << bits)
    measured = run_pilot(PilotRequest(spec, budget=64, layers=2, mlp_ratio=2.0, seq_len=32,
                                      steps=300))
    assert measured.learned_context  # it beat token frequencies
    assert measured.signal_dim == pytest.approx(bits, rel=0.2)
    assert len(measured.input_variance) == 64 and measured.input_rank >= measured.signal_dim
    assert len(measured.attention_mass) == 32 and len(measured.logit_bounds) == 1


def test_spectrum_summaries_on_exact_shapes() -> None:
    flat = [1.0] * 6 + [0.1] * 10
    assert participation_ratio([1.0] * 6) == pytest.approx(6)
    assert signal_dim(flat, 0.9) == 6  # the drop from 1 to 0.1
    assert variance_rank(flat, 0.9) == 9  # 90% of 7 is 6.3: three directions of the floor
    assert signal_dim([3.0, 1.0, 1.0, 0.5], 0.9) == 1


def test_profile_says_where_each_input_came_from(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    data = bits_corpus(tmp_path / "bits", 6)
    out = tmp_path / "p.yaml"
    assert main(["--data", str(data), "--vocab-size", "64", "--seq-len", "32", "--budget",
                 "64", "--layers", "2", "--pilot-steps", "200", "--out", str(out), "--format",
                 "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    inputs = yaml.safe_load(out.read_text())["allocator"]
    assert inputs == report["allocator"]
    assert set(inputs["sources"]) == {"kernel", "input_dim", "input_spectrum", "spectrum",
                                      "logit_bounds", "patterns"}
    assert all(v.startswith("pilot (200 steps)") for v in inputs["sources"].values())
    assert report["pilot"]["signal_dim"] == 6 and len(inputs["logit_bounds"]) == 1
    # The pattern pilot's later layer: 64 / 8 heads, their distinct patterns counted.
    assert report["pilot"]["pattern_heads"] == 8 and 1 <= inputs["patterns"][0] <= 8
    variances = np.loadtxt(tmp_path / "p.input.txt")
    assert len(variances) == inputs["input_dim"] == 64
    assert solve_main(["--budget", "64", "--layers", "2", "--profile", str(out), "--mlp-ratio",
                       "2", "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)["inputs"]
    assert plan["input_spectrum"].endswith("p.input.txt") and plan["logit_bounds"] == [
        inputs["logit_bounds"][0]] and plan["patterns"] == inputs["patterns"]
    assert main(["--data", str(data), "--vocab-size", "64", "--no-pilot", "--out",
                 str(out), "--format", "json"]) == 0
    plain = json.loads(capsys.readouterr().out)["allocator"]
    assert "input_spectrum" not in plain and "pilot" not in plain["sources"]["kernel"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--pilot-steps", "0"], "argument --pilot-steps: '0': must be an integer between 1 and"),
    (["--pilot-steps", "5", "--no-pilot"], "--pilot-steps and --no-pilot: give one"),
    (["--mlp-ratio", "40"], "--mlp-ratio 40: must be <= 16"),
    (["--budget", "100000"], "argument --budget: '100000': must be an integer between 1 and"),
    (["NPY", "--pilot-steps", "5"], "--pilot-steps 5: the pilot trains a language model"),
    (["CKPT", "--budget", "64"], "--budget: the pilot profiles data (--data without "
                                 "--checkpoint)"),
])
def test_bad_pilot_flags_are_one_line(argv: list[str], message: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.txt").write_text("some text " * 500)
    np.save(tmp_path / "x.npy", np.zeros((4, 8, 3), dtype=np.float32))
    data = str(tmp_path / ("x.npy" if argv[0] == "NPY" else "a.txt"))
    source = ["--checkpoint", str(tmp_path / "c.pt")] if argv[0] == "CKPT" else ["--data", data]
    argv = [a for a in argv if a not in ("NPY", "CKPT")]
    try:
        code = main([*source, *argv, "--out", str(tmp_path / "p.yaml")])
    except SystemExit as exit_:  # argparse's own checks exit
        code = int(exit_.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "p.yaml").exists()


# --- the MLP-aware rule ---------------------------------------------------------------------


@pytest.mark.parametrize("dim", [8, 16, 32, 48])
def test_order_two_compression_is_the_residual_of_products(dim: int) -> None:
    """Tokens of norm B = sqrt(d_in) in random directions, kept in ``dim`` coordinates: the
    order-2 term is the residual of x (x) x, ``||x (x) x - Px (x) Px|| / B`` (Monte Carlo)."""
    d_in = 64
    rng = np.random.default_rng(dim)
    x = rng.normal(size=(20_000, d_in))
    x *= np.sqrt(d_in) / np.linalg.norm(x, axis=1, keepdims=True)
    kept = np.linalg.norm(x[:, :dim], axis=1)
    residual = np.sqrt(np.mean(d_in ** 2 - kept ** 4)) / np.sqrt(d_in)  # ||x||^4 - ||Px||^4
    model = ErrorModel(d_in, product_order=2)
    assert float(model.compression(dim)) == pytest.approx(residual, rel=0.05)
    linear = np.sqrt(np.mean(d_in - kept ** 2))
    assert float(ErrorModel(d_in).compression(dim)) == pytest.approx(linear, rel=0.02)


def test_a_measured_spectrum_keeps_its_top_directions() -> None:
    variance = (4.0, 2.0, 1.0, 1.0)
    model = ErrorModel(4, input_variance=variance)
    assert model.kept_share(2).item() == pytest.approx(0.75)
    assert float(model.compression(2)) == pytest.approx(np.sqrt(4 * 0.25))
    assert float(ErrorModel(4).compression(2)) == pytest.approx(np.sqrt(2))  # isotropic


def test_the_mlp_rule_gives_fewer_wider_heads_where_the_input_is_concentrated(
        tmp_path: Path) -> None:
    """With a decaying input spectrum (most variance in few directions), a head that keeps the
    top directions loses little of a token but more of a product: with an MLP the uniform plan
    has fewer, wider heads; attention-only layers keep today's answer."""
    spectrum = tmp_path / "input.txt"
    spectrum.write_text("\n".join(f"{i ** -1.0:.6f}" for i in range(1, 129)))
    settings = PlanSettings(budget=128, layers=2, seq_len=64, input_dim=128, kernel="poly:1.3",
                            input_spectrum=f"file:{spectrum}", uniform=True, mlp_ratio=2.0)
    with_mlp = make_plan(settings).arch.layers[0].n_heads
    without = make_plan(dataclasses.replace(settings, mlp_ratio=0.0)).arch.layers[0].n_heads
    assert with_mlp < without
    assert make_plan(dataclasses.replace(settings, product_order=1)).arch.layers[0].n_heads \
        == without  # the rule is the order, nothing else


@pytest.mark.parametrize(("argv", "message"), [
    (["--input-spectrum", "file:NOPE"], "--input-spectrum: spectrum file"),
    (["--input-spectrum", "power:1"], "--input-spectrum: input spectrum 'power:1': must be "
                                      "file:PATH"),
    (["--input-spectrum", "file:TWO", "--input-dim", "1", "--align", "1"],
     "needs 1 to --input-dim (1) values"),
    (["--product-order", "9"], "argument --product-order: '9': must be an integer between 1"),
])
def test_bad_rule_flags_are_one_line(argv: list[str], message: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "two.txt").write_text("1\n2\n")
    argv = [a.replace("NOPE", str(tmp_path / "nope")).replace("TWO", str(tmp_path / "two.txt"))
            for a in argv]
    try:
        code = solve_main(["--budget", "64", *argv])
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_search_plans_align_heads_so_a_uniform_layer_fills_the_budget() -> None:
    from alloc.settings import fitting_align

    assert fitting_align(128, 64) == 8 and fitting_align(128, 6) == 4  # not 6: 128 % 6 != 0
    assert fitting_align(36, 64) == 4 and fitting_align(7, 3) == 1
