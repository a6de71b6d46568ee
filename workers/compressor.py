"""What ``python -m workers.compress`` runs (``workers.compress`` reads the flags): the teacher
loaded, its plan read and checked, the student built from the truncated SVD of each planned
head's query-key map (or its key/value head's leading RoPE pairs), measured, fine-tuned, and
written as a ``.pt``, a compact ``transformers`` folder or the teacher's stock layout.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import torch

from alloc.compression import CompressionError, CompressionPlan
from arch import ArchConfig, TrainConfig, param_count
from arch.memory import DTYPE_BYTES, kv_cache_bytes
from common.cli import (
    check_writable,
    parse_task_params,
)
from common.errors import UsageError
from common.files import write_atomic
from common.progress import Progress, duration
from userdata import DataSpec
from workers.checkpoints import Loaded, load, save_gpt2, save_llama
from workers.model import Model
from workers.students import build_student, pair_orders
from workers.taskargs import check_fits, task_for_model
from workers.tasks import Task, task_from_description
from workers.trainer import Trainer, evaluate, run_with_progress

PROG = "workers.compress"


def read_plan(path: Path, teacher: ArchConfig) -> CompressionPlan:
    """The plan of a checkpoint profile, checked to be a plan for ``teacher``.

    Raises:
        CompressionError: unreadable, not a plan, or a plan for a different model.
    """
    try:
        text = path.read_text()
    except OSError as err:
        raise CompressionError(f"--plan {str(path)!r}: cannot read ({err.strerror})") from None
    try:
        plan = CompressionPlan.from_yaml(text)
    except CompressionError as err:
        raise CompressionError(f"--plan {str(path)!r}: {err}") from None
    if plan.arch_id != teacher.arch_id:
        raise CompressionError(f"--plan {str(path)!r}: a plan for model {plan.arch_id}, not "
                               f"for this checkpoint ({teacher.arch_id}); profile this one")
    problem = reduced_qk_only(teacher, plan.student)
    if problem is not None:
        raise CompressionError(f"--plan {str(path)!r}: its student {problem}; a plan may only "
                               "lower qk_dim")
    return plan


def reduced_qk_only(teacher: ArchConfig, student: ArchConfig) -> str | None:
    """None if ``student`` is ``teacher`` with some heads' ``qk_dim`` lowered, else what
    differs (a hand-edited plan must not change what the SVD copies)."""
    if len(student.layers) != len(teacher.layers):
        return f"has {len(student.layers)} layers, the teacher {len(teacher.layers)}"
    for i, (old, new) in enumerate(zip(teacher.layers, student.layers)):
        shape = [(g.count, g.v_dim, g.kv_heads) for g in old.heads]
        if [(g.count, g.v_dim, g.kv_heads) for g in new.heads] != shape or any(
                n.qk_dim > o.qk_dim for o, n in zip(old.heads, new.heads)):
            return f"layer {i} has heads {new.heads_str}, the teacher {old.heads_str}"
        if dataclasses.replace(new, heads=old.heads) != old:
            return f"layer {i} differs from the teacher's beyond qk_dim"
    if dataclasses.replace(student, layers=teacher.layers) != teacher:
        return "differs from the teacher beyond its layers' qk_dim"
    return None


def resolve_task(args: argparse.Namespace, loaded: Loaded) -> tuple[Task | None, str]:
    """The data or task to measure and fine-tune on: ``--data``, ``--task`` (in windows of the
    model's length), else the task our checkpoint was trained on (None for a GPT-2 checkpoint
    without either), and where it came from, for error messages."""
    data = None if args.data is None else DataSpec(str(args.data), args.data_format,
                                                   args.data_dtype, args.vocab_size)
    task, source = task_for_model(loaded.arch, data=data, task=args.task,
                                  params=parse_task_params(args.task_param),
                                  size="smoke" if args.smoke_test else "paper", seed=args.seed,
                                  seq_len=args.seq_len)
    if task is None and loaded.task is not None:
        return task_from_description(loaded.task), "the checkpoint's task"
    return task, source


def evaluate_loss(model: Model, task: Task, batches: int) -> dict[str, float]:
    """``model``'s loss and its task's metric on ``batches`` validation batches."""
    loss, metric = evaluate(model, task, TrainConfig(eval_batches=batches, batch_size=32),
                            "cpu")
    return {"loss": loss, task.metric: metric}


def check_output(args: argparse.Namespace, loaded: Loaded, student: ArchConfig) -> None:
    """Refuse, before any work, an ``--out`` / ``--layout`` the teacher cannot be written as,
    and an existing ``--out`` without ``--force``."""
    if args.out.suffix == ".pt":
        if args.layout is not None:
            raise UsageError(f"--layout {args.layout}: only for a folder --out (a .pt is a "
                             "workers.train checkpoint)")
        check_writable("--out", args.out, force=args.force)
        check_writable("--out", args.out.with_suffix(".arch.yaml"), force=args.force)
        return
    if not args.out.parent.is_dir():
        raise UsageError(f"--out {str(args.out)!r}: directory {str(args.out.parent)!r} does "
                         "not exist")
    if args.out.exists() and not args.force and (
            not args.out.is_dir() or any(args.out.iterdir())):
        raise UsageError(f"--out {str(args.out)!r}: exists; pass --force to replace it")
    if args.layout == "stock":
        if loaded.layout not in ("gpt2", "llama"):
            raise UsageError(f"--layout stock: keeps the teacher's transformers layout; this "
                             f"teacher is a {loaded.layout} checkpoint (use --layout compact)")
        if args.out.exists():
            raise UsageError(f"--out {str(args.out)!r}: exists; the stock layout is written "
                             "to a new folder")
    else:
        compact_export().check_exportable(student)


def compact_export() -> Any:
    """``workers.hf.export`` (it needs ``transformers``, an optional dependency).

    Raises:
        UsageError: ``transformers`` is not installed.
    """
    try:
        from workers.hf import export
    except ImportError as err:
        raise UsageError(f"--layout compact: writing a transformers folder needs the "
                         f"transformers package ({err}); pip install 'transformer-alloc[hf]', "
                         "or write a .pt") from None
    return export


def compress(args: argparse.Namespace) -> dict[str, Any]:
    tick = time.perf_counter()
    loaded = load(args.checkpoint)
    read_s = time.perf_counter() - tick
    plan = read_plan(args.plan, loaded.arch)
    student_arch = plan.student
    as_pt = args.out.suffix == ".pt"
    check_output(args, loaded, student_arch)
    task, source = resolve_task(args, loaded)
    if task is None and as_pt:
        raise UsageError("--out *.pt: a workers.train checkpoint needs the task it trains on; "
                         "give --data or --task")
    if task is not None:
        check_fits(task, loaded.arch, as_pt or args.finetune_steps > 0, source)
    finetune = task is not None and args.finetune_steps > 0
    stages = 2 + (2 if task is not None else 0) + (2 if finetune else 0)
    with Progress(PROG, total=stages, unit="stages", quiet=args.quiet,
                  start=f"read {args.checkpoint} ({loaded.family}) in {duration(read_s)}; "
                        "building the student") as bar:
        student = build_student(loaded.model, student_arch, pair_orders(plan))
        bar.update(1)
        bar.event("student built")
        report = describe(args, loaded, student_arch, plan, task)
        trainer = None
        if task is not None:
            for name, model, what in (("teacher", loaded.model, "the teacher"),
                                      ("svd", student, "the student as cut")):
                report[name] = evaluate_loss(model, task, args.eval_batches)
                bar.update(1)
                bar.event(f"evaluated {what}: loss {report[name]['loss']:.4g}")
        if task is not None and (as_pt or finetune):  # the trainer wires in the task
            config = TrainConfig(steps=max(1, args.finetune_steps), lr=args.lr,
                                 batch_size=args.batch_size,
                                 eval_every=max(1, args.finetune_steps),
                                 eval_batches=args.eval_batches, seed=args.seed, device="cpu")
            trainer = Trainer(student_arch, task, config,
                              checkpoint=args.out if as_pt else None)
            trainer.model.load_state_dict(student.state_dict())
            if finetune:
                run_with_progress(trainer, "fine-tune", args.quiet,
                                  start=f"{config.steps:,} steps of the student")
                bar.update(1)
                report["finetuned"] = evaluate_loss(trainer.model, task, args.eval_batches)
                student = trainer.model
                bar.update(1)
                bar.event(f"evaluated the fine-tuned student: loss "
                          f"{report['finetuned']['loss']:.4g}")
        write(args, loaded, student, trainer, dtype=report["kv_cache"]["dtype"])
        bar.update(1)
        bar.event(f"wrote {args.out}")
    report["files"] = {"teacher": weights_bytes(args.checkpoint),
                       "student": weights_bytes(args.out)}
    report["out"] = str(args.out)
    report["written"] = [str(args.out)] + (
        [str(args.out.with_suffix(".arch.yaml"))] if as_pt else [])
    return report


def describe(args: argparse.Namespace, loaded: Loaded, student_arch: ArchConfig,
             plan: CompressionPlan, task: Task | None) -> dict[str, Any]:
    """The report's description of teacher and student (sizes, KV cache, heads, task)."""
    before, after = param_count(loaded.arch), param_count(student_arch)
    dtype = weights_dtype(loaded)
    return {
        "checkpoint": str(args.checkpoint), "layout": loaded.layout, "family": loaded.family,
        "out_layout": "pt" if args.out.suffix == ".pt" else args.layout or "compact",
        "params": {"teacher": before.trainable, "student": after.trainable,
                   "teacher_total": before.total, "student_total": after.total},
        "kv_cache": {"dtype": dtype, "teacher": kv_cache_bytes(loaded.arch, dtype),
                     "student": kv_cache_bytes(student_arch, dtype)},
        "qk_dims": [{"layer": i, "teacher": old.heads_str, "student": new.heads_str}
                    for i, (old, new) in enumerate(zip(loaded.arch.layers,
                                                       student_arch.layers))],
        "task": None if task is None else task.name,
        "plan": {"reduces": plan.reduces, "measured": plan.measured}}


