"""bench.throughput runs at smoke size and compares every kind with PyTorch's layer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.throughput import KINDS, main


def test_smoke_run_reports_every_variant(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--smoke-test", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    names = [r["variant"] for r in rows]
    assert names[0] == "torch TransformerEncoderLayer" and set(KINDS) <= set(names)
    assert all(r["tokens_per_s"] > 0 for r in rows)
    by_name = {r["variant"]: r for r in rows}
    # Equal size: PyTorch's layer differs only by our LayerNorm biases (2 per block).
    assert by_name["mhsa"]["total_params"] - rows[0]["total_params"] == 2 * 64


def test_whole_models_from_arch_files_are_timed_against_the_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--arch``: each file's whole model, its parameters those of the built module, the
    ratios against the first; an unreadable file is one line, exit 2."""
    from arch import ArchConfig, HeadGroup, LayerSpec
    from workers.models import build_model, count_params

    def arch(qk: int) -> ArchConfig:
        return ArchConfig(d_model=32, max_seq_len=16, vocab_size=64, layers=(
            LayerSpec("mhsa", (HeadGroup(2, 16, 16),)), LayerSpec("mhsa", (HeadGroup(2, qk, 16),))))

    paths = []
    for qk in (16, 4):
        paths.append(tmp_path / f"qk{qk}.yaml")
        paths[-1].write_text(arch(qk).to_yaml())
    assert main(["--arch", str(paths[0]), "--arch", str(paths[1]), "--rounds", "1",
                 "--steps", "1", "--batch-size", "2", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["variant"].split(":")[0] for r in rows] == ["qk16", "qk4"]
    assert rows[0]["vs_mhsa"] == 1.0 and all(r["tokens_per_s"] > 0 for r in rows)
    assert [r["trainable_params"] for r in rows] == [
        count_params(build_model(arch(qk)))[0] for qk in (16, 4)]
    (tmp_path / "bad.yaml").write_text("d_model: [")
    with pytest.raises(SystemExit) as exit_:
        main(["--arch", str(tmp_path / "bad.yaml")])
    assert exit_.value.code == 2 and "--arch" in capsys.readouterr().err
