"""bench.width_order: the grids it reads, and bad input in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import width_order


def write_noise(path: Path) -> None:
    rows = ["table,arch,point,table_value,mean"]
    for heads, mlp, value in ((1, 2.0, 0.04), (4, 2.0, 0.042), (4, 0.0, 0.055)):
        point = {"L0.g0.count": heads, "L0.g0.v_dim": 256 // heads, "L0.mlp_ratio": mlp}
        rows.append(f"ngram,x,\"{json.dumps(point).replace(chr(34), chr(34) * 2)}\",{value},"
                    f"{value + 0.001}")
    rows.append("lm,x,\"{}\",1.5,1.5")
    path.write_text("\n".join(rows) + "\n")


def test_reads_the_ngram_points_with_an_mlp(tmp_path: Path) -> None:
    path = tmp_path / "noise.csv"
    write_noise(path)
    seed0 = width_order.ngram_observations(path, "table_value")
    assert [(o.label, o.loss) for o in seed0] == [("1x256", 0.04), ("4x64", 0.042)]
    assert all(o.layer.mlp_ratio == 2.0 for o in seed0)
    assert [o.loss for o in width_order.ngram_observations(path, "mean")] == pytest.approx(
        [0.041, 0.043])


def test_reads_the_tradeoff_grid(tmp_path: Path) -> None:
    path = tmp_path / "tradeoff.csv"
    path.write_text("heads,head_dim,trials,best_trial,best_loss\n1,256,4,2,0.05\n4,64,4,9,0.03\n")
    obs = width_order.tradeoff_observations(path)
    assert [(o.label, o.loss, o.trials) for o in obs] == [("1x256", 0.05, 4), ("4x64", 0.03, 4)]
    assert all(o.layer.mlp_ratio == 0.0 for o in obs)


def test_a_missing_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert width_order.main(["--noise", str(tmp_path / "none.csv")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--noise" in err and "no such file" in err
