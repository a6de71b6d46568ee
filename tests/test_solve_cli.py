"""``python -m alloc.solve``: outputs, files, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from alloc.solve import main
from arch import ArchConfig, HeadGroup

ROOT = Path(__file__).resolve().parents[1]


def test_table_is_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    """Without ``--format`` the command prints ``--format table``: the table of the very report
    ``--format json`` prints, a row per layer with its heads."""
    from alloc.solve import render

    assert main(["--budget", "512"]) == 0
    default = capsys.readouterr().out
    assert main(["--budget", "512", "--format", "table"]) == 0
    assert capsys.readouterr().out == default
    assert main(["--budget", "512", "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert default == render(rep) + "\n"
    rows = [line.split() for line in default.splitlines()]
    for layer in rep["layers"]:
        heads = "+".join(str(HeadGroup.from_dict(g)) for g in layer["heads"])
        assert [str(layer["index"]), layer["role"], layer["attention"], heads] in [
            row[:4] for row in rows], heads


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_machine_formats(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--budget", "256", "--format", fmt]) == 0
    out = capsys.readouterr().out
    data = json.loads(out) if fmt == "json" else yaml.safe_load(out)
    assert data["budget"] == 256
    assert ArchConfig.from_dict(data["arch"]).arch_id == data["arch_id"]


def test_out_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, plot = tmp_path / "arch.yaml", tmp_path / "tradeoff.png"
    assert main(["--budget", "512", "--out", str(out), "--plot", str(plot),
                 "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert ArchConfig.from_yaml(out.read_text()).to_dict() == rep["arch"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Written through a temporary file and a rename: nothing else left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["arch.yaml", "tradeoff.png"]


def test_out_is_never_overwritten_silently(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "arch.yaml"
    assert main(["--budget", "512", "--out", str(out)]) == 0
    assert capsys.readouterr().err == f"alloc.solve: wrote {out}\n"
    before = out.read_text()
    assert main(["--budget", "256", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("alloc.solve: error: --out ") and err.count("\n") == 1
    assert err.endswith(": exists; pass --force to overwrite it\n")
    assert out.read_text() == before
    assert main(["--budget", "256", "--out", str(out), "--force"]) == 0
    assert ArchConfig.from_yaml(out.read_text()).d_model == 256


BAD = [
    (["--budget", "0"], "--budget: '0': must be an integer between 1 and 65536"),
    (["--layers", "3", "--logit-bounds", "4,4,4"],
     "--logit-bounds: 3 values for 2 later layer(s) (--layers 3 - --extract-layers 1)"),
    (["--budget", "-8"], "--budget: '-8'"),
    (["--budget", "1.5"], "--budget: '1.5': must be an integer"),
    (["--budget", "65537"], "--budget: '65537'"),
    (["--align", "24"], "--align 24: must divide --budget 512"),
    (["--align", "128"], "--align 128: must be <= --input-dim (64)"),
    (["--kernel", "gauss:2"], "--kernel: unknown kernel 'gauss:2'"),
    (["--kernel", "ngram:x"], "--kernel: kernel 'ngram:x': parameter 'x' must be"),
    (["--input-dim", "0"], "--input-dim: '0': must be an integer"),
    (["--tolerance", "0"], "--tolerance: '0': must be a number > 0"),
    (["--tolerance", "-1"], "--tolerance: '-1'"),
    (["--extract-layers", "7"], "--extract-layers 7: must be <= --layers 6"),
    (["--spectrum", "power:-2"], "--spectrum: spectrum 'power:-2'"),
    (["--attention", "linear"], "--attention: invalid choice: 'linear'"),
    (["--mlp-ratio", "0.001"], "--mlp-ratio 0.001: mlp-ratio * budget"),
]


def run(argv: list[str]) -> int:
    """``main``'s exit code, whether it returns it or argparse exits with it."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)


