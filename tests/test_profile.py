"""The data profile recovers the allocator's inputs where the truth is known (kernels of our own
tasks, a known input dimension, independent tokens), writes files alloc.solve accepts, and the
data -> profile -> plan -> training chain runs end to end. ``alloc.profile`` (no torch) measures
the statistics ``workers.profile`` measures, and refuses by name what needs a model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from alloc.profile import main as statistics_main
from alloc.profiling.datastats import data_statistics, fit_kernel, mutual_information
from alloc.profiling.spectra import variance_rank
from alloc.solve import main as solve_main
from userdata import DataSpec
from workers.profile import main
from workers.tasks import make_task
from workers.train import main as train_main


def kernel_data(tmp: Path, kernel: str, sequences: int = 400) -> Path:
    """x.npy / y.npy of our ``kernel`` task: y_t = sum_s rho(s) x_{t-s} + noise."""
    batch = make_task("kernel", "paper", 0, kernel=kernel).batch("train", 0, sequences)
    np.save(tmp / "x.npy", batch.x.numpy())
    np.save(tmp / "y.npy", batch.y.numpy())
    return tmp


@pytest.mark.parametrize("k", [2, 4, 8])
def test_ngram_kernels_are_recovered_exactly(k: int, tmp_path: Path) -> None:
    profile = data_statistics(DataSpec(str(kernel_data(tmp_path, f"ngram:{k}"))))
    best = profile.statistics.best
    assert best.spec == f"ngram:{k}" and best.r2 > 0.99


@pytest.mark.parametrize("lam", [0.1, 0.3])
def test_exponential_kernels_within_20_percent(lam: float, tmp_path: Path) -> None:
    profile = data_statistics(DataSpec(str(kernel_data(tmp_path, f"exp:{lam}"))))
    fit = next(f for f in profile.statistics.fits if f.form == "exp")
    assert profile.statistics.best.form == "exp" and fit.param == pytest.approx(lam, rel=0.2)


def test_a_known_input_dimension_within_20_percent(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    basis, _ = np.linalg.qr(rng.normal(size=(48, 12)))  # 12 dims inside 48
    x = (rng.normal(size=(300, 16, 12)) @ basis.T).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    profile = data_statistics(DataSpec(str(tmp_path / "x.npy")))
    assert profile.statistics.input_dim == pytest.approx(12, rel=0.2)
    assert profile.extra["data_input_dim"] == 48


def test_bias_correction_removes_the_information_of_independent_tokens() -> None:
    tokens = np.random.default_rng(0).integers(0, 40, (50, 2000))
    mi, pmi = mutual_information(tokens, 5)
    assert (mi < 0.002).all() and pmi.shape == (40, 40)  # 40 symbols, no empty 'rest'
    copied = tokens.copy()
    copied[:, 3:] = np.where(np.random.default_rng(1).random((50, 1997)) < 0.5,
                             copied[:, :-3], copied[:, 3:])  # x_t = x_{t-3} half the time
    mi, _ = mutual_information(copied, 6)
    assert mi[2] == max(mi) and mi[2] > 10 * mi[0]


def test_fits_and_energy_rank_on_exact_shapes() -> None:
    s = np.arange(1, 65, dtype=float)
    assert {f.form: round(f.param, 3) for f in fit_kernel(s ** -0.7)}["poly"] == 0.7
    # the rank at 90% energy of singular values: 9 + 1 >= 0.9 * 11
    assert variance_rank(np.array([3.0, 1.0, 1.0, 0.0]) ** 2, 0.9) == 2
    assert variance_rank(np.ones(10), 0.9) == 9


def test_text_corpus_profile_solve_and_train(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The acceptance chain: profile a text folder, plan from the profile, train on it."""
    import sysconfig

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:30]:
        (corpus / f"{path.stem}.txt").write_text(path.read_text())
    assert main(["--data", str(corpus), "--out", str(tmp_path / "p.yaml"), "--plot",
                 str(tmp_path / "p.png"), "--format", "json", "--seq-len", "64",
                 "--pilot-steps", "40", "--budget", "64"]) == 0
    report = json.loads(capsys.readouterr().out)
    saved = yaml.safe_load((tmp_path / "p.yaml").read_text())
    assert saved["allocator"] == report["allocator"] and saved["format"] == "text"
    assert (tmp_path / "p.kernel.txt").exists() and (tmp_path / "p.png").stat().st_size > 1e4
    assert report["kernel"]["values"][0] == 1.0 and 1 <= report["input_dim"] <= 65
    assert solve_main(["--budget", "64", "--profile", str(tmp_path / "p.yaml"), "--out",
                       str(tmp_path / "a.yaml"), "--layers", "2", "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["inputs"]["input_dim"] == report["allocator"]["input_dim"] == 64  # pilot width
    assert solve_main(["--budget", "64", "--profile", str(tmp_path / "p.yaml"),
                       "--input-dim", "32", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"]["input_dim"] == 32  # the flag wins
    assert train_main(["--arch", str(tmp_path / "a.yaml"), "--data", str(corpus),
                       "--smoke-test", "--format", "json", "--quiet"]) == 0
    trained = json.loads(capsys.readouterr().out)
    assert trained["task"] == "text" and trained["status"] == "completed"


@pytest.mark.parametrize("command", ["workers.profile", "alloc.profile"])
@pytest.mark.parametrize(("argv", "message"), [
    (["--data", "NOPE"], "no such file or folder"),
    (["--data", "EMPTY"], "the corpus is empty"),
    (["--data", "EMPTY", "--out", "/no/such/dir/p.yaml"], "does not exist"),
])
def test_bad_input_is_one_line_and_writes_nothing(command: str, argv: list[str], message: str,
                                                  tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty.txt").write_text("")
    argv = [str(tmp_path / "nope") if a == "NOPE" else str(tmp_path / "empty.txt")
            if a == "EMPTY" else a for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "p.yaml")]
    run = main if command == "workers.profile" else statistics_main
    assert run([*argv, "--no-pilot"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and err.startswith(f"{command}: "), err
    assert not (tmp_path / "p.yaml").exists()


def test_both_commands_measure_the_same_statistics(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``alloc.profile --no-pilot`` is ``workers.profile --no-pilot`` without torch: the same
    report and the same files; vector data (no pilot) needs no ``--no-pilot``."""
    (tmp_path / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 300)
    kernel_data(tmp_path, "ngram:3", sequences=40)
    reports = {}
    for name, run in (("torch", main), ("statistics", statistics_main)):
        out = tmp_path / name / "p.yaml"
        out.parent.mkdir()
        for data, extra in ((tmp_path / "a.txt", ["--no-pilot"]), (tmp_path / "x.npy", [])):
            assert run(["--data", str(data), *extra, "--out", str(out), "--format", "json",
                        "--seq-len", "16"]) == 0
            report = json.loads(capsys.readouterr().out)
            report.pop("wall_s")
            reports[name, data.suffix] = report, {  # the YAML is the report, with wall_s
                f.name: f.read_text() for f in sorted(out.parent.glob("p.*.txt"))}
    assert reports["torch", ".txt"] == reports["statistics", ".txt"]
    assert reports["torch", ".npy"] == reports["statistics", ".npy"]


@pytest.mark.parametrize("argv", [["--checkpoint", "c.pt"],
                                  ["--checkpoint", "c.pt", "--data", "TEXT", "--no-pilot"]])
def test_alloc_profile_refuses_a_checkpoint_by_name(argv: list[str], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A trained model's profile is ``workers.profile``'s (with the task's flags, which this
    command does not take): one line naming the flag and that command, exit 2, nothing run."""
    (tmp_path / "a.txt").write_text("some text " * 500)
    argv = [str(tmp_path / "a.txt") if a == "TEXT" else a for a in argv]
    assert statistics_main([*argv, "--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("alloc.profile: error: --checkpoint"), err
    assert "python -m workers.profile" in err
    assert not (tmp_path / "p.yaml").exists()


def test_alloc_profile_hands_the_pilot_to_workers_profile(tmp_path: Path,
                                                         capfd: pytest.CaptureFixture[str]
                                                         ) -> None:
    """Token data gets a pilot by default: ``alloc.profile`` (no torch imported) runs
    ``workers.profile`` with the same flags in a child process, whose profile and exit code are
    the command's; a pilot flag with vector data is refused there in one line, exit 2."""
    (tmp_path / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 300)
    out = tmp_path / "p.yaml"
    assert statistics_main(["--data", str(tmp_path / "a.txt"), "--seq-len", "16",
                            "--pilot-steps", "2", "--budget", "16", "--out", str(out),
                            "--format", "json"]) == 0
    printed = capfd.readouterr()
    assert printed.err.startswith("alloc.profile: the pilot trains a model with torch: running "
                                  "python -m workers.profile"), printed.err
    report = json.loads(printed.out)
    assert report["pilot"]["steps"] == 2 and yaml.safe_load(out.read_text())["pilot"] == report[
        "pilot"]
    kernel_data(tmp_path, "ngram:3", sequences=4)
    assert statistics_main(["--data", str(tmp_path / "x.npy"), "--pilot-steps", "5",
                            "--quiet"]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and err.startswith("workers.profile: error: --pilot-steps 5"), err
