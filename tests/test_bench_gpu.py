"""bench.gpu, kept working between GPU loans: its CPU smoke run in an environment that holds only
the GPU image's packages measures every part (and imports nothing else, lazily neither), a
missing package or a bad flag stops it before any work, a part past its limit keeps what it
measured, the FLOPs and goals are the formulas', and the search step's wheels travel in pieces
that install whole."""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from arch import ATTENTION_KINDS
from bench.gpu import cli, report, search
from bench.gpu.image import image_venv, normalize, read_image
from bench.gpu.plan import BASE_MODULES, MODULES, SMOKE, Context, PartResult, TimeLimit
from bench.gpu.speed import KINDS, REFERENCE, stack, train_flops_per_token
from bench.throughput import Shape

ROOT = Path(__file__).resolve().parents[1]
OURS = {"alloc", "arch", "bench", "common", "search_spaces", "studies", "userdata", "workers"}
# Lazy imports of loaded modules on paths bench.gpu never takes, on any device.
OFF_THE_GPU_PATH = {"workers.checkpoints.gguf": {"gguf"}}  # only for a .gguf file
# Runs the command, then writes which of our modules the process loaded.
WRAPPER = f"""
import json, sys
from bench.gpu.cli import main
code = main(sys.argv[2:])
ours = {sorted(OURS)!r}
with open(sys.argv[1], "w") as f:
    json.dump(sorted(m for m in sys.modules if m.split(".")[0] in ours), f)
sys.exit(code)
"""


@pytest.fixture(scope="module")
def image_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An interpreter whose environment holds only the GPU image's packages."""
    return image_venv(tmp_path_factory.mktemp("image") / "venv")


def image_modules() -> set[str]:
    """Top-level modules of the image's distributions installed here."""
    packages = read_image().packages
    return {top for top, dists in importlib.metadata.packages_distributions().items()
            if any(normalize(d) in packages for d in dists)}


