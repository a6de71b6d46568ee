"""python -m bench.recipe_seeds --heads 2,2 --seeds 0,1,2 [--recipe current|before] [--smoke-test]

How far one point of the corpora grid moves with the training seed under a training recipe: the
documentation text (``pydoc_data`` topics), D = 128, 2 layers, MLP 2x, learned positions,
windows of 64 bytes, 900 steps of 16 windows at lr 3e-3, evaluated on 32 validation batches, as
``experiments.corpora`` trains its grid (the task's batches are seed 0's for every
training seed: the seed draws the initial weights only). ``--recipe before`` is the warmup of
5% used until 2026-11-28, ``current`` the recipe's (``arch.training``). Prints each seed's loss,
their mean, SD, the 1% margin (1% of the mean) and the SD's ratio to it.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common.cli import Parser, add_format, render_table
from common.errors import UsageError

RECIPES: dict[str, dict[str, Any]] = {"current": {}, "before": {"warmup": 0.05}}


def heads_of(text: str) -> tuple[int, ...]:
    try:
        heads = tuple(int(h) for h in text.split(","))
    except ValueError:
        raise UsageError(f"--heads {text!r}: must be head counts per layer, e.g. 2,2") from None
    if not heads or any(h < 1 or 128 % h for h in heads):
        raise UsageError(f"--heads {text!r}: each count must divide 128")
    return heads


def train_point(heads: tuple[int, ...], seed: int, recipe: str, smoke: bool,
                folder: Path) -> float:
    """The point's validation loss after training with ``seed`` under ``recipe``."""
    from arch import ArchConfig, HeadGroup, LayerSpec, TrainConfig
    from userdata import DataSpec
    from userdata.corpora import write_docs
    from workers.tasks import make_data_task
    from workers.training import train

    d, length, steps = (32, 16, 10) if smoke else (128, 64, 900)
    task = make_data_task(DataSpec(str(write_docs(folder, 0.05 if smoke else 2.0))),
                          length=length)
    layers = tuple(LayerSpec("mhsa", (HeadGroup(h, d // h),), mlp_ratio=2) for h in heads)
    arch = ArchConfig(d_model=d, layers=layers, max_seq_len=length, vocab_size=256)
    config = TrainConfig(steps=steps, batch_size=16, lr=3e-3, weight_decay=0.1,
                         eval_every=steps, eval_batches=2 if smoke else 32, seed=seed,
                         device="cpu", **RECIPES[recipe])
    result = train(arch, task, config)
    if result.val_loss is None:
        raise UsageError(f"seed {seed}: the run ended {result.status} ({result.error})")
    return result.val_loss


def run(args: argparse.Namespace) -> dict[str, Any]:
    import statistics

    heads = heads_of(args.heads)
    losses, start = {}, time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            losses[seed] = train_point(heads, seed, args.recipe, args.smoke_test, Path(tmp))
            print(f"seed {seed}: {losses[seed]:.4f}", file=sys.stderr, flush=True)
    values = list(losses.values())
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else math.nan
    return {"heads": " | ".join(map(str, heads)), "recipe": args.recipe, "losses": losses,
            "mean": mean, "seed_sd": sd, "margin_1pct": 0.01 * mean,
            "sd_to_margin": sd / (0.01 * mean), "wall_s": time.perf_counter() - start}


def render(result: dict[str, Any]) -> str:
    return render_table(
        ["point", "recipe", "per seed", "mean", "seed SD", "1% margin", "SD / 1%"],
        [[result["heads"], result["recipe"],
          ", ".join(f"{s}: {v:.4f}" for s, v in result["losses"].items()),
          f"{result['mean']:.4f}", f"{result['seed_sd']:.4f}", f"{result['margin_1pct']:.4f}",
          f"{result['sd_to_margin']:.2f}"]],
        right=[False, False, False, True, True, True, True])


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m bench.recipe_seeds", description=__doc__.split("\n\n")[1])
    p.add_argument("--heads", default="2,2", help="head count per layer (default: 2,2)")
    p.add_argument("--seeds", type=lambda t: [int(s) for s in t.split(",")], default=[0, 1, 2],
                   help="training seeds (default: 0,1,2)")
    p.add_argument("--recipe", choices=tuple(RECIPES), default="current")
    p.add_argument("--smoke-test", action="store_true", help="a tiny model, 10 steps")
    add_format(p)
    return p


def main(argv: list[str] | None = None) -> int:
    from experiments import harness

    return harness.main(build_parser(), argv, run, render)


if __name__ == "__main__":
    sys.exit(main())