def weights_dtype(loaded: Loaded) -> str:
    """The dtype the teacher's weights are stored in (a student is written in it too)."""
    stored = (loaded.config or {}).get("dtype") or (loaded.config or {}).get("torch_dtype")
    return stored if stored in DTYPE_BYTES else "float32"


# Bytes per element of the dtypes safetensors files hold.
SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
                     "I8": 1, "U8": 1, "BOOL": 1}


def weights_bytes(path: Path) -> int:
    """Bytes of a checkpoint's weights alone, in the dtype they are stored in: a folder's
    safetensors tensors, or a ``.pt``'s model state (not the optimizer state a training
    checkpoint carries beside it)."""
    if path.is_dir():
        from safetensors import safe_open

        total = 0
        for file in sorted(path.glob("*.safetensors")):
            with safe_open(str(file), "pt") as handle:
                for key in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    tensor = handle.get_slice(key)
                    total += math.prod(tensor.get_shape()) * SAFETENSORS_BYTES[
                        tensor.get_dtype()]
        return total
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return sum(t.numel() * t.element_size() for t in state["model"].values())


def write(args: argparse.Namespace, loaded: Loaded, student: Model, trainer: Trainer | None,
          dtype: str) -> None:
    """The student as a ``workers.train`` checkpoint (and its arch YAML), a ``transformers``
    folder of its real shapes (``compact``), or the teacher's padded ``stock`` layout."""
    if args.out.suffix != ".pt":
        if args.layout == "stock":
            assert loaded.config is not None  # check_output: a transformers teacher
            save = save_gpt2 if loaded.layout == "gpt2" else save_llama
            save(student, loaded.config, args.out, getattr(torch, dtype))
        else:
            compact_export().save_student(student, args.out, getattr(torch, dtype))
        return
    assert trainer is not None  # compress() refused a .pt without a task
    if not args.finetune_steps:
        trainer.save()  # step 0: the SVD initialisation, ready for workers.train --resume
    write_atomic(args.out.with_suffix(".arch.yaml"), student.arch.to_yaml())
