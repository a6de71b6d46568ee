"""The training recipe decides (docs/guide/train.md, "The recipe"): a run whose warmup is too
short for its learning rate collapses its first layer's attention and stays on the loss plateau
(the docs corpus's failing seed at D = 128, lr 3e-3, 5% warmup); the recipe's 20% warmup
converges the same seed with its siblings. Here at a smaller size: D = 64 at twice the rule's
lr, 400 steps, on the documentation text every Python ships."""

from __future__ import annotations

from pathlib import Path

import pytest

from arch import ArchConfig, HeadGroup, LayerSpec, TrainConfig
from arch.training import width_lr

D = 64
LR = 2 * width_lr(D)  # too high for a short warmup at this width, as 3e-3 was at D = 128
OLD_WARMUP = 0.05  # the recipe before 2026-11-28


def final_loss(seed: int, warmup: float, folder: str) -> float:
    """Validation loss of a 2-layer D = 64 byte model (2 heads a layer, MLP 2x) after 400
    steps of 16 windows of 64 bytes of the documentation text."""
    from userdata import DataSpec
    from userdata.corpora import write_docs
    from workers.tasks import make_data_task
    from workers.training.trainer import train

    task = make_data_task(DataSpec(str(write_docs(Path(folder), 0.5))), length=64)
    layers = tuple(LayerSpec("mhsa", (HeadGroup(2, D // 2),), mlp_ratio=2) for _ in range(2))
    arch = ArchConfig(d_model=D, layers=layers, max_seq_len=64, vocab_size=256)
    config = TrainConfig(steps=400, batch_size=16, lr=LR, warmup=warmup, eval_every=400,
                         eval_batches=8, seed=seed, device="cpu")
    result = train(arch, task, config)
    assert result.val_loss is not None
    return result.val_loss


def test_the_recipe_converges_a_seed_that_the_short_warmup_leaves_on_the_plateau(
        tmp_path: Path) -> None:
    folder = str(tmp_path / "docs")
    new = TrainConfig().warmup
    sibling, same = final_loss(1, new, folder), final_loss(0, new, folder)
    before = final_loss(0, OLD_WARMUP, folder)
    # Measured (2026-11-28): recipe 1.955 (seed 0), 1.947 (seed 1); 5% warmup 2.202 (seed 0),
    # and with 5% warmup every seed of 0-3 ends at 2.20-2.23 (a 5% default fails the second line)
    assert abs(same - sibling) < 0.05, (same, sibling)
    assert before > sibling + 0.15, (before, sibling)


def test_a_study_is_resumed_only_under_the_recipe_that_trained_it() -> None:
    import optuna

    from arch.training import RECIPE
    from studies import records as rec
    from studies.trials import Direction
    from workers.errors import SearchError
    from workers.search.study import open_study

    storage = optuna.storages.InMemoryStorage()
    mine = {"task": "lm", "metric": "loss", "space_hash": "h", "task_fields": "{}",
            "steps": 10, "recipe": RECIPE}
    study = optuna.create_study(study_name="s", storage=storage)
    rec.set_study_attrs(study, **{**mine, "recipe": "warmup 0.05, lr 0.001"})
    study.add_trial(optuna.trial.create_trial(value=1.0))
    with pytest.raises(SearchError, match="recipe"):
        open_study("s", storage, "memory", mine, Direction.MINIMIZE, resume=True)
    study.set_user_attr("recipe", RECIPE)
    assert open_study("s", storage, "memory", mine, Direction.MINIMIZE,
                      resume=True).study_name == "s"


def test_recipe_seeds_reports_the_seed_sd_against_the_margin(
        capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from bench import recipe_seeds

    assert recipe_seeds.main(["--smoke-test", "--seeds", "0,1", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["recipe"] == "current" and len(out["losses"]) == 2
    assert out["sd_to_margin"] == out["seed_sd"] / (0.01 * out["mean"])
    assert recipe_seeds.main(["--heads", "3,2", "--smoke-test"]) == 2
    assert "--heads '3,2': each count must divide 128" in capsys.readouterr().err
