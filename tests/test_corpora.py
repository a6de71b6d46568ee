"""The corpora experiment's stages (experiments.corpora_stages): the grid read from an
earlier run's CSV (and refused in one line when it is not one), the finalists chosen, the plans
judged; and a smoke run whose stage 1 is a tiny generated CSV."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import optuna
import pytest

from experiments import corpora
from experiments.corpora_stages import Stage, finalists, judge, read_grid_csv
from studies import open_storage

HEADER = ["corpus", "heads_L0", "heads_L1", "loss_seed0", "loss_seed1", "rank"]


def write_rows(path: Path, rows: list[list[object]], header: list[str] = HEADER) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def smoke_rows(corpus: str = "docs") -> list[list[object]]:
    """The smoke grid (1 or 2 heads in layer 0, 1 in layer 1), two seeds."""
    return [[corpus, 1, 1, 5.50, 5.52, 2], [corpus, 2, 1, 5.40, 5.41, 1]]


def test_the_grid_csv_is_read_per_corpus(tmp_path: Path) -> None:
    path = write_rows(tmp_path / "grid.csv", smoke_rows() + smoke_rows("code"))
    stages = read_grid_csv(path, ["docs"], (1, 2), (1,))
    assert set(stages) == {"docs"}  # rows of corpora not asked for are skipped
    assert stages["docs"].losses == {(1, 1): {0: 5.50, 1: 5.52}, (2, 1): {0: 5.40, 1: 5.41}}
    assert stages["docs"].eval_se == ()


@pytest.mark.parametrize(("rows", "header", "message"), [
    (smoke_rows(), ["corpus", "heads_L0", "loss_seed0", "loss_seed1"], "no column heads_L1"),
    ([["docs", 1, 1]], ["corpus", "heads_L0", "heads_L1"], "no column loss_seed0"),
    ([["docs", 1, 1, "5.5", "abc"]], HEADER[:5], "line 2: loss_seed1 = 'abc': not a loss"),
    ([["docs", 1, 1, "5.5", "nan"]], HEADER[:5], "loss_seed1 = 'nan': not a loss"),
    ([["docs", 16, 1, "5.5", "5.6"]], HEADER[:5], "heads_L0 = '16': not a head count"),
    ([["docs", "x", 1, "5.5", "5.6"]], HEADER[:5], "heads_L0 = 'x'"),
    ([["code", 1, 1, "5.5", "5.6"]], HEADER[:5], "no row of corpus 'docs'"),
    (smoke_rows() + smoke_rows()[:1], HEADER, "line 4: docs 1 | 1 heads again"),
])
def test_a_bad_grid_csv_is_one_line_naming_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], rows: list[list[object]],
        header: list[str], message: str) -> None:
    path = write_rows(tmp_path / "grid.csv", rows, header)
    code = corpora.main(["--smoke-test", "--corpus", "docs", "--grid-csv", str(path),
                         "--out", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "--grid-csv" in err, err
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_a_missing_grid_csv_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    assert corpora.main(["--smoke-test", "--grid-csv", str(tmp_path / "none.csv"),
                         "--out", str(tmp_path / "out")]) == 2
    assert "cannot be read" in capsys.readouterr().err


def test_finalists_hold_the_top_quartile_and_the_plans_in_the_grid() -> None:
    rows = [{"heads_L0": h, "heads_L1": 1, "rank": h} for h in range(1, 11)]
    assert finalists(rows, 3, 2, [(9, 1), (2, 1), (32, 1)]) == [(1, 1), (2, 1), (3, 1), (9, 1)]
    # --finalists below the top quartile: the k-th best (the reference) is still in
    assert finalists(rows, 1, 4, []) == [(1, 1), (2, 1), (3, 1), (4, 1)]


def test_a_plan_is_judged_against_the_grids_kth_best_with_the_finalists_seeds() -> None:
    rows = [{"heads_L0": h, "heads_L1": 1, "rank": r, "loss": 1.0 + r / 100}
            for r, h in enumerate((4, 8, 2, 1), start=1)]
    offsets = (-0.002, 0.0, 0.002)
    final = Stage({(4, 1): {s: 1.00 + o for s, o in enumerate(offsets)},
                   (8, 1): {s: 1.01 + o for s, o in enumerate(offsets)},  # the reference
                   (2, 1): {s: 1.0105 + o for s, o in enumerate(offsets)},  # within the noise
                   (1, 1): {s: 1.05 + o for s, o in enumerate(offsets)}},  # 20 SEs worse
                  (0.0005,) * 12)
    judged = judge(rows, final, 2, {"one": (2, 1), "two": (1, 1), "three": (16, 16)})
    assert judged["reference"] == {"grid_point": [8, 1], "grid_rank": 2, "grid_loss": 1.02}
    assert judged["plans"]["one"]["top_quartile"] is True
    assert judged["plans"]["two"]["top_quartile"] is False
    assert judged["plans"]["two"]["p_worse"] < 0.05
    assert judged["plans"]["three"]["top_quartile"] is None  # beyond the grid: no verdict
    assert judged["noise"]["seed_sd"] == pytest.approx(0.002)
    assert judged["noise"]["text"] == "seed SD 0.0020, eval SE 0.0005 (0.25x)"
    by_point = {(r["heads_L0"], r["heads_L1"]): r for r in judged["rows"]}
    assert by_point[(8, 1)]["reference"] and by_point[(1, 1)]["not_worse"] is False
    assert by_point[(2, 1)]["plans"] == "one"


@pytest.mark.usefixtures("shared_ray")
def test_smoke_run_from_a_grid_csv_trains_only_the_finalists(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    grid = write_rows(tmp_path / "grid.csv", smoke_rows())
    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    code = corpora.main(["--smoke-test", "--corpus", "docs", "--grid-csv", str(grid), "--out",
                         str(out), "--finalist-seeds", "3", "--quiet", "--format", "json"])
    printed = capsys.readouterr()
    assert code == 0, printed.err[-3000:]
    result = json.loads(printed.out)["corpora"][0]
    assert [r["loss"] for r in result["rows"]] == pytest.approx([5.405, 5.51])  # the CSV's
    assert result["finalists"]["reference"]["grid_point"] == [2, 1]
    names = optuna.get_all_study_names(open_storage(f"sqlite:///{out / 'corpora.db'}"))
    assert names == ["corpora-docs-finalists"]  # no grid trained
    rows = list(csv.DictReader((out / "corpora_finalists.csv").open()))
    assert {(r["heads_L0"], r["heads_L1"], r["seeds"]) for r in rows} == {
        ("1", "1", "3"), ("2", "1", "3")}
    assert (out / "corpora.png").stat().st_size > 10_000
