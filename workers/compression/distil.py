"""A cut student fine-tuned from its teacher: ``Distiller(teacher, student, task, settings,
checkpoint).run()``, what ``workers.compress --finetune-steps N`` runs.

Each step draws the task's training batch of that step and, a few windows at a time
(``workers.chunks``), runs the teacher (no gradient) and the student on the same windows and
steps on the mean over positions of

- ``kl`` (the default): KL(teacher || student) of the next-token distributions (Hinton et
  al., 2015, at temperature 1): the teacher's whole distribution, not only its top token, so a
  cut student is pulled back towards the function it was cut from;
- ``ce``: the cross-entropy of the data's next tokens (the teacher is not run);

plus, with ``hidden > 0``, ``hidden`` times each block's output error relative to the
teacher's, ``|h_s - h_t|^2 / |h_t|^2`` averaged over blocks and positions. The teacher's logits
exist for one chunk of one batch at a time, and nothing of them is written anywhere.

``params="new"`` (the default) trains only the student's new maps, the parameters that are not
the teacher's copied unchanged (a latent layer's ``q``, ``down`` and ``up``; a cut layer's fused
``qkv``); every copied one (embedding, norms, MLPs, output maps) is frozen and ends bitwise
equal to the teacher's. ``params="all"`` trains the whole student.

A checkpoint (the trained parameters, the optimizer, the step, the time spent) is written every
``save_every`` steps and on ``KeyboardInterrupt``; a ``Distiller`` made with the same teacher,
student, task and settings continues from it (``resume``): its batches are indexed by step, so
an interrupted run continues as the uninterrupted one would have."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from arch import TrainConfig
from common.errors import Problem, UsageError
from common.progress import Progress, duration
from workers.chunks import chunk_windows
from workers.compression.records import FineTuneLoss, FineTuneParams
from workers.models.model import Model
from workers.tasks import Batch, Task, describe_task
from workers.training.trainer import make_optimizer, save_checkpoint

log = logging.getLogger(__name__)

# (teacher and student logits, their log-softmax and the KL terms) per window position
MAPS_PER_POSITION = 5


@dataclass(frozen=True)
class DistilSettings:
    """How the student is fine-tuned (the ``--finetune-*`` flags of ``workers.compress``).

    Attributes:
        steps, lr, batch_size: the optimisation (AdamW with the trainer's warmup and cosine
            schedule, ``TrainConfig``'s other defaults).
        loss: ``kl`` (from the teacher's logits) or ``ce`` (the data's next tokens).
        params: ``new`` (the maps the cut made; the rest frozen) or ``all``.
        hidden: weight of the blocks' relative output error (0: none).
        save_every: steps between checkpoints (also written on ``KeyboardInterrupt``).
        seed: the optimizer's and the batches' seed.
    """

    steps: int
    lr: float = 3e-4
    batch_size: int = 32
    loss: FineTuneLoss = "kl"
    params: FineTuneParams = "new"
    hidden: float = 0.0
    save_every: int = 50
    seed: int = 0

    def train_config(self) -> TrainConfig:
        return TrainConfig(steps=self.steps, lr=self.lr, batch_size=self.batch_size,
                           seed=self.seed, device="cpu")


@dataclass(frozen=True)
class DistilReport:
    """What a fine-tune did: steps (``start`` of them done by an earlier, interrupted run),
    the parameters trained, the last step's loss and the mean of the last tenth's, the wall
    and CPU seconds of all its runs (this process's CPU time: every thread)."""

    steps: int
    start: int
    trained_params: int
    last_loss: float
    tail_loss: float
    wall_s: float
    cpu_s: float


def copied_parameters(teacher: Model, student: Model) -> set[str]:
    """Names of the student's parameters that are the teacher's of the same name, shape and
    value: what the cut copied unchanged (a tied head is named once, as its embedding)."""
    theirs = dict(teacher.named_parameters())
    return {name for name, p in student.named_parameters()
            if name in theirs and theirs[name].shape == p.shape
            and torch.equal(theirs[name].detach(), p.detach())}


def trained_parameters(teacher: Model, student: Model, params: FineTuneParams) -> list[str]:
    """The names of the student's parameters that ``params`` trains, in order.

    Raises:
        UsageError: ``new`` for a student that is its teacher (nothing was cut).
    """
    names = [name for name, _ in student.named_parameters()]
    if params == "all":
        return names
    copied = copied_parameters(teacher, student)
    new = [name for name in names if name not in copied]
    if not new:
        raise UsageError.of([Problem("finetune_params", "new", "the student has no new maps "
                                     "(the plan cuts nothing); use {finetune_params} all")])
    return new


def hidden_error(student: list[Tensor], teacher: list[Tensor], mask: Tensor) -> Tensor:
    """Each block's ``|h_s - h_t|^2 / |h_t|^2`` at the ``mask``ed positions, averaged over
    blocks and positions."""
    errors = [((s - t).pow(2).sum(-1) / t.pow(2).sum(-1).clamp_min(1e-12))[mask].mean()
              for s, t in zip(student, teacher)]
    return torch.stack(errors).mean()


def run_blocks(model: Model, x: Tensor, keep: bool) -> tuple[Tensor, list[Tensor]]:
    """``model(x)``'s logits and, with ``keep``, each block's output (B, T, d_model)."""
    h, kept = model.inputs(x), []
    for block in model.blocks:
        h = block(h)
        if keep:
            kept.append(h)
    return model.head(model.norm(h)), kept


def chunk_loss(student: Model, teacher: Model, part: Batch, settings: DistilSettings,
               task: Task) -> Tensor:
    """The loss of ``part`` (a few windows), mean over its masked positions."""
    keep = settings.hidden > 0
    logits, hidden = run_blocks(student, part.x, keep)
    if settings.loss == "ce" and not keep:
        return task.loss(logits, part)
    with torch.no_grad():
        teacher_logits, teacher_hidden = run_blocks(teacher, part.x, keep)
    mask = part.mask
    if settings.loss == "ce":
        loss = task.loss(logits, part)
    else:  # sum over the vocabulary of p_t (log p_t - log p_s)
        target = F.log_softmax(teacher_logits[mask].float(), dim=-1)
        del teacher_logits
        loss = F.kl_div(F.log_softmax(logits[mask].float(), dim=-1), target, log_target=True,
                        reduction="batchmean")
    if keep:
        loss = loss + settings.hidden * hidden_error(hidden, teacher_hidden, mask)
    return loss


class Distiller:
    """One fine-tune of ``student`` from ``teacher`` on ``task``'s training batches; ``run``
    trains ``settings.steps`` steps in all (continuing a ``resume``d checkpoint)."""

    def __init__(self, teacher: Model, student: Model, task: Task, settings: DistilSettings,
                 checkpoint: Path | None = None, source: str = "") -> None:
        self.teacher, self.student, self.task = teacher.eval(), student, task
        self.settings, self.checkpoint, self.source = settings, checkpoint, source
        self.config = settings.train_config()
        self.trained = trained_parameters(teacher, student, settings.params)
        chosen = set(self.trained)
        for name, p in student.named_parameters():
            p.requires_grad_(name in chosen)
        for p in teacher.parameters():
            p.requires_grad_(False)
        torch.manual_seed(settings.seed)
        self.optimizer = make_optimizer(student, self.config)
        self.step, self.start, self.wall_s, self.cpu_s = 0, 0, 0.0, 0.0
        self.losses: list[float] = []
        self.tokens = 0

    @property
    def trained_count(self) -> int:
        params = dict(self.student.named_parameters())
        return sum(params[name].numel() for name in self.trained)

    def identity(self) -> dict[str, Any]:
        """What a checkpoint must match to be continued: the teacher (``source``: where it was
        read), the student, the task and the settings (how often it is saved aside)."""
        settings = dataclasses.asdict(self.settings)
        del settings["save_every"]
        return {"teacher": self.source, "student": self.student.arch.to_dict(),
                "task": describe_task(self.task), "settings": settings, "trained": self.trained}

    def differs(self) -> list[str]:
        """What the checkpoint there was written for that this fine-tune is not (``teacher``,
        ``student``, ``task``, ``settings``, ``trained``); empty when there is none or it
        matches."""
        if self.checkpoint is None or not self.checkpoint.exists():
            return []
        state = torch.load(self.checkpoint, map_location="cpu", weights_only=True)
        return [key for key, value in self.identity().items()
                if state["identity"].get(key) != value]

    def resume(self) -> bool:
        """Continue from the checkpoint if there is one; True if this run continues it.

        Raises:
            UsageError: the checkpoint is of another fine-tune (the fields that differ named).
        """
        if self.checkpoint is None or not self.checkpoint.exists():
            return False
        differs = self.differs()
        if differs:
            raise UsageError.of([Problem(
                "out", repr(str(self.checkpoint)), f"a fine-tune checkpoint of another "
                f"{' and '.join(differs)} is there; run the same fine-tune to continue it, or "
                "{force} to start over")])
        state = torch.load(self.checkpoint, map_location="cpu", weights_only=True)
        params = dict(self.student.named_parameters())
        with torch.no_grad():
            for name in self.trained:
                params[name].copy_(state["params"][name])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = self.start = state["step"]
        self.wall_s, self.cpu_s = state["wall_s"], state["cpu_s"]
        self.losses, self.tokens = list(state["losses"]), state["tokens"]
        log.info("resumed the fine-tune from %s at step %d", self.checkpoint, self.step)
        return True

    def save(self) -> None:
        """Write the checkpoint (atomically), if there is one to write."""
        if self.checkpoint is None:
            return
        params = dict(self.student.named_parameters())
        save_checkpoint(self.checkpoint, {
            "identity": self.identity(), "step": self.step, "wall_s": self.wall_s,
            "cpu_s": self.cpu_s, "losses": self.losses, "tokens": self.tokens,
            "params": {name: params[name].detach() for name in self.trained},
            "optimizer": self.optimizer.state_dict()})

    def discard(self) -> None:
        """Remove the checkpoint (the fine-tune is done and its student written)."""
        if self.checkpoint is not None and self.checkpoint.exists():
            os.remove(self.checkpoint)

    def train_step(self) -> float:
        """One optimisation step on the training batch of this step; its loss."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.lr_at(self.step)
        batch = self.task.batch("train", self.step, self.config.batch_size)
        counted = int(batch.mask.sum())
        windows = chunk_windows(MAPS_PER_POSITION * 4 * batch.x.shape[1] * self.task.output_size)
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for part in batch.split(windows):
            share = int(part.mask.sum()) / max(counted, 1)  # the batch's mean, chunk by chunk
            if not share:
                continue
            loss = chunk_loss(self.student, self.teacher, part, self.settings, self.task)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite loss ({loss.item()}) at step {self.step}")
            (loss * share).backward()
            total += loss.item() * share
        torch.nn.utils.clip_grad_norm_(
            [p for p in self.student.parameters() if p.requires_grad], self.config.grad_clip)
        self.optimizer.step()
        self.tokens += batch.x.numel()
        return total

    def run(self, progress: Callable[[int, float], None] | None = None) -> DistilReport:
        """Train to ``settings.steps``, checkpointing every ``save_every`` steps; ``progress``
        is called after each step with it and its loss.

        Raises:
            KeyboardInterrupt: after the checkpoint is written (the caller says how to go on).
        """
        self.student.train()
        try:
            while self.step < self.settings.steps:
                wall, cpu = time.perf_counter(), time.process_time()
                loss = self.train_step()
                self.step += 1
                self.losses.append(loss)
                self.wall_s += time.perf_counter() - wall
                self.cpu_s += time.process_time() - cpu
                if self.step % self.settings.save_every == 0 and self.step < self.settings.steps:
                    self.save()
                if progress is not None:
                    progress(self.step, loss)
        except KeyboardInterrupt:
            self.save()
            raise
        finally:
            self.student.eval()
        tail = self.losses[-max(1, len(self.losses) // 10):] or [float("nan")]
        return DistilReport(self.step, self.start, self.trained_count,
                            self.losses[-1] if self.losses else float("nan"),
                            sum(tail) / len(tail), self.wall_s, self.cpu_s)


def run_with_progress(distiller: Distiller, quiet: bool = False) -> DistilReport:
    """``distiller.run()`` (after ``resume``) with its progress on stderr: a bar on a terminal,
    else a line per tenth of the run with the loss, tokens/s, CPU time and the time left.

    Raises:
        KeyboardInterrupt: after the checkpoint is written and the progress says so.
    """
    settings = distiller.settings
    resumed = distiller.resume()
    what = ("KL(teacher || student)" if settings.loss == "kl" else "cross-entropy") + (
        f" + {settings.hidden:g} x hidden error" if settings.hidden else "")
    start = (f"{settings.steps:,} steps of {what}, {distiller.trained_count:,} parameters "
             f"({settings.params} {'maps' if settings.params == 'new' else 'parameters'})"
             + (f", continuing from step {distiller.step:,} of {distiller.checkpoint}"
                if resumed else ""))
    tenth = max(1, settings.steps // 10)
    with Progress("fine-tune", total=settings.steps, unit="steps", initial=distiller.step,
                  quiet=quiet, start=start) as bar:

        def progress(step: int, loss: float) -> None:
            bar.update(1, loss=f"{loss:.4g}")
            if step % tenth == 0 or step == settings.steps:
                bar.event(tok_s=f"{distiller.tokens / max(distiller.wall_s, 1e-9):,.0f}",
                          cpu=duration(distiller.cpu_s))

        try:
            report = distiller.run(progress)
        except KeyboardInterrupt:
            bar.close(f"interrupted at step {distiller.step:,}; saved to "
                      f"{distiller.checkpoint}: run the same command to continue")
            raise
    return report
