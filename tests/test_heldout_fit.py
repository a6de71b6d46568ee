"""The held-out protocol's fitting step (experiments.heldout_fit): the bound's constants
fitted on the development corpora's ledgers only (a held-out row is refused), and ``heldout
--constants``, which plans with them, reuses the rules' trainings and names its tables for the
file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from alloc import HEURISTICS, read_constants
from arch import ArchConfig, HeadGroup, LayerSpec
from common.errors import UsageError
from experiments import heldout, heldout_fit
from experiments.heldout_report import PLAN
from userdata.corpora import ProtocolError


def plan_arch() -> ArchConfig:
    first = LayerSpec("mhsa", (HeadGroup(3, 16), HeadGroup(2, 8)), 2.0)
    return ArchConfig(
        d_model=64,
        layers=(first, LayerSpec("mhsa", (HeadGroup(2, 32),), 2.0)),
        max_seq_len=64,
        vocab_size=256,
    )


def ledger(corpus: str, arms: dict[str, ArchConfig], seeds: int = 3) -> list[dict[str, str]]:
    """Rows as the experiment writes them: each distinct model once per seed, its loss 2 + a
    per-model offset + 0.01 x seed."""
    rows, seen = [], set()
    for k, (label, arch) in enumerate(arms.items()):
        if arch.arch_id in seen:
            continue
        seen.add(arch.arch_id)
        rows += [
            {
                "corpus": corpus,
                "model": label,
                "arch": arch.describe(),
                "arch_id": arch.arch_id,
                "seed": str(s),
                "recipe": "r",
                "val_loss": str(2 + 0.1 * k + 0.01 * s),
                "status": "completed",
            }
            for s in range(seeds)
        ]
    return rows


def test_each_distinct_arm_is_one_observation_of_its_first_layer_and_mean_loss() -> None:
    arms = heldout.models(plan_arch())
    obs = heldout_fit.ledger_observations(ledger("code", arms), arms, 3)
    distinct = {a.arch_id: a for a in arms.values()}
    assert len(obs) == len(distinct) < len(arms)  # rules that share a model count once
    by_label = {o.label: o for o in obs}
    for arch in distinct.values():
        o = by_label[arch.describe()]
        assert o.layer == arch.layers[0] and o.trials == 3
    first = by_label[plan_arch().describe()]
    assert first.loss == pytest.approx(2.01)  # the mean of 2.00, 2.01, 2.02


@pytest.mark.parametrize("corpus", ["stubs", "mine"])  # registered held-out, or a user's
def test_a_held_out_row_never_enters_the_fit(corpus: str) -> None:
    arms = heldout.models(plan_arch())
    rows = ledger("code", arms)
    rows.append({**rows[0], "corpus": corpus})
    with pytest.raises(ProtocolError, match=f"'{corpus}' is a held-out corpus"):
        heldout_fit.ledger_observations(rows, arms, 3)


def test_an_arm_missing_a_seed_is_refused() -> None:
    arms = heldout.models(plan_arch())
    rows = [r for r in ledger("docs", arms) if not (r["model"] == PLAN and r["seed"] == "2")]
    with pytest.raises(UsageError, match="no finite loss on every seed 0-2"):
        heldout_fit.ledger_observations(rows, arms, 3)


# --- end to end at smoke size --------------------------------------------------------------------


def run(
    module: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str
) -> dict[str, Any]:
    code = module.main(
        ["--smoke-test", "--quiet", "--format", "json", "--out", str(tmp_path / "out"), *flags]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return dict(json.loads(captured.out))


def test_fit_on_development_then_plan_held_out_with_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run(heldout, tmp_path, capsys, "--set", "development")
    constants = tmp_path / "dev-fit.yaml"
    fitted = run(heldout_fit, tmp_path, capsys, "--write", str(constants))
    assert {r["corpus"] for r in fitted["observations"]} == {"code", "docs", "records"}
    assert fitted["design"] == "difference"  # one width: only n - m
    assert read_constants(constants).as_flags() == {
        k: fitted["fits"]["fitted"][k] for k in ("c_proj", "c_head", "order", "width_order")
    }
    out = tmp_path / "out"
    before = {p.name: p.read_bytes() for p in out.glob("heldout*")}

    trained: list[str] = []
    train_one = heldout.train_one

    def record(*args: Any) -> dict[str, Any]:
        trained.append(args[4])  # the label
        return train_one(*args)

    monkeypatch.setattr(heldout, "train_one", record)
    result = run(heldout, tmp_path, capsys, "--set", "development", "--constants", str(constants))
    assert set(trained) <= {PLAN}  # the rules' trainings are the ledgers'
    assert result["constants"]["file"] == str(constants)
    plans = {p["corpus"]: p["fitted"] for p in fitted["plans"]}
    assert {c["corpus"]: c["plan"] for c in result["corpora"]} == plans
    assert all(c["best"] in HEURISTICS for c in result["corpora"])
    for name in ("heldout-dev-fit.txt", "heldout-dev-fit.csv", "heldout-dev-fit_corpora.csv"):
        assert (out / name).stat().st_size > 0
    assert {p.name: p.read_bytes() for p in out.glob("heldout*") if p.name in before} == before
    # constants under which one wide head wins (m > n, docs/theory.md §2.3): the plan moves
    wide = tmp_path / "wide.yaml"
    wide.write_text("c_proj: 1.0\nc_head: 1.0\norder: 1.0\nwidth_order: 6.0\n")
    trained.clear()
    moved = run(heldout, tmp_path, capsys, "--corpus", "docs", "--constants", str(wide))
    assert moved["corpora"][0]["plan"].startswith("mhsa 1x16 ")
    assert set(trained) <= {PLAN} and (out / "heldout-wide.txt").exists()


def test_a_bad_constants_file_is_one_line_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = heldout.main(
        ["--smoke-test", "--out", str(tmp_path / "out"), "--constants", str(tmp_path / "nope.yaml")]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "cannot read" in err, err
    assert not (tmp_path / "out").exists()
