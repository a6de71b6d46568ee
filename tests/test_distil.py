"""Distillation of a cut student (``workers.compression.distil``, ``workers.compress
--finetune-steps``): it lowers KL(teacher || student) on held-out windows while everything the
cut copied stays bitwise the teacher's; an interrupted fine-tune continues from its checkpoint
to exactly the uninterrupted run; the command reports it, refuses what it cannot continue and
continues what it can."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from alloc.compression import plan_compression, plan_for_kv_cache
from tests.helpers.llama import SEQ, VOCAB, build, ids, saved, token_folder
from userdata import DataSpec, TaskSpec
from workers.checkpoints import load
from workers.compression import build_student, latent_arch, measure_model
from workers.compression.distil import (
    Distiller,
    DistilSettings,
    copied_parameters,
    trained_parameters,
)
from workers.models.model import Model
from workers.taskargs import resolve_task
from workers.tasks import Task

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Model, Task, Path]:
    """A small GQA Llama teacher read from its transformers folder, and its token data."""
    folder = tmp_path_factory.mktemp("distil")
    teacher = load(saved(build("llama", num_key_value_heads=2), folder / "teacher")).model
    tokens = token_folder(folder / "tokens")
    task = resolve_task(TaskSpec(data=DataSpec(str(tokens), vocab_size=VOCAB)), teacher.arch,
                        SEQ)
    assert task is not None
    return teacher, task, folder


def student_of(teacher: Model, width: int = 16) -> Model:
    """The teacher with every layer latent at ``width`` (keys turned after they are rebuilt)."""
    arch = latent_arch(teacher.arch, [width] * teacher.arch.n_layers, 0, rotate_latent=True)
    return build_student(teacher, arch, {}, None)


@torch.no_grad()
def held_out_kl(teacher: Model, student: Model, task: Task) -> float:
    """Mean KL(teacher || student) per position over four validation batches, which the
    fine-tune never trains on."""
    total = 0.0
    for i in range(4):
        x = task.batch("val", i, 16).x
        target = F.log_softmax(teacher(x), -1).flatten(0, 1)
        total += float(F.kl_div(F.log_softmax(student(x), -1).flatten(0, 1), target,
                                log_target=True, reduction="batchmean"))
    return total / 4


def test_distillation_lowers_the_held_out_kl_and_trains_only_the_new_maps(
        setup: tuple[Model, Task, Path]) -> None:
    teacher, task, _ = setup
    student = student_of(teacher)
    copied = copied_parameters(teacher, student)
    # the cut copies everything but the latent layers' queries, down and up maps
    assert {n.rsplit(".", 2)[-2] for n, _ in student.named_parameters() if n not in copied} == {
        "q", "down", "up"}
    assert {"embed.weight", "blocks.0.attn.out.weight", "blocks.1.mlp.up.weight"} <= copied
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    kl_before = held_out_kl(teacher, student, task)
    report = Distiller(teacher, student, task,
                       DistilSettings(steps=20, lr=3e-3, batch_size=8)).run()
    kl_after = held_out_kl(teacher, student, task)
    assert kl_after < 0.8 * kl_before, (kl_before, kl_after)
    assert report.steps == 20 and report.start == 0 and report.cpu_s > 0
    theirs = dict(teacher.named_parameters())
    for name, p in student.named_parameters():
        if name in copied:
            assert torch.equal(p, theirs[name]), name  # bitwise the teacher's
        else:
            assert not torch.equal(p, before[name]), name  # trained
    assert report.trained_params == sum(p.numel() for n, p in student.named_parameters()
                                        if n not in copied)
    # the whole student when asked; nothing to train in a student that is its teacher
    assert trained_parameters(teacher, student, "all") == [n for n, _ in
                                                           student.named_parameters()]
    with pytest.raises(Exception, match="finetune_params new: the student has no new maps"):
        trained_parameters(teacher, teacher, "new")


@pytest.mark.parametrize(("loss", "params", "hidden"), [("kl", "new", 0.0),
                                                        ("ce", "all", 0.5)])
def test_an_interrupted_fine_tune_continues_to_the_uninterrupted_run(
        setup: tuple[Model, Task, Path], tmp_path: Path, loss: str, params: str,
        hidden: float) -> None:
    """Stopped by Ctrl-C after 3 of 6 steps (the checkpoint written then, and every 2 steps),
    a new ``Distiller`` of the same fine-tune resumes at step 3 and ends where the
    uninterrupted run ends: the same losses, the same parameters, bitwise."""
    teacher, task, _ = setup
    settings = DistilSettings(steps=6, lr=3e-3, batch_size=4, loss=loss,  # type: ignore[arg-type]
                              params=params, hidden=hidden, save_every=2)  # type: ignore[arg-type]
    whole = student_of(teacher)
    uninterrupted = Distiller(teacher, whole, task, settings)
    uninterrupted.run()

    def stop(step: int, _: float) -> None:
        if step == 3:
            raise KeyboardInterrupt

    checkpoint = tmp_path / "small.finetune.pt"
    first = Distiller(teacher, student_of(teacher), task, settings, checkpoint)
    with pytest.raises(KeyboardInterrupt):
        first.run(stop)
    assert checkpoint.exists()
    resumed = student_of(teacher)
    second = Distiller(teacher, resumed, task, settings, checkpoint)
    assert second.resume() and second.step == 3
    report = second.run()
    assert report.start == 3 and report.steps == 6
    assert second.losses == uninterrupted.losses
    for (name, p), q in zip(resumed.named_parameters(), whole.parameters()):
        assert torch.equal(p, q), name
    # another fine-tune's checkpoint is named, not continued
    other = Distiller(teacher, student_of(teacher), task,
                      DistilSettings(steps=6, lr=1e-3, batch_size=4, loss=loss,  # type: ignore[arg-type]
                                     params=params, hidden=hidden), checkpoint)  # type: ignore[arg-type]
    assert other.differs() == ["settings"]
    with pytest.raises(Exception, match="a fine-tune checkpoint of another settings"):
        other.resume()


def test_the_command_fine_tunes_reports_and_continues_after_ctrl_c(
        setup: tuple[Model, Task, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from workers.compress import main as compress_main
    from workers.compression import distil

    teacher, _, folder = setup
    x = ids()
    plan = plan_for_kv_cache(plan_compression(measure_model(
        teacher, x, SEQ, 4, "ids", torch.roll(x, -1, dims=1), form="latent"), -1.0, "loss"),
        0.25)
    (tmp_path / "plan.yaml").write_text(plan.to_yaml())
    base = ["--checkpoint", str(folder / "teacher"), "--plan", str(tmp_path / "plan.yaml"),
            "--data", str(folder / "tokens"), "--vocab-size", str(VOCAB), "--seq-len", str(SEQ),
            "--finetune-steps", "4", "--batch-size", "4", "--lr", "3e-3", "--eval-batches",
            "2", "--save-every", "1", "--quiet", "--format", "json"]

    def report(out: str) -> dict[str, Any]:
        assert compress_main([*base, "--out", str(tmp_path / out)]) == 0
        return dict(json.loads(capsys.readouterr().out))

    whole = report("whole")
    tuned = whole["finetune"]
    assert (tuned["loss"], tuned["params"], tuned["steps"], tuned["resumed_from"]) == (
        "kl", "new", 4, 0)
    assert whole["finetuned"]["loss"] < whole["cut"]["loss"]
    assert not (tmp_path / "whole.finetune.pt").exists()  # removed once the student is written
    step = distil.Distiller.train_step

    def interrupted(self: distil.Distiller) -> float:
        if self.step == 2:
            raise KeyboardInterrupt
        return step(self)

    monkeypatch.setattr(distil.Distiller, "train_step", interrupted)
    assert compress_main([*base, "--out", str(tmp_path / "small")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "interrupted at step 2, saved to" in err
    assert "run the same command (or add --resume) to continue" in err
    assert (tmp_path / "small.finetune.pt").exists() and not (tmp_path / "small").exists()
    monkeypatch.setattr(distil.Distiller, "train_step", step)
    # another fine-tune's checkpoint is refused in one line; --force would start over
    assert compress_main([*base, "--out", str(tmp_path / "small"), "--finetune-loss",
                          "ce"]) == 2
    assert "a fine-tune checkpoint of another settings is there" in capsys.readouterr().err
    again = report("small")  # the same command continues it
    assert again["finetune"]["resumed_from"] == 2 and again["finetune"]["steps"] == 4
    assert again["finetuned"] == whole["finetuned"]
    assert compress_main([*base, "--out", str(tmp_path / "other"), "--resume"]) == 2
    assert "--resume: no fine-tune checkpoint at" in capsys.readouterr().err
