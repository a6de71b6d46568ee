"""The trainer behind ``python -m workers.train`` (``workers.train`` reads the flags; this is what
runs): ``Trainer`` trains an ``ArchConfig`` on a task, ``train`` is the one-call form, and
``evaluate`` measures a model on a task's validation batches.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from arch import ArchConfig, TrainConfig
from common import stats
from common.errors import Problem
from common.progress import Progress
from workers.checkpoints import CheckpointError
from workers.chunks import chunk_windows
from workers.models.model import Model, build_model, count_params, maybe_compile
from workers.tasks import Batch, Task, TextTask, describe_task, fit_arch

log = logging.getLogger(__name__)
# How a training run ended (a search trial's status is ``studies.records.TrialStatus``: a run
# that diverged is a trial that failed).
RunStatus = Literal["completed", "stopped", "diverged", "interrupted"]


@dataclass(frozen=True)
class EvalRecord:
    """One evaluation: the learning curve is the list of these."""

    step: int
    train_loss: float
    val_loss: float
    metric: float
    tokens_per_s: float
    elapsed_s: float
    val_loss_se: float | None = None  # standard error of val_loss (``Evaluation``)


@dataclass
class TrainResult:
    status: RunStatus
    steps: int
    metric: float | None
    val_loss: float | None
    train_loss: float | None
    trainable_params: int
    total_params: int
    tokens_per_s: float
    wall_s: float
    task: str
    metric_name: str
    history: list[EvalRecord] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    val_loss_se: float | None = None  # standard error of val_loss (``Evaluation``)

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        data["history"] = [asdict(r) for r in self.history]
        return data


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al., 2023): sign of an interpolated momentum, decoupled weight decay."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-4,
                 betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                momentum = self.state[p].setdefault("exp_avg", torch.zeros_like(p))
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_((momentum * beta1 + p.grad * (1 - beta1)).sign_(), alpha=-group["lr"])
                momentum.mul_(beta2).add_(p.grad, alpha=1 - beta2)


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """Weight decay on matrices only; frozen parameters are left out. ``config``'s ``lr`` must
    be fixed (``TrainConfig.for_width``)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    if config.optimizer == "lion":
        return Lion(groups, lr=config.peak_lr)
    # Fused: one kernel for all parameters, 8x faster than the default on CPU (measured).
    return torch.optim.AdamW(groups, lr=config.peak_lr, betas=(0.9, 0.95), fused=True)


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


@dataclass(frozen=True)
class Evaluation:
    """A model measured on a task's validation batches."""

    loss: float  # mean of the per-batch losses
    metric: float  # the task's metric, summed over the batches' positions
    # The standard error of ``loss``: the SD of the per-batch losses over sqrt(batches). Per
    # batch, not per token or window: ``loss`` is the mean of the batch losses and each batch
    # is drawn by its own generator, so they are independent draws and this is that mean's
    # SE; a window's tokens are correlated (per-token errors would understate it), and the
    # task gives its loss per batch only. None with fewer than two batches.
    loss_se: float | None


@torch.no_grad()
def measure(model: nn.Module, task: Task, config: TrainConfig, device: str,
            windows: int | None = None, progress: Progress | None = None) -> Evaluation:
    """The model's validation loss, its standard error and the task's metric over
    ``eval_batches`` fixed validation batches (the same batches for every model and seed).
    Each batch runs a few windows at a time (``workers.chunks``): a batch of 32 windows
    of 2,048 tokens over a 32,000-token vocabulary would be 8.4 GB of logits at once; a text
    model's logits are formed ``HEAD_TOKENS`` positions at a time when even one window's would
    not fit (SmolLM2's 8,192 positions over 49,152 tokens: 1.6 GB).

    Args:
        windows: score only the first this many windows of those batches (None: all of
            them), batch ``i`` cut short where the count ends.
        progress: advanced by each chunk's windows, with a line per chunk.
    """
    model.eval()
    losses, total, count = [], 0.0, 0
    left = config.eval_batches * config.batch_size if windows is None else windows
    for i in range(config.eval_batches):
        if left <= 0:
            break
        batch = task.batch("val", i, config.batch_size).to(device)
        batch = batch.split(left)[0]
        left -= len(batch.x)
        loss, positions = 0.0, 0
        for part in batch.split(chunk_windows(4 * batch.x.shape[1] * task.output_size)):
            part_loss, counted, s, n = _score(model, task, part, device)
            loss, positions = loss + part_loss, positions + counted
            total, count = total + s, count + n
            if progress is not None:
                progress.update(len(part.x))
                progress.event()
        losses.append(loss / max(positions, 1))
    model.train()
    n = len(losses)
    se = stats.sd(losses) / math.sqrt(n) if n >= 2 else None
    return Evaluation(sum(losses) / n, total / max(count, 1), se)


