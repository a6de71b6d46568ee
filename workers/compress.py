"""python -m workers.compress --checkpoint PATH --plan plan.yaml --data PATH --out student.pt

Build the student a checkpoint profile planned (``python -m alloc.profile --checkpoint --out
plan.yaml``): the same model with the planned heads' ``qk_dim`` reduced, each head's query and
key maps initialised from the truncated SVD of its ``W_Q,h W_K,h^T`` (the best rank-r map,
Eckart-Young; docs/theory.md §10), everything else copied; then fine-tune it for
``--finetune-steps`` on the data or task. Reports parameters before and after, and the loss and
metric of the teacher, of the student right after the SVD, and after fine-tuning. ``--out``
ending in ``.pt`` writes a ``workers.train`` checkpoint (with the student's architecture as YAML
beside it, for ``--arch`` and ``--resume``); a folder writes the GPT-2 layout of a GPT-2 teacher.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import Tensor

from common.cli import (
    Parser,
    UsageError,
    add_format,
    check_writable,
    dump,
    fail,
    int_in,
    number,
    render_table,
)
from common.files import write_atomic
from search_spaces import SINGLE_WIDTH_KINDS, ArchConfig, ConfigError, param_count
from search_spaces.data import DataError, DataSpec
from workers.checkpoints import CheckpointError, Loaded, load, save_gpt2
from workers.inspect import head_maps
from workers.model import Model, build_model
from workers.tasks import Task, TaskError, make_data_task, make_task, task_from_description
from workers.train import TrainConfig, Trainer, evaluate

PROG = "workers.compress"


def svd_factors(a: Tensor, b: Tensor, rank: int) -> tuple[Tensor, Tensor]:
    """Rank-``rank`` maps ``(A', B')`` with ``A' B'^T / sqrt(rank)`` the best rank-``rank``
    approximation of ``M = A B^T / sqrt(qk)`` (``A, B``: (d, qk)): ``A' = U_r S_r^(1/2) r^(1/4)``
    and ``B' = V_r S_r^(1/2) r^(1/4)`` (the student divides its logits by ``sqrt(rank)``)."""
    m = a @ b.T / math.sqrt(a.shape[1])
    u, s, vh = torch.linalg.svd(m)
    root = s[:rank].sqrt() * rank ** 0.25
    return u[:, :rank] * root, vh[:rank].T * root


def svd_student(teacher: Model, student_arch: ArchConfig) -> Model:
    """The student: ``teacher``'s weights, every head's query/key maps replaced by the truncated
    SVD factors at the student's ``qk_dim`` (at full rank, an exact refactoring)."""
    student = build_model(student_arch)
    state = teacher.state_dict()
    maps = head_maps(teacher)
    for i, (old, new) in enumerate(zip(teacher.arch.layers, student_arch.layers)):
        if old.attention in SINGLE_WIDTH_KINDS:
            continue
        name = "qk" if old.attention == "frozen_qk" else "qkv"
        weight, bias = _qk_rows(state, i, name, new, [m for m in maps if m.layer == i],
                                teacher.arch.bias)
        state[f"blocks.{i}.attn.{name}.weight"] = weight
        if bias is not None:
            state[f"blocks.{i}.attn.{name}.bias"] = bias
    student.load_state_dict(state)
    return student.eval()


def _qk_rows(state: dict[str, Tensor], i: int, name: str, layer: Any, maps: list[Any],
             bias: bool) -> tuple[Tensor, Tensor | None]:
    """The student's query/key (and value) rows of layer ``i`` from the teacher's head maps."""
    old_w = state[f"blocks.{i}.attn.{name}.weight"]
    old_b = state.get(f"blocks.{i}.attn.{name}.bias")
    qk_width = sum(m.a.shape[1] for m in maps)
    queries, keys = [], []
    for m, rank in zip(maps, [g.qk_dim for g in layer.heads for _ in range(g.count)]):
        a, b = svd_factors(torch.from_numpy(m.a), torch.from_numpy(m.b), rank)
        queries.append(a.T.to(old_w.dtype))  # (rank, d [+ 1])
        keys.append(b.T.to(old_w.dtype))
    rest = old_w[2 * qk_width:]  # the value rows (none for frozen_qk's qk map)
    q, k = torch.cat(queries), torch.cat(keys)
    if not bias:
        return torch.cat([q, k, rest]), None
    assert old_b is not None  # the last column of each factor is the bias
    weight = torch.cat([q[:, :-1], k[:, :-1], rest])
    return weight, torch.cat([q[:, -1], k[:, -1], old_b[2 * qk_width:]])


