"""How a model is trained: ``TrainConfig``, frozen and validated like ``ArchConfig`` (every
broken rule collected into one ``ConfigError``), without torch so that search spaces, the driver
and the trainer share one definition."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from arch.checks import (
    check_keys,
    field_names,
    field_values,
    need_bool,
    need_choice,
    need_int,
    need_number,
)
from arch.errors import ConfigError
from common.errors import excerpt

Optimizer = Literal["adamw", "lion"]
OPTIMIZERS: tuple[Optimizer, ...] = get_args(Optimizer)
# "auto" picks CUDA when there is one; "cuda:N" names a device.
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")
# ``--smoke-test`` sizes (TrainConfig fields over its defaults): a training run that checks the
# code in seconds, and a search trial, twice as long and as wide so that the scheduler's
# rungs (every ``eval_every``) have four evaluations to judge.
SMOKE_TRAIN = {"steps": 20, "batch_size": 8, "eval_every": 10, "eval_batches": 2}
SMOKE_TRIAL = {**SMOKE_TRAIN, "steps": 40, "batch_size": 16}


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings; ``warmup`` is a fraction of ``steps``, ``min_lr`` of ``lr``."""

    steps: int = 1000
    batch_size: int = 64
    lr: float = 1e-3
    optimizer: Optimizer = "adamw"
    weight_decay: float = 0.1
    warmup: float = 0.05
    min_lr: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 4
    seed: int = 0
    device: str = "auto"
    compile: bool = False

    # Fields the process that runs the training sets (its hardware), not the experiment: a
    # search space may set every other field.
    RUNTIME_FIELDS = ("device", "compile")

    def __post_init__(self) -> None:
        problems = self.problems(field_values(self))
        if problems:
            raise ConfigError(problems)

    @staticmethod
    def problems(values: dict[str, Any], path: str = "") -> list[str]:
        """Every rule the given field values break, as ``path.field = value: rule`` lines
        (fields not given are not checked)."""
        problems: list[str] = []
        for name, value in values.items():
            _RULES[name](problems, f"{path}.{name}" if path else name, value)
        return problems

    @classmethod
    def experiment_fields(cls) -> tuple[str, ...]:
        """The fields a search space's ``train:`` section may set."""
        return tuple(f for f in field_names(cls) if f not in cls.RUNTIME_FIELDS)

    def lr_at(self, step: int) -> float:
        """Linear warmup to ``lr``, then cosine decay to ``min_lr * lr`` at the last step."""
        warm = max(1, round(self.warmup * self.steps))
        if step < warm:
            return self.lr * (step + 1) / warm
        progress = (step - warm) / max(1, self.steps - warm)
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return self.lr * (self.min_lr + (1 - self.min_lr) * cosine)

    def to_dict(self) -> dict[str, Any]:
        return field_values(self)

    @classmethod
    def from_dict(cls, data: Any, path: str = "train") -> TrainConfig:
        """A config from a mapping of its fields; unknown keys and every broken rule raise one
        ``ConfigError``."""
        check_keys(data, field_names(cls), path)
        problems = cls.problems(data, path)
        if problems:
            raise ConfigError(problems)
        return cls(**data)

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with ``changes`` applied (validated)."""
        return TrainConfig.from_dict({**self.to_dict(), **changes})


def _need_device(problems: list[str], path: str, value: Any) -> None:
    if not (isinstance(value, str) and _DEVICE.fullmatch(value)):
        problems.append(f"{path} = {excerpt(value)}: must be auto, cpu, cuda or cuda:N")


# field -> check(problems, path, value)
_RULES: dict[str, Callable[[list[str], str, Any], object]] = {
    "steps": lambda p, k, v: need_int(p, k, v, 1),
    "batch_size": lambda p, k, v: need_int(p, k, v, 1),
    "lr": lambda p, k, v: need_number(p, k, v, 0, strict=True),
    "optimizer": lambda p, k, v: need_choice(p, k, v, OPTIMIZERS),
    "weight_decay": lambda p, k, v: need_number(p, k, v, 0),
    "warmup": lambda p, k, v: need_number(p, k, v, 0, 1),
    "min_lr": lambda p, k, v: need_number(p, k, v, 0, 1),
    "grad_clip": lambda p, k, v: need_number(p, k, v, 0, strict=True),
    "eval_every": lambda p, k, v: need_int(p, k, v, 1),
    "eval_batches": lambda p, k, v: need_int(p, k, v, 1),
    "seed": lambda p, k, v: need_int(p, k, v, 0),
    "device": _need_device,
    "compile": need_bool,
}