HEAD_TOKENS = 512  # a text model's output positions whose logits are formed at once


@torch.no_grad()
def _score(model: nn.Module, task: Task, part: Batch, device: str
           ) -> tuple[float, int, float, int]:
    """A few windows' summed loss, its positions, and the metric's (sum, count)."""
    pieces = isinstance(model, Model) and isinstance(task, TextTask) and device != "cuda" \
        and chunk_windows(4 * part.x.shape[1] * task.output_size) == 1 \
        and part.x.shape[1] > HEAD_TOKENS
    if not pieces:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
            out = model(part.x)
        counted = int(part.mask.sum())  # the loss is a mean over these positions
        loss = float(task.loss(out, part)) * counted if counted else 0.0
        s, n = task.score(out, part)
        return loss, counted, s, n
    assert isinstance(model, Model)
    h = model.inputs(part.x)
    for block in model.blocks:
        h = block(h)
    h = model.norm(h).flatten(0, 1)
    y, mask = part.y.flatten(), part.mask.flatten()
    loss, counted = 0.0, 0
    for a in range(0, len(h), HEAD_TOKENS):
        rows = slice(a, a + HEAD_TOKENS)
        logits = model.head(h[rows])[mask[rows]].float()
        loss += float(torch.nn.functional.cross_entropy(logits, y[rows][mask[rows]],
                                                        reduction="sum"))
        counted += int(mask[rows].sum())
    return loss, counted, loss, counted  # a text task's metric is its loss


