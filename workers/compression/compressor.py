"""Compressing a checkpoint by its plan: ``compress(CompressRequest) -> CompressResult``. The
teacher is loaded, its plan read and checked, the student built from the truncated SVD of each
planned head's query-key map (or its key/value head's leading RoPE pairs), evaluated,
fine-tuned, and written as a ``.pt``, a compact ``transformers`` folder or the teacher's stock
layout.

``python -m workers.compress`` reads its flags into a ``CompressRequest`` (``workers.compress``)
and prints the ``CompressResult``; Python calls ``compress`` the same way::

    from userdata import TaskSpec
    from workers.compression.compressor import CompressRequest, compress
    result = compress(CompressRequest(Path("run.pt"), Path("plan.yaml"), Path("student.pt"),
                                      task=TaskSpec("lm", size="smoke")))
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import torch

from alloc.compression import CompressionError, CompressionPlan
from arch import (
    DTYPE_BYTES,
    ArchConfig,
    LayerSpec,
    TrainConfig,
    kinds_text,
    kv_cache_bytes,
    param_count,
)
from common.cli import check_writable
from common.errors import Problem, UsageError
from common.files import write_atomic
from common.progress import Progress, duration
from userdata import TaskSpec
from workers.checkpoints import (
    Loaded,
    gguf_file,
    is_family_folder,
    load,
    save_gpt2,
    save_llama,
    source_of,
)
from workers.checkpoints.llama import sliding_window
from workers.checkpoints.stream import StreamedFolder
from workers.checkpoints.tokenizer import tokenizer_writer
from workers.compression.distil import Distiller, DistilSettings, run_with_progress as run_distiller
from workers.compression.fits import read_fits
from workers.compression.records import (
    PROG,
    CompressRequest,
    CompressResult,
    Evaluation,
    FileBytes,
    FineTune,
    KVCache,
    LayerHeads,
    ParamCounts,
    finetune_checkpoint,
)
from workers.compression.students import build_student, pair_orders, streamed_student
from workers.errors import FineTuneInterrupted
from workers.models.model import Model
from workers.taskargs import check_fits, resolve_task
from workers.tasks import Task, task_from_description
from workers.training.trainer import Trainer, measure


def read_plan(path: Path, teacher: ArchConfig) -> CompressionPlan:
    """The plan of a checkpoint profile, checked to be a plan for ``teacher``.

    Raises:
        CompressionError: unreadable, not a plan, or a plan for a different model.
    """
    try:
        text = path.read_text()
    except OSError as err:
        raise _plan_error(path, f"cannot read ({err.strerror})") from None
    try:
        plan = CompressionPlan.from_yaml(text)
    except CompressionError as err:
        raise _plan_error(path, str(err)) from None
    if plan.arch_id != teacher.arch_id:
        plan = for_context(plan, teacher)
    if plan.arch_id != teacher.arch_id:
        raise _plan_error(path, f"a plan for model {plan.arch_id}, not for this checkpoint "
                                f"({teacher.arch_id}); profile this one")
    problem = reduced_dims_only(teacher, plan.student)
    if problem is not None:
        raise _plan_error(path, f"its student {problem}; a plan may only lower qk_dim and "
                                "v_dim, or make mhsa layers latent")
    return plan


def _plan_error(path: Path, rule: str) -> CompressionError:
    return CompressionError.of([Problem("plan", repr(str(path)), rule)])


def for_context(plan: CompressionPlan, teacher: ArchConfig) -> CompressionPlan:
    """``plan`` made for ``teacher`` when it was made for the same model reading another
    context (``max_position_embeddings``: without learned positions it changes no weight and
    no computation within it), else ``plan`` as it is."""
    if teacher.positional == "learned":
        return plan
    as_planned = dataclasses.replace(teacher, max_seq_len=plan.student.max_seq_len)
    if as_planned.arch_id != plan.arch_id:
        return plan
    student = dataclasses.replace(plan.student, max_seq_len=teacher.max_seq_len)
    return dataclasses.replace(plan, arch_id=teacher.arch_id, student=student)


def reduced_dims_only(teacher: ArchConfig, student: ArchConfig) -> str | None:
    """None if ``student`` is ``teacher`` with some heads' ``qk_dim`` or ``v_dim`` lowered
    (``v_dim`` in mhsa layers only) or some mhsa layers made latent within the rank of their
    keys and values, else what differs (a hand-edited plan must not change what the SVD
    copies)."""
    if len(student.layers) != len(teacher.layers):
        return f"has {len(student.layers)} layers, the teacher {len(teacher.layers)}"
    for i, (old, new) in enumerate(zip(teacher.layers, student.layers)):
        if new.kind.latent:
            problem = _latent_of(old, new, teacher.d_model)
            if problem is not None:
                return f"layer {i} {problem}"
            continue
        shape = [(g.count, g.kv_heads) for g in old.heads]
        if [(g.count, g.kv_heads) for g in new.heads] != shape or any(
                n.qk_dim > o.qk_dim or n.v_dim > o.v_dim
                or (n.v_dim < o.v_dim and not old.kind.cut_values)
                for o, n in zip(old.heads, new.heads)):
            return f"layer {i} has heads {new.heads_str}, the teacher {old.heads_str}"
        if dataclasses.replace(new, heads=old.heads) != old:
            return f"layer {i} differs from the teacher's beyond qk_dim and v_dim"
    if dataclasses.replace(student, layers=teacher.layers) != teacher:
        return "differs from the teacher beyond its layers' qk_dim and v_dim"
    return None


def _latent_of(old: LayerSpec, new: LayerSpec, d_model: int) -> str | None:
    """None if latent layer ``new`` is mhsa layer ``old`` made latent within the rank of its
    stacked key and value maps, else what differs."""
    if not old.kind.to_latent:
        return (f"is latent, the teacher's {old.attention!r}: only "
                f"{kinds_text(lambda t: t.to_latent)} layers are made latent")
    full = min(d_model, old.kv_width)
    if new.latent_dim > full:
        return (f"caches a latent of {new.latent_dim}, above the rank of its keys and values "
                f"({full})")
    kept = dataclasses.replace(new, attention="mhsa", latent_dim=0, rope_dim=0,
                               rotate_latent=False)
    return None if kept == old else "differs from the teacher's beyond its latent"


def teacher_task(request: CompressRequest, loaded: Loaded
                 ) -> tuple[Task | None, TaskSpec | None]:
    """The data or task to measure and fine-tune on: the request's (in windows of the model's
    length), else the task our checkpoint was trained on (None for a GPT-2 checkpoint without
    either), and the ``TaskSpec`` that named it, for error messages (None: the checkpoint's)."""
    task = resolve_task(request.task, loaded.arch, request.seq_len)
    if task is None and loaded.task is not None:
        return task_from_description(loaded.task), None
    return task, request.task


def eval_windows(request: CompressRequest, task: Task) -> int:
    """Windows each evaluation scores: ``ceil(eval_tokens / seq_len)`` (every window of
    ``eval_batches`` batches of ``batch_size`` with ``eval_tokens`` 0), at most those."""
    every = request.eval_batches * request.batch_size
    if not request.eval_tokens:
        return every
    return min(every, -(-request.eval_tokens // task.seq_len))


def evaluate_loss(model: Model, task: Task, request: CompressRequest, what: str
                  ) -> Evaluation:
    """``model``'s loss and its task's metric on the first ``eval_windows`` validation
    windows, with their progress (a line per few windows and the time left)."""
    windows = eval_windows(request, task)
    config = TrainConfig(eval_batches=request.eval_batches, batch_size=request.batch_size)
    with Progress("evaluate", total=windows, unit="windows", quiet=request.quiet,
                  start=f"{what} on {windows:,} window(s) of {task.seq_len:,} tokens") as bar:
        measured = measure(model, task, config, "cpu", windows, bar)
    return Evaluation(measured.loss, task.metric, measured.metric)


def check_output(request: CompressRequest, loaded: Loaded, student: ArchConfig) -> None:
    """Refuse, before any work, an ``out`` / ``layout`` the teacher cannot be written as, and
    an existing ``out`` without ``force``."""
    out = request.out
    if out.suffix == ".pt":
        if request.layout is not None:
            raise UsageError.of([Problem("layout", request.layout, "only for a folder {out} "
                                         "(a .pt is a workers.train checkpoint)")])
        check_writable("out", out, force=request.force)
        check_writable("out", out.with_suffix(".arch.yaml"), force=request.force)
        return
    if not out.parent.is_dir():
        raise UsageError.of([Problem("out", repr(str(out)),
                                     f"directory {str(out.parent)!r} does not exist")])
    if out.exists() and not request.force and (not out.is_dir() or any(out.iterdir())):
        raise UsageError.of([Problem("out", repr(str(out)),
                                     "exists; pass {force} to replace it")])
    if request.layout == "stock":
        if loaded.layout not in ("gpt2", "llama"):
            raise _stock_error(f"keeps the teacher's transformers layout; this teacher is a "
                               f"{loaded.layout} checkpoint (use {{layout}} compact)")
        if out.exists():
            raise UsageError.of([Problem("out", repr(str(out)), "exists; the stock layout is "
                                         "written to a new folder")])
        if any(x.kind.latent for x in student.layers):
            raise _stock_error("the plan makes layers latent, which the teacher's stock "
                               "layout cannot hold; use {layout} compact")
        if [g.v_dim for x in student.layers for g in x.heads] != [
                g.v_dim for x in loaded.arch.layers for g in x.heads]:
            raise _stock_error("the plan cuts values (v_dim), which the teacher's stock "
                               "layout cannot hold; use {layout} compact")
    else:
        compact_export().check_exportable(student)


def _stock_error(rule: str) -> UsageError:
    return UsageError.of([Problem("layout", "stock", rule)])


def compact_export() -> Any:
    """``workers.hf.export`` (it needs ``transformers``, an optional dependency).

    Raises:
        UsageError: ``transformers`` is not installed.
    """
    try:
        from workers.hf import export
    except ImportError as err:
        raise UsageError.of([Problem(
            "layout", "compact", f"writing a transformers folder needs the transformers "
            f"package ({err}); pip install 'transformer-alloc[hf]', or write a .pt")]) from None
    return export


def sample_task(request: CompressRequest, loaded: Loaded) -> Task | None:
    """The task to evaluate and fine-tune on, checked to feed the teacher (``teacher_task``).

    Raises:
        UsageError: a ``.pt`` out without a task; TaskError, DataError: a task that does not fit.
    """
    as_pt = request.out.suffix == ".pt"
    task, named = teacher_task(request, loaded)
    if task is None and as_pt:
        raise UsageError.of([Problem("out", "*.pt", "a workers.train checkpoint needs the "
                                     "task it trains on; give {task.data} or {task.name}")])
    if task is not None:
        # the fine-tune runs the student as built (shorter windows too); a .pt is the trainer's
        check_fits(task, loaded.arch, as_pt, named)
    return task


def compress(request: CompressRequest) -> CompressResult:
    """Compress ``request.checkpoint`` by its plan and write the student to ``request.out``
    (see ``CompressRequest``); with a task, evaluate teacher and student and fine-tune.

    Raises:
        TransformerAllocError: one line each, before any work where it can be known then (an
            unreadable checkpoint or plan, a plan for another model, an ``out`` that cannot be
            written, a task that does not fit).
    """
    tick = time.perf_counter()
    if streams(request):
        return compress_streamed(request)
    loaded = load(request.checkpoint)
    read_s = time.perf_counter() - tick
    plan = read_plan(request.plan, loaded.arch)
    fits = read_fits(plan, request.plan.parent)
    check_output(request, loaded, plan.student)
    task = sample_task(request, loaded)
    finetune = task is not None and request.finetune_steps > 0
    stages = 2 + (2 if task is not None else 0) + (2 if finetune else 0)
    evaluations: dict[str, Evaluation] = {}
    with Progress(PROG, total=stages, unit="stages", quiet=request.quiet,
                  start=f"read {request.checkpoint} ({loaded.family}) in {duration(read_s)}; "
                        "building the student") as bar:
        student = build_student(loaded.model, plan.student, pair_orders(plan),
                                plan.input_scales(), fits)
        bar.update(1)
        # stages differ in cost: the time left is each evaluation's own (its progress), and
        # after the teacher's the cut student's about as long; never the stages' mean
        bar.event("student built", eta=0)
        trainer, tuned = None, None
        if task is not None:
            for name, model, what in (("teacher", loaded.model, "the teacher"),
                                      ("cut", student, "the student as cut")):
                started = time.perf_counter()
                evaluations[name] = evaluate_loss(model, task, request, what)
                bar.update(1)
                seconds = time.perf_counter() - started
                bar.event(f"evaluated {what}: loss {evaluations[name].to_dict()['loss']:.4g}",
                          eta=seconds if name == "teacher" and not finetune else 0)
            if finetune:
                evaluations["finetuned"], tuned = fine_tune(request, loaded.model, student,
                                                            task, bar)
            if request.out.suffix == ".pt":  # the trainer wires in the task
                trainer = student_trainer(request, plan.student, task, student)
        write(request, loaded, student, trainer, dtype=weights_dtype(loaded))
        if finetune:  # the student is written: its fine-tune's checkpoint is done with
            finetune_checkpoint(request.out).unlink(missing_ok=True)
        bar.update(1)
        bar.event(f"wrote {request.out}")
    return dataclasses.replace(describe(request, loaded, plan, task, evaluations),
                               finetune=tuned)


def streams(request: CompressRequest) -> bool:
    """Whether the student is built one decoder layer at a time (``compress_streamed``): a
    Llama-family folder written as a compact folder, with nothing to evaluate or fine-tune
    (those run the whole model)."""
    return (not request.task.given and request.out.suffix != ".pt"
            and request.layout in (None, "compact") and is_family_folder(request.checkpoint))


def compress_streamed(request: CompressRequest) -> CompressResult:
    """``compress`` of a Llama-family folder read one decoder layer at a time from its
    memory-mapped safetensors, the student written one layer at a time as shards: what it holds
    at once is one block (or the embedding), never the model."""
    with StreamedFolder(request.checkpoint, source_of(request.checkpoint)) as stream:
        loaded = Loaded(stream.arch, stream.model, "llama", request.checkpoint,
                        config=stream.config)  # the model on the meta device: no weights
        plan = read_plan(request.plan, loaded.arch)
        fits = read_fits(plan, request.plan.parent)
        check_output(request, loaded, plan.student)
        with Progress(PROG, total=1, unit="students", quiet=request.quiet,
                      start=f"opened {request.checkpoint} ({loaded.family}); building and "
                            "writing the student one layer at a time") as bar:
            parts = streamed_student(stream, plan.student, pair_orders(plan),
                                     plan.input_scales(), fits)
            compact_export().save_student_parts(plan.student, parts, request.out,
                                                getattr(torch, weights_dtype(loaded)),
                                                from_teacher(request, loaded))
            bar.update(1)
            bar.event(f"wrote {request.out}")
    return describe(request, loaded, plan, None, {})


def student_trainer(request: CompressRequest, student_arch: ArchConfig, task: Task,
                    student: Model) -> Trainer:
    """A ``Trainer`` of the student on ``task`` holding the (fine-tuned) ``student``'s weights
    at step 0, which a ``.pt`` ``out`` is written from: ``workers.train --resume`` trains it
    on."""
    config = TrainConfig(steps=max(1, request.finetune_steps), lr=request.lr,
                         batch_size=request.batch_size,
                         eval_every=max(1, request.finetune_steps),
                         eval_batches=request.eval_batches, seed=request.task.seed, device="cpu")
    trainer = Trainer(student_arch, task, config, checkpoint=request.out)
    trainer.model.load_state_dict(student.state_dict())
    return trainer


def fine_tune(request: CompressRequest, teacher: Model, student: Model, task: Task,
              bar: Progress) -> tuple[Evaluation, FineTune]:
    """Fine-tune ``student`` in place from ``teacher`` (``workers.compression.distil``) for
    ``request.finetune_steps``, checkpointed beside ``out`` (continued when one of the same
    fine-tune is there), then evaluate it.

    Raises:
        UsageError: ``resume`` without a checkpoint, or a checkpoint of another fine-tune
            without ``force``.
        FineTuneInterrupted: Ctrl-C, after the checkpoint is written.
    """
    path = finetune_checkpoint(request.out)
    if request.resume and not path.exists():
        raise UsageError.of([Problem("resume", "", f"no fine-tune checkpoint at {str(path)!r} "
                                     "to continue; leave {resume} out to start one")])
    settings = DistilSettings(request.finetune_steps, request.lr, request.batch_size,
                              request.finetune_loss, request.finetune_params,
                              request.finetune_hidden, request.save_every, request.task.seed)
    distiller = Distiller(teacher, student, task, settings, path,
                          source=str(request.checkpoint.resolve()))
    if request.force and not request.resume and distiller.differs():
        path.unlink()  # another fine-tune's: --force starts over
    try:
        report = run_distiller(distiller, request.quiet)
    except KeyboardInterrupt:
        raise FineTuneInterrupted.of([Problem(
            "finetune_steps", request.finetune_steps,
            f"interrupted at step {distiller.step:,}, saved to {str(path)!r}: run the same "
            "command (or add {resume}) to continue")]) from None
    bar.update(1)
    evaluation = evaluate_loss(student, task, request, "the fine-tuned student")
    bar.update(1)
    bar.event(f"evaluated the fine-tuned student: loss {evaluation.to_dict()['loss']:.4g}")
    return evaluation, FineTune(
        request.finetune_loss, request.finetune_params, request.finetune_hidden,
        report.trained_params, report.steps, report.start, report.last_loss,
        report.tail_loss, report.wall_s, report.cpu_s)


def describe(request: CompressRequest, loaded: Loaded, plan: CompressionPlan, task: Task | None,
             evaluations: dict[str, Evaluation]) -> CompressResult:
    """What was done: sizes, KV cache, heads and evaluations of teacher and student, files."""
    student_arch = plan.student
    before, after = param_count(loaded.arch), param_count(student_arch)
    dtype = weights_dtype(loaded)
    out = request.out
    return CompressResult(
        checkpoint=request.checkpoint, layout=loaded.layout, family=loaded.family,
        out_layout="pt" if out.suffix == ".pt" else request.layout or "compact",
        params=ParamCounts(before.trainable, after.trainable, before.total, after.total),
        kv_cache=KVCache(dtype, kv_cache_bytes(loaded.arch, dtype),
                         kv_cache_bytes(student_arch, dtype)),
        heads=tuple(LayerHeads(i, old.heads_str, _heads(new))
                    for i, (old, new) in enumerate(zip(loaded.arch.layers, student_arch.layers))),
        task=None if task is None else task.name, reduces=plan.reduces, measured=plan.measured,
        form=plan.form,
        files=FileBytes(weights_bytes(request.checkpoint), weights_bytes(out)), out=out,
        written=(out, out.with_suffix(".arch.yaml")) if out.suffix == ".pt" else (out,),
        teacher_eval=evaluations.get("teacher"), cut_eval=evaluations.get("cut"),
        finetuned_eval=evaluations.get("finetuned"),
        eval_windows=0 if task is None else eval_windows(request, task),
        eval_seq_len=0 if task is None else task.seq_len)


def _heads(layer: LayerSpec) -> str:
    """A student layer's heads as the report shows them (a latent layer: with its width)."""
    return layer.heads_str + (f" latent {layer.latent_dim}" if layer.kind.latent else "")


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
    gguf = gguf_file(path)
    if gguf is not None:  # quantized: the file's bytes
        return gguf.stat().st_size
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


def from_teacher(request: CompressRequest, loaded: Loaded) -> Any:
    """What the student folder takes from its teacher: a sliding window, the tokenizer."""
    window = None if loaded.config is None or loaded.layout != "llama" else sliding_window(
        loaded.config, loaded.family)
    return compact_export().FromTeacher(window, tokenizer_writer(request.checkpoint))


def write(request: CompressRequest, loaded: Loaded, student: Model, trainer: Trainer | None,
          dtype: str) -> None:
    """The student as a ``workers.train`` checkpoint (and its arch YAML), a ``transformers``
    folder of its real shapes (``compact``), or the teacher's padded ``stock`` layout."""
    out = request.out
    if out.suffix != ".pt":
        if request.layout == "stock":
            assert loaded.config is not None  # check_output: a transformers teacher
            save = save_gpt2 if loaded.layout == "gpt2" else save_llama
            save(student, loaded.config, out, getattr(torch, dtype))
        else:
            compact_export().save_student(student, out, getattr(torch, dtype),
                                          from_teacher(request, loaded))
        return
    assert trainer is not None  # compress() refused a .pt without a task
    trainer.save()  # step 0: the (fine-tuned) student, ready for workers.train --resume
    write_atomic(out.with_suffix(".arch.yaml"), student.arch.to_yaml())
