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

# The recipe (docs/guide/train.md has the measurement). A warmup of 20% of the steps: with 5%,
# an AdamW run at 3e-3 on real text (D = 128, 900 steps) takes steps that collapse its first
# layer's attention (entropy 3.2 -> 1.3 nats by step 100) on some initial weights, which then
# sit on the loss plateau hundreds of steps longer and end 0.1-0.4 nats above their siblings;
# 20% lets the same seed converge with the others. The width rule: the peak learning rate of a
# model ``d_model`` wide when its config names none (``lr = None``) is REFERENCE_LR up to
# REFERENCE_WIDTH (the tables' lr at D = 64 and 256, where no seed failed, and at 128 with
# this warmup), and REFERENCE_LR * REFERENCE_WIDTH / d_model beyond (Adam's rule for hidden matrices
# in "Tensor Programs V" (muP): an update moves a matrix's output in proportion to its fan-in;
# not measured here beyond 256). Lion's is LION_FACTOR of it ("Symbolic Discovery of
# Optimization Algorithms": 3-10x below AdamW's).
WARMUP = 0.2
REFERENCE_WIDTH = 256
REFERENCE_LR = 3e-3
LION_FACTOR = 1 / 3


def width_lr(d_model: int, optimizer: Optimizer = "adamw") -> float:
    """The width rule's peak learning rate for a model ``d_model`` wide:
    ``REFERENCE_LR * min(1, REFERENCE_WIDTH / d_model)`` (x LION_FACTOR for Lion)."""
    lr = REFERENCE_LR * min(1.0, REFERENCE_WIDTH / d_model)
    return lr * LION_FACTOR if optimizer == "lion" else lr


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings; ``warmup`` is a fraction of ``steps``, ``min_lr`` of ``lr``.

    ``lr`` None (the default) is the width rule's (``width_lr``), fixed for a model by
    ``for_width``; a number, given by a caller or a search space, is kept as it is at every
    width (it wins over the rule)."""

    steps: int = 1000
    batch_size: int = 64
    lr: float | None = None
    optimizer: Optimizer = "adamw"
    weight_decay: float = 0.1
    warmup: float = WARMUP
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

    def for_width(self, d_model: int) -> TrainConfig:
        """This config for a model ``d_model`` wide: ``lr`` as given, else the width rule's."""
        if self.lr is not None:
            return self
        return self.replace(lr=width_lr(d_model, self.optimizer))

    @property
    def peak_lr(self) -> float:
        """``lr``, once ``for_width`` has fixed it.

        Raises:
            ConfigError: ``lr`` is None (the rule needs the model's width: ``for_width``).
        """
        if self.lr is None:
            raise ConfigError(["lr = None: the width rule needs the model's width; "
                               "use TrainConfig.for_width(d_model)"])
        return self.lr

    def lr_at(self, step: int) -> float:
        """Linear warmup to ``lr``, then cosine decay to ``min_lr * lr`` at the last step."""
        peak = self.peak_lr
        warm = max(1, round(self.warmup * self.steps))
        if step < warm:
            return peak * (step + 1) / warm
        progress = (step - warm) / max(1, self.steps - warm)
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return peak * (self.min_lr + (1 - self.min_lr) * cosine)

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
    "lr": lambda p, k, v: v is None or need_number(p, k, v, 0, strict=True),
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
