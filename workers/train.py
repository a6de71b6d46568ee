"""python -m workers.train --arch arch.yaml --task ngram [--smoke-test] [--format json]

Train any ``ArchConfig`` on any task of ``workers.tasks``, on CPU or CUDA (bf16 autocast), knowing
nothing about Ray: evaluation callbacks may stop the run. AdamW or Lion, linear warmup then cosine
decay, gradient clipping, evaluation every k steps, checkpoints that resume the same loss curve,
tokens/s, and a non-finite loss or gradient ends the run with status ``diverged`` instead of a
crash.

This module reads the flags; the training is ``workers.training.trainer``, imported once they are
read, so that ``--help`` needs no torch.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from arch import OPTIMIZERS, SMOKE_TRAIN, ArchConfig, ConfigError, TrainConfig
from common.cli import (
    Parser,
    add_force,
    add_format,
    check_writable,
    dump,
    fail,
    flag_names,
    int_in,
    number,
    wrote,
)
from common.errors import TransformerAllocError, UsageError
from workers.taskargs import TASK_FLAGS, add_task_args, task_from_args

if TYPE_CHECKING:
    from workers.tasks import Task
    from workers.training.trainer import TrainResult

PROG = "workers.train"


def build_parser() -> argparse.ArgumentParser:
    d = TrainConfig()
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[1])
    p.add_argument("--arch", type=Path, required=True,
                   help="ArchConfig YAML/JSON (python -m alloc.solve --out writes one); its "
                        "input/output and length are wired to the task")
    add_task_args(p)
    p.add_argument("--size", choices=("smoke", "paper"),
                   help="task size (default: paper; smoke with --smoke-test)")
    for flag, kind in (("--steps", int_in(1)), ("--batch-size", int_in(1)),
                       ("--eval-every", int_in(1)), ("--eval-batches", int_in(1))):
        key = flag[2:].replace("-", "_")
        p.add_argument(flag, type=kind, help=f"(default: {getattr(d, key)}; "
                                             f"{SMOKE_TRAIN[key]} with --smoke-test)")
    p.add_argument("--lr", type=number(0, strict=True), default=d.lr,
                   help="peak learning rate (default: the width rule, "
                        "arch.training.width_lr: 3e-3 x 64 / d_model, docs/guide/train.md)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=d.optimizer)
    p.add_argument("--weight-decay", type=number(0), default=d.weight_decay)
    p.add_argument("--warmup", type=number(0), default=d.warmup, help="fraction of steps")
    p.add_argument("--grad-clip", type=number(0, strict=True), default=d.grad_clip)
    p.add_argument("--seed", type=int_in(0), default=d.seed)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default=d.device)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--out", type=Path,
                   help="write the training checkpoint here at every evaluation (the input of "
                        "workers.profile/workers.compress --checkpoint)")
    p.add_argument("--resume", action="store_true", help="continue from the --out checkpoint")
    add_force(p, "--out checkpoint (start over)")
    p.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)  # refused: see setup()
    p.add_argument("--smoke-test", action="store_true",
                   help=f"the task at its smoke size, {SMOKE_TRAIN['steps']} steps of batch "
                        f"{SMOKE_TRAIN['batch_size']}: runs in seconds "
                        "(flags you give win over it)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress on stderr (a bar on a terminal, else a line per "
                        "evaluation); errors and the result still print")
    add_format(p)
    return p


def load_arch(path: Path) -> ArchConfig:
    """Read an ``ArchConfig`` file, turning every failure into one ``UsageError`` line."""
    try:
        return ArchConfig.from_yaml(path.read_text())
    except OSError as err:
        raise UsageError(f"--arch {str(path)!r}: cannot read ({err.strerror})") from None
    except ConfigError as err:
        raise UsageError(f"--arch {str(path)!r}: {err}") from None


def setup(args: argparse.Namespace) -> tuple[ArchConfig, Task, TrainConfig]:
    import torch

    from workers.tasks import fit_arch

    if args.checkpoint is not None:
        raise UsageError(f"--checkpoint {str(args.checkpoint)!r}: workers.train writes its "
                         "checkpoint with --out PATH (--checkpoint names the checkpoint that "
                         "workers.profile and workers.compress read)")
    arch = load_arch(args.arch)
    task = task_from_args(args)
    try:
        fit_arch(arch, task)
    except ConfigError as err:
        raise UsageError(f"--arch {str(args.arch)!r} does not fit task {task.name}: "
                         f"{err}") from None
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available")
    if args.resume and args.out is None:
        raise UsageError("--resume: needs --out PATH (the checkpoint to continue)")
    if args.resume and args.force:
        raise UsageError("--resume and --force: continue the --out checkpoint, or overwrite "
                         "it; give one")
    if args.out is not None:
        check_writable("--out", args.out, force=args.force or args.resume)
    d, smoke = TrainConfig(), SMOKE_TRAIN if args.smoke_test else {}
    sized = {key: getattr(args, key) if getattr(args, key) is not None
             else smoke.get(key, getattr(d, key)) for key in SMOKE_TRAIN}
    config = TrainConfig(**sized, lr=args.lr, optimizer=args.optimizer,
                         weight_decay=args.weight_decay, warmup=args.warmup,
                         grad_clip=args.grad_clip, seed=args.seed, device=args.device,
                         compile=args.compile)
    return arch, task, config


def render(result: TrainResult) -> str:
    lines = [f"{result.task}: {result.status} after {result.steps} steps"]
    if result.metric is not None:
        lines.append(f"  {result.metric_name:<16} {result.metric:.6g}")
        lines.append(f"  {'val loss':<16} {result.val_loss:.6g}")
    for key, value in result.extra.items():
        lines.append(f"  {key:<16} {value:.6g}")
    lines += [f"  {'trainable params':<16} {result.trainable_params:,}",
              f"  {'tokens/s':<16} {result.tokens_per_s:,.0f}",
              f"  {'wall time':<16} {result.wall_s:.1f} s"]
    if result.error:
        lines.append(f"  {'error':<16} {result.error}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    from workers.training.trainer import Trainer, describe_run, run_with_progress

    try:
        arch, task, config = setup(args)
        trainer = Trainer(arch, task, config, args.out)
        if args.resume:
            trainer.resume()
    except TransformerAllocError as err:
        # the trainer's checkpoint is this command's --out (its --checkpoint is refused)
        return fail(PROG, err.text(flag_names(parser, **TASK_FLAGS, checkpoint="--out")))
    result = run_with_progress(trainer, task.name, args.quiet, start=describe_run(trainer))
    if args.out is not None and args.out.exists():
        wrote(PROG, args.out)
    print(render(result) if args.format == "table" else dump(result.summary(), args.format))
    return {"completed": 0, "stopped": 0, "diverged": 1, "interrupted": 130}[result.status]


if __name__ == "__main__":
    sys.exit(main())