def read_plan(path: Path, teacher: ArchConfig) -> ArchConfig:
    """The student architecture of a profile, checked to be a plan for ``teacher``.

    Raises:
        UsageError: unreadable, or a plan for a different model.
    """
    try:
        plan = yaml.safe_load(path.read_text())
        student = ArchConfig.from_dict(plan["student"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, ConfigError) as err:
        raise UsageError(f"--plan {str(path)!r}: not a checkpoint profile "
                         f"({str(err).splitlines()[0]})") from None
    if plan.get("arch_id") != teacher.arch_id:
        raise UsageError(f"--plan {str(path)!r}: a plan for model {plan.get('arch_id')}, not "
                         f"for this checkpoint ({teacher.arch_id}); profile this one")
    problem = reduced_qk_only(teacher, student)
    if problem is not None:
        raise UsageError(f"--plan {str(path)!r}: its student {problem}; a plan may only lower "
                         "qk_dim")
    return student


def reduced_qk_only(teacher: ArchConfig, student: ArchConfig) -> str | None:
    """None if ``student`` is ``teacher`` with some heads' ``qk_dim`` lowered, else what
    differs (a hand-edited plan must not change what the SVD copies)."""
    if len(student.layers) != len(teacher.layers):
        return f"has {len(student.layers)} layers, the teacher {len(teacher.layers)}"
    for i, (old, new) in enumerate(zip(teacher.layers, student.layers)):
        shape = [(g.count, g.v_dim) for g in old.heads]
        if [(g.count, g.v_dim) for g in new.heads] != shape or any(
                n.qk_dim > o.qk_dim for o, n in zip(old.heads, new.heads)):
            return f"layer {i} has heads {new.heads_str}, the teacher {old.heads_str}"
        if dataclasses.replace(new, heads=old.heads) != old:
            return f"layer {i} differs from the teacher's beyond qk_dim"
    if dataclasses.replace(student, layers=teacher.layers) != teacher:
        return "differs from the teacher beyond its layers' qk_dim"
    return None


def resolve_task(args: argparse.Namespace, loaded: Loaded) -> tuple[Task | None, str]:
    """The data or task to measure and fine-tune on: ``--data``, ``--task``, else the task our
    checkpoint was trained on (None for a GPT-2 checkpoint without either), and where it came
    from, for error messages."""
    length = loaded.arch.max_seq_len
    try:
        if args.data is not None:
            spec = DataSpec(str(args.data), args.data_format, args.data_dtype, args.vocab_size)
            return (make_data_task(spec, length=min(length, args.seq_len or length)),
                    f"--data {str(args.data)!r}")
        if args.task is not None:
            return make_task(args.task, "paper", args.seed), f"--task {args.task}"
        if loaded.task is not None:
            return task_from_description(loaded.task), "the checkpoint's task"
    except (DataError, TaskError, TypeError, ValueError) as err:
        raise UsageError(str(err)) from None
    return None, "no task"


def check_fits(task: Task, arch: ArchConfig, trains: bool, source: str) -> None:
    """``task`` feeds ``arch`` as it is: the same vocabulary (or input/output widths), windows
    no longer than its positions, and, where a student is trained or saved as a ``workers.train``
    checkpoint (``trains``), exactly its length (the trainer wires the model to the task).

    Raises:
        UsageError: naming ``source`` (the flag that chose the task) and the mismatch.
    """
    io = task.io
    for name, want in (("vocab_size", arch.vocab_size), ("input_dim", arch.input_dim),
                       ("output_dim", arch.output_dim)):
        got = getattr(io, name)
        if got != want:
            hint = ("; give --vocab-size" if name == "vocab_size" and source.startswith("--data")
                    else "")
            raise UsageError(f"{source}: {name} {got}, the checkpoint's model has {want}{hint}")
    if io.max_seq_len > arch.max_seq_len or (trains and io.max_seq_len != arch.max_seq_len):
        rule = ("at most" if not trains else
                "exactly (fine-tuning and .pt students keep the model's positions)")
        raise UsageError(f"{source}: windows of {io.max_seq_len} tokens, the checkpoint's model "
                         f"takes {rule} {arch.max_seq_len}; set --seq-len")


def measure(model: Model, task: Task, batches: int) -> dict[str, float]:
    loss, metric = evaluate(model, task, TrainConfig(eval_batches=batches, batch_size=32),
                            "cpu")
    return {"loss": loss, task.metric: metric}


def compress(args: argparse.Namespace) -> dict[str, Any]:
    loaded = load(args.checkpoint)
    student_arch = read_plan(args.plan, loaded.arch)
    as_pt = args.out.suffix == ".pt"
    if not as_pt and loaded.layout != "gpt2":
        raise UsageError(f"--out {str(args.out)!r}: a folder is the GPT-2 layout, for a GPT-2 "
                         "checkpoint; write a .pt")
    if as_pt:
        check_writable("--out", args.out)
    elif not args.out.parent.is_dir():
        raise UsageError(f"--out {str(args.out)!r}: directory {str(args.out.parent)!r} does "
                         "not exist")
    task, source = resolve_task(args, loaded)
    if task is None and as_pt:
        raise UsageError("--out *.pt: a workers.train checkpoint needs the task it trains on; "
                         "give --data or --task")
    if task is not None:
        check_fits(task, loaded.arch, as_pt or args.finetune_steps > 0, source)
    student = svd_student(loaded.model, student_arch)
    before, after = param_count(loaded.arch), param_count(student_arch)
    report: dict[str, Any] = {
        "checkpoint": str(args.checkpoint), "layout": loaded.layout,
        "params": {"teacher": before.trainable, "student": after.trainable,
                   "teacher_total": before.total, "student_total": after.total},
        "qk_dims": [{"layer": i, "teacher": old.heads_str, "student": new.heads_str}
                    for i, (old, new) in enumerate(zip(loaded.arch.layers,
                                                       student_arch.layers))],
        "task": None if task is None else task.name}
    trainer = None
    if task is not None:
        report["teacher"] = measure(loaded.model, task, args.eval_batches)
        report["svd"] = measure(student, task, args.eval_batches)
        config = TrainConfig(steps=max(1, args.finetune_steps), lr=args.lr,
                             batch_size=args.batch_size, eval_every=max(1, args.finetune_steps),
                             eval_batches=args.eval_batches, seed=args.seed, device="cpu")
        trainer = Trainer(student_arch, task, config, checkpoint=args.out
                          if args.out.suffix == ".pt" else None)
        trainer.model.load_state_dict(student.state_dict())
        if args.finetune_steps:
            trainer.run()
            report["finetuned"] = measure(trainer.model, task, args.eval_batches)
            student = trainer.model
    write(args, loaded, student, trainer)
    report["out"] = str(args.out)
    return report


def write(args: argparse.Namespace, loaded: Loaded, student: Model,
          trainer: Trainer | None) -> None:
    """The student as a ``workers.train`` checkpoint (and its arch YAML), or GPT-2 layout."""
    if args.out.suffix != ".pt":
        assert loaded.config is not None
        save_gpt2(student, loaded.config, args.out)
        return
    assert trainer is not None  # compress() refused a .pt without a task
    if not args.finetune_steps:
        trainer.save()  # step 0: the SVD initialisation, ready for workers.train --resume
    write_atomic(args.out.with_suffix(".arch.yaml"), student.arch.to_yaml())


def render(report: dict[str, Any]) -> str:
    p = report["params"]
    lines = [f"{report['checkpoint']} ({report['layout']}) -> {report['out']}",
             f"trainable parameters {p['teacher']:,} -> {p['student']:,} "
             f"({1 - p['student'] / p['teacher']:.1%} fewer)",
             render_table(["layer", "teacher heads", "student heads"],
                          [[q["layer"], q["teacher"], q["student"]] for q in report["qk_dims"]],
                          right=[True, False, False])]
    stages = [s for s in ("teacher", "svd", "finetuned") if s in report]
    if stages:
        keys = list(report["teacher"])
        lines.append(render_table(["model", *keys], [[s] + [f"{report[s][k]:.5g}" for k in keys]
                                                     for s in stages]))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=f"python -m {PROG}", description=__doc__.split("\n\n")[1])
    p.add_argument("--checkpoint", type=Path, required=True,
                   help="the teacher: a workers.train .pt or a GPT-2 layout folder")
    p.add_argument("--plan", type=Path, required=True,
                   help="its profile (python -m alloc.profile --checkpoint ... --out)")
    p.add_argument("--out", type=Path, required=True,
                   help="student.pt (a workers.train checkpoint) or a folder (GPT-2 layout)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--data", type=Path, help="data to measure and fine-tune on")
    source.add_argument("--task", help="a generated task instead (default: the checkpoint's)")
    p.add_argument("--data-format", choices=("text", "bin", "npy"))
    p.add_argument("--data-dtype", choices=("uint16", "uint32"), default="uint16")
    p.add_argument("--vocab-size", type=int_in(1))
    p.add_argument("--seq-len", type=int_in(1), help="window of --data (default: the model's)")
    p.add_argument("--finetune-steps", type=int_in(0), default=0)
    p.add_argument("--lr", type=number(0, strict=True), default=3e-4)
    p.add_argument("--batch-size", type=int_in(1), default=32)
    p.add_argument("--eval-batches", type=int_in(1), default=8)
    p.add_argument("--seed", type=int_in(0), default=0)
    add_format(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        report = compress(args)
    except (UsageError, CheckpointError) as err:
        return fail(PROG, str(err))
    print(render(report) if args.format == "table" else dump(report, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
