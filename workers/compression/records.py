"""What ``workers.compression.compressor.compress`` is asked and what it reports:
``CompressRequest`` in, ``CompressResult`` out (frozen and typed; ``CompressResult.to_dict`` is the
JSON report of ``python -m workers.compress --format json``). No torch: the command builds its
request from its flags with these alone."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from alloc.compression import StudentForm
from common.errors import Problem, UsageError
from userdata import TaskSpec

PROG = "workers.compress"  # the command's name: its errors' and its progress lines' prefix
# tokens each evaluation scores by default: a bounded sample, whatever --data holds (the
# eval batches at a long window are millions of tokens: 8 x 32 x 8,192 for SmolLM2-135M)
EVAL_TOKENS = 8_192
Layout = Literal["compact", "stock"]
LAYOUTS: tuple[Layout, ...] = get_args(Layout)
FineTuneLoss = Literal["kl", "ce"]  # from the teacher's logits, or the data's next tokens
FINETUNE_LOSSES: tuple[FineTuneLoss, ...] = get_args(FineTuneLoss)
FineTuneParams = Literal["new", "all"]  # the maps the cut made, or the whole student
FINETUNE_PARAMS: tuple[FineTuneParams, ...] = get_args(FineTuneParams)


@dataclass(frozen=True)
class CompressRequest:
    """What to compress, how, and where to write it.

    Attributes:
        checkpoint: the teacher: a ``workers.train`` ``.pt``, or a folder saved by
            ``transformers`` (GPT-2, Llama, Qwen2, Mistral) or by this command.
        plan: its profile (``python -m alloc.profile --checkpoint ... --out``).
        out: ``*.pt`` (a ``workers.train`` checkpoint, with ``*.arch.yaml`` beside it) or a
            folder that ``transformers`` loads.
        layout: a folder ``out``'s layout: ``compact`` (None: the default; the student at its
            real shapes) or ``stock`` (the GPT-2 or Llama teacher's, cut dims as zeros).
        task: the sample to evaluate and fine-tune on: the user's data or a generated
            task; naming neither, the task the checkpoint was trained on, if it says. Its seed
            seeds the fine-tuning too (the command's one ``--seed``).
        seq_len: the window of ``data`` or ``task`` (None: the model's ``max_seq_len``).
        finetune_steps, lr, batch_size: fine-tuning of the student (0 steps: none).
        finetune_loss: ``kl`` (the default: KL(teacher || student) of the next-token
            distributions, the teacher run on each batch) or ``ce`` (the data's next tokens).
        finetune_params: ``new`` (the default: only the maps the cut made; everything copied
            from the teacher frozen) or ``all``.
        finetune_hidden: weight of the blocks' output error relative to the teacher's, added
            to the loss (0: none).
        save_every: fine-tuning steps between checkpoints beside ``out``
            (``finetune_checkpoint``; also written on Ctrl-C, removed once ``out`` is written).
        resume: require that checkpoint and continue it (without, a matching one is
            continued too: the same command re-run continues).
        eval_batches: validation batches of each evaluation (of ``batch_size`` windows).
        eval_tokens: each evaluation scores the first ``ceil(eval_tokens / seq_len)`` windows
            of those batches (``EVAL_TOKENS``; 0: every window of them).
        force: replace an existing ``out`` (and a fine-tune checkpoint of another fine-tune).
        quiet: no progress on stderr.
    """

    checkpoint: Path
    plan: Path
    out: Path
    layout: Layout | None = None
    task: TaskSpec = field(default_factory=TaskSpec)
    seq_len: int | None = None
    finetune_steps: int = 0
    lr: float = 3e-4
    batch_size: int = 32
    finetune_loss: FineTuneLoss = "kl"
    finetune_params: FineTuneParams = "new"
    finetune_hidden: float = 0.0
    save_every: int = 50
    resume: bool = False
    eval_batches: int = 8
    eval_tokens: int = EVAL_TOKENS
    force: bool = False
    quiet: bool = False

    def __post_init__(self) -> None:
        """Raises ``UsageError`` whose problems name every field out of range (the flags'
        rules)."""
        rules = [("layout", self.layout is None or self.layout in LAYOUTS,
                  f"one of {', '.join(LAYOUTS)}"),
                 ("seq_len", self.seq_len is None or self.seq_len >= 1, "an integer >= 1"),
                 ("finetune_steps", self.finetune_steps >= 0, "an integer >= 0"),
                 ("lr", math.isfinite(self.lr) and self.lr > 0, "a number > 0"),
                 ("batch_size", self.batch_size >= 1, "an integer >= 1"),
                 ("finetune_loss", self.finetune_loss in FINETUNE_LOSSES,
                  f"one of {', '.join(FINETUNE_LOSSES)}"),
                 ("finetune_params", self.finetune_params in FINETUNE_PARAMS,
                  f"one of {', '.join(FINETUNE_PARAMS)}"),
                 ("finetune_hidden", math.isfinite(self.finetune_hidden)
                  and self.finetune_hidden >= 0, "a number >= 0"),
                 ("save_every", self.save_every >= 1, "an integer >= 1"),
                 ("eval_batches", self.eval_batches >= 1, "an integer >= 1"),
                 ("eval_tokens", self.eval_tokens >= 0, "an integer >= 0 (0: every window)")]
        problems = [Problem(name, getattr(self, name), f"must be {rule}",
                            shown=f"= {getattr(self, name)!r}")
                    for name, ok, rule in rules if not ok]
        if problems:
            raise UsageError.of(problems, prefix="CompressRequest: ")


def finetune_checkpoint(out: Path) -> Path:
    """Where the fine-tune of a student written to ``out`` is checkpointed: beside it,
    ``student.finetune.pt`` for ``student.pt``, ``small.finetune.pt`` for a folder ``small``."""
    name = out.stem if out.suffix == ".pt" else out.name
    return out.with_name(f"{name}.finetune.pt")


@dataclass(frozen=True)
class FineTune:
    """A fine-tune of the student: its loss and parameters trained (``new`` maps or ``all``),
    how many (``trained_params``), its steps (``resumed_from`` of them by an earlier run),
    the last step's loss and the mean of the last tenth's (``tail_loss``), and the wall and
    CPU seconds it took (this process's CPU time, every thread; all runs together)."""

    loss: str
    params: str
    hidden: float
    trained_params: int
    steps: int
    resumed_from: int
    last_loss: float
    tail_loss: float
    wall_s: float
    cpu_s: float


@dataclass(frozen=True)
class Evaluation:
    """A model's loss and its task's metric (``metric``, named as the task names it) on the
    validation batches."""

    loss: float
    metric: str
    value: float

    def to_dict(self) -> dict[str, float]:
        """``{"loss": ..., metric: ...}``; a metric named ``loss`` (the data tasks') is the one
        value."""
        return {"loss": self.loss, self.metric: self.value}


@dataclass(frozen=True)
class ParamCounts:
    """Parameters of teacher and student: trainable, and all (a tied head counted once)."""

    teacher: int
    student: int
    teacher_total: int
    student_total: int


@dataclass(frozen=True)
class KVCache:
    """KV cache bytes per token of teacher and student, in ``dtype`` (the teacher's)."""

    dtype: str
    teacher: int
    student: int


@dataclass(frozen=True)
class LayerHeads:
    """A layer's head groups in the teacher and the student (``ArchConfig``'s ``heads_str``)."""

    layer: int
    teacher: str
    student: str


@dataclass(frozen=True)
class FileBytes:
    """Bytes of the teacher's and the written student's weights, in the dtype stored."""

    teacher: int
    student: int


@dataclass(frozen=True)
class CompressResult:
    """What ``compress`` did: sizes, KV cache and heads of teacher and student, the losses of
    the teacher, of the student as cut and after fine-tuning (with a task), and the files
    written. ``to_dict`` is the report ``--format json`` prints."""

    checkpoint: Path
    layout: str  # the teacher's reader: ours, gpt2, llama, transformer_alloc
    family: str
    out_layout: str  # pt, compact or stock
    params: ParamCounts
    kv_cache: KVCache
    heads: tuple[LayerHeads, ...]
    task: str | None
    reduces: bool  # the plan lowers some qk_dim
    measured: bool  # the plan was measured on a sample
    form: StudentForm  # what the student caches (alloc.compression.FORMS)
    files: FileBytes
    out: Path
    written: tuple[Path, ...]
    teacher_eval: Evaluation | None = None
    cut_eval: Evaluation | None = None  # the student right after the cut
    finetuned_eval: Evaluation | None = None
    eval_windows: int = 0  # windows each evaluation scored
    eval_seq_len: int = 0  # their length
    finetune: FineTune | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "checkpoint": str(self.checkpoint), "layout": self.layout, "family": self.family,
            "out_layout": self.out_layout, "params": dataclasses.asdict(self.params),
            "kv_cache": dataclasses.asdict(self.kv_cache),
            "qk_dims": [dataclasses.asdict(x) for x in self.heads], "task": self.task,
            "plan": {"reduces": self.reduces, "measured": self.measured,
                     "form": self.form.name, "latent": self.form.latent}}
        for key, evaluation in self.evaluations.items():
            data[key] = evaluation.to_dict()
        if self.evaluations:
            data["evaluated"] = {"windows": self.eval_windows, "seq_len": self.eval_seq_len,
                                 "tokens": self.eval_windows * self.eval_seq_len}
        if self.finetune is not None:
            data["finetune"] = dataclasses.asdict(self.finetune)
        data.update(files=dataclasses.asdict(self.files), out=str(self.out),
                    written=[str(path) for path in self.written])
        return data

    @property
    def evaluations(self) -> dict[str, Evaluation]:
        """The evaluations made, by the report's names: teacher, cut (the student as cut),
        finetuned."""
        made = {"teacher": self.teacher_eval, "cut": self.cut_eval,
                "finetuned": self.finetuned_eval}
        return {key: value for key, value in made.items() if value is not None}