def imported_roots(path: Path) -> set[str]:
    """Every top-level module a file imports, lazily too (relative imports left out)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def outside_the_image(modules: list[str]) -> dict[str, set[str]]:
    """Of our modules, those that import (anywhere in their file, on any branch: a CUDA one
    the CPU run does not take) a package outside the image: module -> the packages."""
    allowed = image_modules() | set(sys.stdlib_module_names) | OURS
    bad = {}
    for name in modules:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        extra = imported_roots(Path(spec.origin)) - allowed
        if extra:
            bad[name] = extra
    return bad


def test_the_smoke_run_in_the_gpu_image_measures_every_part(image_python: Path,
                                                            tmp_path: Path) -> None:
    """``python -m bench.gpu --device cpu --smoke-test`` with only the image's packages: every
    part ends ok with its rows, the docs section is filled with the report's Markdown, and no
    module it loaded imports a package the image lacks."""
    docs = tmp_path / "benchmarks.md"
    docs.write_text(f"# Benchmarks\n\n## GPU\n\n{report.BEGIN}\nold\n{report.END}\n\n## After\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_MODULES_CACHE": str(tmp_path / "hf")}
    out, loaded = tmp_path / "out", tmp_path / "modules.json"
    done = subprocess.run([str(image_python), "-c", WRAPPER, str(loaded), "--device", "cpu",
                           "--smoke-test", "--out", str(out), "--docs", str(docs), "--format",
                           "json", "--quiet"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(done.stdout)
    assert data == json.loads((out / "gpu.json").read_text())
    parts = {p["name"]: p for p in data["parts"]}
    assert list(parts) == list(cli.PARTS)
    assert {n: p["status"] for n, p in parts.items()} == dict.fromkeys(cli.PARTS, "ok")
    for name in ("throughput", "compiled"):
        rows = parts[name]["rows"]
        assert [r["variant"] for r in rows] == [REFERENCE, *KINDS]
        assert all(r["tokens_per_s"] > 0 and r["warm_s"] > 0 for r in rows)
    checks = parts["checks"]["rows"]
    assert all(r["passed"] for r in checks)
    assert {r["kind"] for r in checks if r["check"] == "cpu (float32) vs cpu"} == set(
        ATTENTION_KINDS)
    suite = parts["suite"]["rows"][0]
    assert suite["passed"] > 0 and suite["failed"] == 0
    parity = parts["parity"]["rows"]
    assert len(parity) == 3 and all(r["passed"] for r in parity)
    decode = {r["model"]: r for r in parts["decode"]["rows"]}
    assert decode["compact"]["kv_vs_teacher"] <= 0.5 and decode["latent"]["kv_vs_teacher"] <= 0.25
    assert all(r["decode_tokens_per_s"] > 0 for r in decode.values())
    trained = parts["training"]["rows"]
    assert [r["status"] for r in trained] == ["completed", "completed"]
    assert all(r["val_loss"] < math.log(256) for r in trained)  # below a uniform guess
    text = docs.read_text()
    assert text == (f"# Benchmarks\n\n## GPU\n\n{report.BEGIN}\n"
                    f"{(out / 'gpu.md').read_text()}{report.END}\n\n## After\n")
    before = docs.read_text()  # rendered again from the report: the same section, once
    assert cli.main(["--render", str(out / "gpu.json"), "--docs", str(docs), "--quiet"]) == 0
    assert docs.read_text() == before
    modules = json.loads(loaded.read_text())
    assert "workers.training.trainer" in modules and "bench.gpu.students" in modules
    assert outside_the_image(modules) == {
        m: p for m, p in OFF_THE_GPU_PATH.items() if m in modules}


def test_the_image_environment_lacks_the_search_packages(image_python: Path,
                                                         tmp_path: Path) -> None:
    """The environment really is the image's: Optuna does not import there, and the search
    step's ``run`` says what to carry in one line (exit 2)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    probe = subprocess.run([str(image_python), "-c", "import optuna"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode == 1 and "No module named 'optuna'" in probe.stderr
    done = subprocess.run([str(image_python), "-m", "bench.gpu.search", "run", "--site",
                           str(tmp_path / "site"), "--out", str(tmp_path / "out")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "missing packages: ray, optuna, sqlalchemy" in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_image_list_is_dated_and_holds_what_the_parts_import() -> None:
    image = read_image()
    assert len(image.date) == 10 and image.date[4] == "-" and image.python.startswith("3.12")
    assert {"torch", "transformers", "safetensors", "numpy", "scipy", "pyyaml",
            "pytest"} <= image.packages
    assert image.lacks(["ray", "optuna", "sqlalchemy", "psycopg", "torch"]) == [
        "ray", "optuna", "sqlalchemy", "psycopg"]
    needed = set(BASE_MODULES) | {m for ms in MODULES.values() for m in ms}
    assert needed <= image_modules()


def test_a_missing_package_stops_before_any_work(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers" else find_spec(name, *a))
    out = tmp_path / "out"
    assert cli.main(["--device", "cpu", "--smoke-test", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "transformers (parity, decode)" in err
    assert "carry their wheels for Python 3.12.3" in err and not out.exists()
    args = cli.build_parser().parse_args(["--device", "cpu", "--parts", "throughput,training"])
    cli.preflight(args)  # the parts that do not need it run


@pytest.mark.parametrize(("argv", "message"), [
    (["--parts", "throughput,bogus"], "--parts: 'throughput,bogus': parts are suite"),
    (["--minutes", "0"], "--minutes"),
    (["--docs", "NOMARKERS"], "needs the markers"),
    (["--arch", "BADARCH"], "d_model"),
    (["--render", "MISSING.json"], "MISSING.json"),
])
def test_bad_input_is_one_line_before_any_work(argv: list[str], message: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "NOMARKERS").write_text("# no section here\n")
    (tmp_path / "BADARCH").write_text("layers: []\n")
    argv = [str(tmp_path / a) if a.isupper() or a.endswith(".json") else a for a in argv]
    out = tmp_path / "out"
    assert exit_code(["--device", "cpu", "--smoke-test", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not out.exists() and (tmp_path / "NOMARKERS").read_text() == "# no section here\n"


def exit_code(argv: list[str]) -> int:
    """``cli.main``'s exit code, argparse's own exits included."""
    try:
        return cli.main(argv)
    except SystemExit as stop:
        return int(stop.code or 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where CUDA is absent")
def test_without_cuda_the_default_device_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--out", "never-written"]) == 2
    assert "--device cuda: no CUDA device" in capsys.readouterr().err
    assert not Path("never-written").exists()


def test_the_shipped_docs_hold_the_section() -> None:
    doc, start, end = report.fill_docs_check(ROOT / "docs" / "benchmarks.md")
    assert "## GPU" in doc[:start] and start < end


def context() -> Context:
    return Context("cpu", SMOKE, Path("."), Path("."), "eager", None, True)


def test_a_part_past_its_budget_keeps_what_it_measured() -> None:
    def slow(ctx: Context, result: PartResult, limit: TimeLimit, say: Any) -> None:
        result.rows.append({"measured": 1})
        while True:
            limit.check("the second row")
            time.sleep(0.01)

    result = cli.run_part(context(), "slow", slow, 0.2, lambda _: None)
    assert result.status == "time_up" and result.rows == [{"measured": 1}]
    assert "before the second row" in result.notes[0] and result.seconds < 5


def test_a_part_that_never_checks_is_stopped_by_the_hard_stop() -> None:
    def stuck(ctx: Context, result: PartResult, limit: TimeLimit, say: Any) -> None:
        result.rows.append({"measured": 1})
        time.sleep(30)

    start = time.monotonic()
    result = cli.run_part(context(), "stuck", stuck, 0.2, lambda _: None, grace=0.3)
    assert result.status == "time_up" and result.rows == [{"measured": 1}]
    assert time.monotonic() - start < 5


def test_a_failing_part_is_one_line_and_the_next_part_runs() -> None:
    def broken(ctx: Context, result: PartResult, limit: TimeLimit, say: Any) -> None:
        raise ModuleNotFoundError("no", name="flash_attn")

    result = cli.run_part(context(), "broken", broken, 5.0, lambda _: None)
    assert result.status == "failed" and "missing package flash_attn" in result.notes[0]
    skipped = cli.run_part(context(), "late", broken, 0.0, lambda _: None)
    assert skipped.status == "skipped"


def test_flops_per_token_are_the_palm_count() -> None:
    """6 FLOPs per trained weight, 4 per frozen one, attention 3 x (2 T d for QK^T + 2 T d
    for AV) per layer at the full length; MixiT mixes without QK^T."""
    s = Shape(d_model=32, heads=4, layers=3, seq_len=16, batch=1, mlp_ratio=4.0)
    d, n, t = s.d_model, s.layers, s.seq_len
    mhsa = 6 * 12 * d * d * n + 12 * n * t * d  # qkv 3d^2, out d^2, MLP 8d^2
    assert train_flops_per_token(stack(s, "mhsa"), s, "mhsa") == mhsa
    assert train_flops_per_token(stack(s, REFERENCE), s, REFERENCE) == mhsa
    frozen = mhsa - 2 * 2 * d * d * n  # W_Q, W_K: no weight gradient
    assert train_flops_per_token(stack(s, "frozen_qk"), s, "frozen_qk") == frozen
    mixit = 6 * 10 * d * d * n + 6 * n * t * d  # v d^2, out d^2, MLP 8d^2; AV only
    assert train_flops_per_token(stack(s, "mixit"), s, "mixit") == mixit


def speed_row(variant: str, ratio: float, mfu: float | None = None) -> dict[str, Any]:
    return {"variant": variant, "vs_mhsa": ratio, "mfu": mfu}


def test_goals_read_the_measured_numbers() -> None:
    data = {"parts": [
        {"name": "throughput", "rows": [speed_row("mixit", 1.31), speed_row("frozen_qk", 1.1)],
         "notes": []},
        {"name": "compiled", "rows": [speed_row("mhsa", 1.0, 0.39), speed_row("mixit", 1.29)],
         "notes": []},
        {"name": "parity", "rows": [{"bf16_ratio": 1.5, "passed": True},
                                    {"bf16_ratio": 2.5, "passed": False}], "notes": []}]}
    goals = {g["goal"]: (g["measured"], g["met"]) for g in report.goal_rows(data)}
    assert goals["mhsa MFU with torch.compile >= 40%"] == ("39.0%", False)
    assert goals["mixit tokens/s >= 1.3x mhsa's (eager)"] == ("1.31x", True)
    assert goals["mixit tokens/s >= 1.3x mhsa's (compiled)"] == ("1.29x", False)
    assert goals["frozen_qk tokens/s >= 1.2x mhsa's (compiled)"] == ("-", None)
    parity = "bf16 logits within bf16 tolerance of transformers' (ratio <= 2)"
    assert goals[parity] == ("worst ratio 2.50 (2 models)", False)
    assert report.markdown_table(["a"], [["mhsa 1x64 | mssa 2x32"]]).endswith(
        "| mhsa 1x64 \\| mssa 2x32 |")


def fake_wheel(folder: Path, name: str, payload: bytes) -> Path:
    """A wheel holding module ``name`` whose ``DATA`` is ``payload`` (stored, uncompressed)."""
    path = folder / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    files = {f"{name}/__init__.py": f"DATA = {payload!r}\n".encode(),
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for file, data in files.items():
            z.writestr(file, data)
        z.writestr(f"{info}/RECORD", "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n")
    return path


def test_the_search_wheels_travel_in_pieces_and_install_whole(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wheels, carry, site = tmp_path / "wheels", tmp_path / "carry", tmp_path / "site"
    wheels.mkdir()
    big = os.urandom(1_500_000)  # more than the 1 MiB a call carries here: cut in two
    fake_wheel(wheels, "bigpkg", big)
    fake_wheel(wheels, "smallpkg", b"small")
    assert search.main(["pack", "--wheels", str(wheels), "--out", str(carry),
                        "--chunk-mib", "1"]) == 0
    calls = sorted(carry.glob("call-*"))
    assert len(calls) >= 2
    for folder in calls:
        pieces = [p for p in folder.iterdir() if p.name != search.MANIFEST]
        assert sum(p.stat().st_size for p in pieces) <= search.MIB
    capsys.readouterr()
    assert search.main(["install", "--carry", str(calls[0]), "--site", str(site)]) == 0
    assert "waiting for" in capsys.readouterr().out and not (site / "site").exists()
    for folder in calls[1:]:
        assert search.main(["install", "--carry", str(folder), "--site", str(site)]) == 0
    assert "installed 2 wheels" in capsys.readouterr().out
    probe = subprocess.run([sys.executable, "-c", "import bigpkg, hashlib; "
                            "print(hashlib.sha256(bigpkg.DATA).hexdigest())"],
                           env={**os.environ, "PYTHONPATH": str(site / "site")},
                           capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == hashlib.sha256(big).hexdigest()


def test_a_damaged_piece_or_folder_is_refused_by_name(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    wheels, carry = tmp_path / "wheels", tmp_path / "carry"
    wheels.mkdir()
    fake_wheel(wheels, "onepkg", b"x" * 1000)
    assert search.main(["pack", "--wheels", str(wheels), "--out", str(carry)]) == 0
    piece = next((carry / "call-1").glob("*.whl.0"))
    piece.write_bytes(piece.read_bytes()[:-1] + b"!")
    capsys.readouterr()
    assert search.main(["install", "--carry", str(carry / "call-1"), "--site",
                        str(tmp_path / "site")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and piece.name in err and "SHA-256" in err
    assert search.main(["install", "--carry", str(wheels), "--site",
                        str(tmp_path / "site")]) == 2
    assert "no manifest that pack wrote" in capsys.readouterr().err
    assert search.main(["pack", "--wheels", str(wheels), "--out", str(carry)]) == 2
    assert "holds call folders already" in capsys.readouterr().err
