"""A short training of a searched or planned architecture at the throughput shape, beside the
uniform baseline of the same width and depth: ``workers.training.trainer`` on the byte-level ``lm``
task at the shape's length, the same seed and batches for both (one seed: a check that the
architecture trains at scale and how fast, not a verdict on which is better).

The architecture is ``--arch FILE`` (an ``ArchConfig`` YAML, as ``studies best --export`` or
``alloc.solve --out`` write), else the allocator's plan for the shape's width and depth.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from alloc import PlanSettings, baseline_head, make_plan
from arch import ArchConfig, LayerSpec, TrainConfig, param_count
from bench.gpu.plan import Context, PartResult, TimeLimit
from bench.throughput import Shape
from common.files import read_yaml
from workers.tasks import LMTask, fit_arch
from workers.training import Trainer

VOCAB = 256  # bytes


def planned(shape: Shape) -> ArchConfig:
    """The allocator's plan at the shape (``alloc.solve --budget D --layers L --seq-len T``,
    key dims in steps of 16 at GPT-2's width, 8 below)."""
    settings = PlanSettings(budget=shape.d_model, layers=shape.layers, seq_len=shape.seq_len,
                            vocab_size=VOCAB, mlp_ratio=shape.mlp_ratio,
                            align=16 if shape.d_model >= 256 else 8)
    return make_plan(settings).arch


def uniform(arch: ArchConfig) -> ArchConfig:
    """``arch`` with the usual layer everywhere (``D/64`` heads of 64, mhsa, the same MLPs)."""
    head = baseline_head(arch.d_model)
    layers = tuple(LayerSpec("mhsa", (head,), layer.mlp_ratio) for layer in arch.layers)
    return dataclasses.replace(arch, layers=layers)


def architectures(shape: Shape, arch_file: Path | None) -> dict[str, ArchConfig]:
    """The architectures trained, by name: the file's (or the plan's), then the baseline."""
    if arch_file is not None:
        arch = ArchConfig.from_dict(read_yaml(arch_file))
        name = f"--arch {arch_file.name}"
    else:
        arch, name = planned(shape), "allocator plan"
    return {name: arch, "uniform baseline": uniform(arch)}


def train_one(ctx: Context, arch: ArchConfig, length: int) -> dict[str, Any]:
    """``workers.training.trainer`` on the byte LM: the result's losses, speed and size."""
    s = ctx.sizes
    config = TrainConfig(steps=s.train_steps, batch_size=s.train_batch, lr=1e-3, warmup=0.1,
                         eval_every=s.train_steps, eval_batches=1 if ctx.smoke else 4,
                         device=ctx.device)
    task = LMTask(length=length)
    start = time.perf_counter()
    result = Trainer(arch, task, config).run()
    return {"describe": arch.describe(), "params": param_count(fit_arch(arch, task)).total,
            "status": result.status, "steps": result.steps, "train_loss": result.train_loss,
            "val_loss": result.val_loss, "tokens_per_s": result.tokens_per_s,
            "wall_s": time.perf_counter() - start}


def run_training(ctx: Context, result: PartResult, limit: TimeLimit,
                 say: Callable[[str], None]) -> None:
    length = min(ctx.sizes.shape.seq_len, 1024)
    archs = architectures(ctx.sizes.shape, ctx.arch_file)
    result.note(f"lm task (bytes of Python's documentation), length {length}, "
                f"{ctx.sizes.train_steps} steps of {ctx.sizes.train_batch}, seed 0, one run")
    last = 0.0
    for name, arch in archs.items():
        if result.rows and limit.left() < last:
            result.note(f"{name}: not trained (the time left {limit.left():.0f} s, the "
                        f"first took {last:.0f} s)")
            continue
        limit.check(f"training the {name}")
        row = {"architecture": name, **train_one(ctx, arch, length)}
        result.rows.append(row)
        last = row["wall_s"]
        say(f"training: {name}: val loss {row['val_loss']:.4f}, "
            f"{row['tokens_per_s']:,.0f} tokens/s")
        if row["status"] != "completed":
            result.status = "failed"
