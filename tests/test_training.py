"""``TrainConfig``: validated like ``ArchConfig`` (every broken rule, one line each), and the
one definition a search space's ``train:`` section is read against."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from arch import OPTIMIZERS, ConfigError, TrainConfig
from search_spaces import SpaceError, parse_space
from search_spaces.schema import FIXED_TRAIN_KEYS, TRAIN_KEYS

SPACE = {"name": "t", "budget": 32, "depth": 1, "layers": [{"heads": [2, 4]}]}


def test_a_space_may_set_exactly_the_trainers_fields_but_its_hardware() -> None:
    from dataclasses import fields

    assert set(TRAIN_KEYS) == {f.name for f in fields(TrainConfig)} - {"device", "compile"}
    assert set(FIXED_TRAIN_KEYS) <= set(TRAIN_KEYS)


def test_every_broken_rule_is_collected() -> None:
    with pytest.raises(ConfigError) as err:
        TrainConfig.from_dict({"optimizer": "sgd", "lr": 0, "warmup": 2.0, "steps": 0,
                               "device": "tpu"})
    assert sorted(err.value.problems) == sorted([
        "train.steps = 0: must be an integer >= 1", "train.lr = 0: must be a number > 0",
        "train.optimizer = 'sgd': must be one of adamw, lion",
        "train.warmup = 2.0: must be a number >= 0 and <= 1",
        "train.device = 'tpu': must be auto, cpu, cuda or cuda:N"])
    with pytest.raises(ConfigError, match=r"train\.momentum = 0\.9: unknown key"):
        TrainConfig.from_dict({"momentum": 0.9})
    assert TrainConfig().replace(optimizer="lion").optimizer == "lion"
    assert set(OPTIMIZERS) == {"adamw", "lion"}


@pytest.mark.parametrize("train, message", [
    ({"optimizer": "sgd"}, "train.optimizer = 'sgd': must be one of adamw, lion"),
    ({"optimizer": ["adamw", "sgd"]}, "train.optimizer = 'sgd'"),
    ({"lr": {"low": 1e-4, "high": 2.0}, "warmup": 1.5}, "train.warmup = 1.5"),
    ({"batch_size": 0.5}, "train.batch_size = 0.5: must be an integer >= 1"),
])
def test_a_space_with_a_bad_training_value_is_refused(train: dict[str, object],
                                                      message: str) -> None:
    with pytest.raises(SpaceError, match=message.replace("(", r"\(")):
        parse_space({**SPACE, "train": train})


def test_an_unknown_optimizer_in_a_space_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "sgd.yaml").write_text(
        "name: sgd\nbudget: 32\ndepth: 1\nlayers:\n  - heads: [2, 4]\n"
        "train: {optimizer: sgd}\n")
    proc = subprocess.run([sys.executable, "-m", "workers.search", "--space",
                           str(tmp_path / "sgd.yaml"), "--task", "ngram", "--smoke-test",
                           "--storage", f"sqlite:///{tmp_path / 's.db'}"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "train.optimizer = 'sgd': must be one of adamw, lion" in proc.stderr
    assert not (tmp_path / "s.db").exists()  # refused before any work


def test_the_width_rule_is_flat_to_the_reference_width_then_falls_as_one_over_width() -> None:
    from arch.training import LION_FACTOR, REFERENCE_LR, REFERENCE_WIDTH, width_lr

    assert width_lr(64) == width_lr(REFERENCE_WIDTH) == REFERENCE_LR
    assert width_lr(2 * REFERENCE_WIDTH) == pytest.approx(REFERENCE_LR / 2)
    assert width_lr(4 * REFERENCE_WIDTH) == pytest.approx(REFERENCE_LR / 4)
    assert width_lr(512, "lion") == pytest.approx(width_lr(512) * LION_FACTOR)


def test_an_explicit_lr_wins_over_the_width_rule() -> None:
    from arch.training import width_lr

    assert TrainConfig().lr is None
    assert TrainConfig().for_width(1024).lr == pytest.approx(width_lr(1024))
    assert TrainConfig(lr=3e-3).for_width(1024).lr == 3e-3
    assert TrainConfig.from_dict({"lr": None}).lr is None  # a space may leave it to the rule
    with pytest.raises(ConfigError, match="for_width"):
        TrainConfig().lr_at(0)
    schedule = TrainConfig(lr=1e-3, steps=100)
    assert schedule.lr_at(19) == pytest.approx(1e-3)  # the peak after 20% warmup
    assert schedule.lr_at(99) == pytest.approx(1e-3 * schedule.min_lr, rel=0.01)


def test_the_trainer_applies_the_width_rule() -> None:
    from arch import ArchConfig, HeadGroup, LayerSpec
    from arch.training import width_lr
    from workers.tasks import make_task
    from workers.training.trainer import Trainer

    arch = ArchConfig(d_model=512, max_seq_len=8, input_dim=8,
                      layers=(LayerSpec("mhsa", (HeadGroup(2, 256),)),))
    trainer = Trainer(arch, make_task("ngram", "smoke"), TrainConfig(steps=2, device="cpu"))
    assert trainer.config.lr == pytest.approx(width_lr(512))
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(width_lr(512))