def evaluate(model: nn.Module, task: Task, config: TrainConfig, device: str) -> tuple[float, float]:
    """(validation loss, metric) over ``eval_batches`` fixed validation batches (``measure``
    without the standard error)."""
    measured = measure(model, task, config, device)
    return measured.loss, measured.metric


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Atomic: a crash mid-write leaves the previous checkpoint intact."""
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


class Trainer:
    """One training run of ``arch`` on ``task``; ``run()`` returns a ``TrainResult``."""

    def __init__(self, arch: ArchConfig, task: Task, config: TrainConfig,
                 checkpoint: Path | None = None,
                 callbacks: Iterable[Callable[[EvalRecord], bool | None]] = ()) -> None:
        self.arch, self.task = fit_arch(arch, task), task
        # The width rule's lr when the config names none (arch.training.width_lr)
        self.config = config.for_width(self.arch.d_model)
        self.device = resolve_device(config.device)
        self.checkpoint, self.callbacks = checkpoint, list(callbacks)
        torch.manual_seed(config.seed)
        self.model = build_model(self.arch).to(self.device)
        self.params = count_params(self.model)
        self.optimizer = make_optimizer(self.model, self.config)
        self.forward = maybe_compile(self.model, self.config.compile)
        self.step, self.tokens, self.train_time = 0, 0, 0.0
        self.history: list[EvalRecord] = []
        self.last_loss: float | None = None

    def resume(self) -> bool:
        """Load the checkpoint if there is one; True if the run continues from it."""
        if self.checkpoint is None or not self.checkpoint.exists():
            return False
        self.restore(self.checkpoint)
        return True

    def restore(self, path: Path) -> None:
        """Continue from the checkpoint file ``path`` (model, optimizer, step, curve).

        Raises:
            CheckpointError: the checkpoint was written for another architecture or task.
        """
        # weights_only: a checkpoint is tensors, dicts and numbers; never unpickle code
        state = torch.load(path, map_location=self.device, weights_only=True)
        if state["arch"] != self.arch.to_dict() or state["task"] != describe_task(self.task):
            raise CheckpointError.of([Problem("checkpoint", repr(str(path)), "written for "
                                              "another architecture or task; write to a new "
                                              "{checkpoint}, or {force} to start over")])
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.tokens, self.train_time = state["step"], state["tokens"], state["time"]
        self.history = [EvalRecord(**r) for r in state["history"]]
        self.last_loss = state["last_loss"]
        log.info("resumed from %s at step %d", path, self.step)

    def save(self) -> None:
        if self.checkpoint is None:
            return
        save_checkpoint(self.checkpoint, {
            "arch": self.arch.to_dict(), "task": describe_task(self.task),
            "config": asdict(self.config),
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "step": self.step, "tokens": self.tokens, "time": self.train_time,
            "history": [asdict(r) for r in self.history], "last_loss": self.last_loss})

    def train_step(self) -> str | None:
        """One optimisation step; returns an error message if the loss or gradient is not finite."""
        config = self.config
        for group in self.optimizer.param_groups:
            group["lr"] = config.lr_at(self.step)
        batch = self.task.batch("train", self.step, config.batch_size).to(self.device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device == "cuda"):
            loss = self.task.loss(self.forward(batch.x), batch)
        if not torch.isfinite(loss):
            return f"non-finite loss ({loss.item()}) at step {self.step}"
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(
            [p for p in self.model.parameters() if p.requires_grad], config.grad_clip)
        if not torch.isfinite(norm):
            return f"non-finite gradient norm at step {self.step}"
        self.optimizer.step()
        self.tokens += batch.x.shape[0] * batch.x.shape[1]
        self.last_loss = loss.item()
        return None

    def evaluate(self) -> bool:
        """Record an evaluation, checkpoint, and ask the callbacks; True means stop."""
        measured = measure(self.model, self.task, self.config, self.device)
        record = EvalRecord(self.step, self.last_loss or float("nan"), measured.loss,
                            measured.metric, self.tokens / max(self.train_time, 1e-9),
                            self.train_time, measured.loss_se)
        self.history.append(record)
        self.save()
        return any(bool(cb(record)) for cb in self.callbacks)

    def run(self, progress: Callable[[int, EvalRecord | None], None] | None = None
            ) -> TrainResult:
        start, error = time.perf_counter(), None
        status: RunStatus = "completed"
        try:
            while self.step < self.config.steps:
                tick = time.perf_counter()
                error = self.train_step()
                if error is not None:
                    status = "diverged"
                    break
                self.step += 1
                self.train_time += time.perf_counter() - tick
                due = self.step % self.config.eval_every == 0 or self.step == self.config.steps
                stop = self.evaluate() if due else False
                if progress is not None:
                    progress(self.step, self.history[-1] if due else None)
                if stop:
                    status = "stopped"
                    break
        except KeyboardInterrupt:
            status, error = "interrupted", f"interrupted at step {self.step}"
            self.save()
        return self.result(status, error, time.perf_counter() - start)

    def result(self, status: RunStatus, error: str | None, wall: float) -> TrainResult:
        last = self.history[-1] if self.history else None
        metric = last.metric if last else None
        extra = self.task.extra(metric, self.params[0]) if metric is not None else {}
        return TrainResult(
            status=status, steps=self.step, metric=metric,
            val_loss=last.val_loss if last else None, train_loss=self.last_loss,
            trainable_params=self.params[0], total_params=self.params[1],
            tokens_per_s=self.tokens / max(self.train_time, 1e-9), wall_s=wall,
            task=self.task.name, metric_name=self.task.metric, history=self.history,
            extra=extra, error=error, val_loss_se=last.val_loss_se if last else None)


def train(arch: ArchConfig, task: Task, config: TrainConfig, checkpoint: Path | None = None,
          resume: bool = False,
          callbacks: Iterable[Callable[[EvalRecord], bool | None]] = ()) -> TrainResult:
    """Train ``arch`` on ``task``; with ``resume`` continue from ``checkpoint`` if it exists."""
    trainer = Trainer(arch, task, config, checkpoint, callbacks)
    if resume:
        trainer.resume()
    return trainer.run()


def progress_fields(record: EvalRecord, metric: str) -> dict[str, str]:
    """The progress's fields at an evaluation; the task's metric once, even when it is a loss
    itself."""
    fields = {"train_loss": f"{record.train_loss:.4g}", "val_loss": f"{record.val_loss:.4g}"}
    if metric not in ("loss", "val_loss"):
        fields[metric] = f"{record.metric:.4g}"
    fields["tok_s"] = f"{record.tokens_per_s:,.0f}"
    return fields


def run_with_progress(trainer: Trainer, desc: str, quiet: bool = False, start: str = ""
                      ) -> TrainResult:
    """``trainer.run()`` with its progress on stderr (``common.progress``): a bar on a
    terminal, else one line per evaluation, and one per tenth of the run where evaluations are
    further apart, with the loss, tokens/s and the time left; nothing when ``quiet``."""
    config = trainer.config
    tenth = max(1, config.steps // 10)
    with Progress(desc, total=config.steps, unit="steps", initial=trainer.step, quiet=quiet,
                  start=start) as bar:

        def progress(step: int, record: EvalRecord | None) -> None:
            if record is not None:
                bar.update(1, **progress_fields(record, trainer.task.metric))
                bar.event()
                return
            bar.update(1)
            if step % tenth == 0 and config.eval_every > tenth:
                loss = trainer.last_loss
                bar.event(train_loss=None if loss is None else f"{loss:.4g}",
                          tok_s=f"{trainer.tokens / max(trainer.train_time, 1e-9):,.0f}")

        result = trainer.run(progress)
        bar.close("" if result.status == "completed" else
                  f"{result.status}" + (f" ({result.error})" if result.error else ""))
    return result


def describe_run(trainer: Trainer) -> str:
    """The progress's first line: what trains, how long, where."""
    arch, config = trainer.arch, trainer.config
    resumed = f" from step {trainer.step:,}" if trainer.step else ""
    return (f"training {trainer.params[0]:,} parameters (d_model {arch.d_model}, "
            f"{arch.n_layers} layers) for {config.steps:,} steps{resumed} on {trainer.device}")