@pytest.mark.parametrize(("argv", "message"), BAD)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
        argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "arch.yaml"
    assert run([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("alloc.solve: error: ")
    assert message in err, err
    assert not out.exists()


def test_malformed_kernel_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "k.txt"
    bad.write_text("1\n2\nthree\n")
    assert main(["--kernel", f"file:{bad}", "--out", str(tmp_path / "a.yaml")]) == 2
    err = capsys.readouterr().err
    assert "--kernel: kernel file" in err and "line 3: 'three' is not a number" in err
    assert err.count("\n") == 1 and not (tmp_path / "a.yaml").exists()


def test_missing_output_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--out", str(tmp_path / "no" / "a.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_module_runs_without_torch_or_ray() -> None:
    code = ("import sys, runpy; sys.argv = ['alloc.solve', '--budget', '512'];\n"
            "try:\n    runpy.run_module('alloc.solve', run_name='__main__')\n"
            "except SystemExit as e:\n    assert e.code == 0, e.code\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray', "
            "'matplotlib', 'scipy'))\nassert not heavy, heavy\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "8x64" in result.stdout
    help_text = subprocess.run([sys.executable, "-m", "alloc.solve", "--help"], cwd=ROOT,
                               capture_output=True, text=True, timeout=60).stdout
    assert "--budget" in help_text and "default: 512" in help_text



@pytest.mark.parametrize("argv", [["--order", "1e6"], ["--alpha", "1e6"],
                                  ["--c-head", "1e300"], ["--order", "30", "--alpha", "0.5"]])
def test_constants_that_overflow_the_bound_are_refused_not_solved_to_nan(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy overflow on the way to the message
        assert main(["--budget", "512", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "must stay <= 1e+100" in err and len(err.splitlines()) == 1, err


def test_large_finite_constants_still_solve_without_warnings(
        capsys: pytest.CaptureFixture[str]) -> None:
    import math
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["--budget", "512", "--c-proj", "1e99", "--c-head", "1e95",
                     "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert all(math.isfinite(layer["predicted_error"]) for layer in report["layers"])


@pytest.mark.parametrize(("argv", "kv"), [(["--budget", "512"], 2),
                                          (["--budget", "512", "--uniform"], 8),
                                          (["--budget", "256", "--kernel", "ngram:4",
                                            "--input-dim", "32", "--layers", "3"], 1)])
def test_kv_heads_are_kept_in_every_layer(argv: list[str], kv: int, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``--kv-heads N``: every layer of the plan reads exactly N key/value heads, its groups'
    shares proportional to their query heads, later layers too (their qk_dim shrinks, their
    key/value heads stay); the written architecture is the reported one."""
    out = tmp_path / "arch.yaml"
    assert main([*argv, "--kv-heads", str(kv), "--format", "json", "--out", str(out)]) == 0
    rep = json.loads(capsys.readouterr().out)
    arch = ArchConfig.from_yaml(out.read_text())
    assert arch.to_dict() == rep["arch"]
    for layer, row in zip(arch.layers, rep["layers"]):
        assert layer.kv_heads == kv == row["kv_heads"]
        per = {g.count // g.kv_heads for g in layer.heads}
        assert per == {layer.n_heads // kv}  # each key/value head serves as many query heads
    assert rep["totals"]["kv_width"] == arch.kv_width
    assert main([*argv, "--kv-heads", str(kv)]) == 0
    table = capsys.readouterr().out
    assert all(f"  {x.heads_str}  " in table for x in arch.layers)  # 8x64kv2: shown


def test_no_kv_heads_flag_leaves_the_plan_as_it_was(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--budget", "512", "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert all("kv_heads" not in g for row in rep["layers"] for g in row["heads"])
    assert all(row["kv_heads"] == sum(g["count"] for g in row["heads"]) for row in rep["layers"])


@pytest.mark.parametrize(("argv", "message"), [
    (["--budget", "512", "--kv-heads", "3"],
     "--kv-heads 3: the plan's layer has heads 8x64 (8 query heads); 3 key/value heads must "
     "divide 8"),
    (["--budget", "512", "--kv-heads", "16"], "--kv-heads 16: the plan's layer has heads 8x64"),
    (["--budget", "512", "--kv-heads", "2", "--attention", "mssa"],
     "--kv-heads 2: grouped key/value heads are for mhsa and frozen_qk layers, not "
     "--attention mssa"),
])
def test_impossible_kv_heads_are_one_line(argv: list[str], message: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "arch.yaml"
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not out.exists()


def test_a_profile_s_inputs_are_kept_unless_a_flag_gives_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--profile``: a deeper pilot's later layers are cut to the plan's; a flag given wins
    (abbreviated too), and a given input dimension replaces the measured input spectrum."""
    (tmp_path / "p.input.txt").write_text("".join(f"{0.8 ** i:.6g}\n" for i in range(16)))
    profile = tmp_path / "p.yaml"
    profile.write_text(yaml.safe_dump({"allocator": {
        "kernel": "exp:0.5", "input_dim": 16, "seq_len": 32, "spectrum": "power:1",
        "input_spectrum": "file:p.input.txt", "logit_bounds": [2.0, 3.0, 4.0, 5.0],
        "patterns": [2, 4, 4, 2]}}))

    def inputs(*argv: str) -> dict[str, object]:
        assert main(["--budget", "64", "--layers", "3", "--profile", str(profile),
                     "--format", "json", *argv]) == 0
        return dict(json.loads(capsys.readouterr().out)["inputs"])

    measured = inputs()
    assert (measured["logit_bounds"], measured["patterns"]) == ([2.0, 3.0], [2.0, 4.0])
    assert measured["input_spectrum"] == f"file:{tmp_path / 'p.input.txt'}"
    assert (measured["kernel"], measured["seq_len"], measured["input_dim"]) == ("exp:0.5", 32,
                                                                                16)
    given = inputs("--logit-bounds", "7", "--seq-len", "16", "--input-d", "8")
    assert (given["logit_bounds"], given["patterns"]) == ([7.0], [2.0, 4.0])
    assert (given["seq_len"], given["input_dim"], given["input_spectrum"]) == (16, 8, None)


def test_bad_profile_and_constants_files_name_the_field_or_the_flag(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The readers of a profile and a constants file name the field (``profile``,
    ``constants``); ``alloc.solve`` shows it as its flag."""
    from alloc.constants import read_constants
    from alloc.errors import ConstantsError, ProfileError
    from alloc.profiling.files import read_allocator_inputs

    bad = tmp_path / "bad.yaml"
    bad.write_text("allocator: {kernel: ngram:2}\n")
    with pytest.raises(ProfileError, match=r"^profile '.*bad\.yaml': needs an allocator"):
        read_allocator_inputs(bad)
    with pytest.raises(ConstantsError, match=r"^constants '.*bad\.yaml': unknown key"):
        read_constants(bad)
    for flag in ("--profile", "--constants"):
        assert main(["--budget", "64", flag, str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"alloc.solve: error: {flag} '") and err.count("\n") == 1, err
