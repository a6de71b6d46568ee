"""workers.train: learning, determinism, exact resume, non-finite handling, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from arch import ArchConfig, HeadGroup, LayerSpec, TrainConfig, param_count
from workers.models.model import build_model, count_params
from workers.tasks import DATA_TASKS, TASKS, Batch, NgramTask, fit_arch, make_task
from workers.train import main
from workers.training.trainer import EvalRecord, Trainer, measure, train

ROOT = Path(__file__).resolve().parents[1]


def arch(d: int = 64, heads: tuple[int, int] = (4, 16), layers: int = 2,
         mlp: float = 2.0, kind: str = "mhsa") -> ArchConfig:
    spec = LayerSpec(kind, (HeadGroup(*heads),), mlp_ratio=mlp)
    return ArchConfig(d_model=d, max_seq_len=8, input_dim=1, layers=(spec,) * layers)


def test_learns_ngram() -> None:
    task = make_task("ngram", "smoke")
    result = train(arch(heads=(8, 8), layers=1, mlp=0), task,
                   TrainConfig(steps=300, batch_size=32, lr=3e-3, eval_every=100))
    baseline = 4 + task.noise**2  # MSE of predicting zero: four unit-variance terms + noise
    assert result.status == "completed" and result.metric is not None
    assert result.metric < 0.6 * baseline


def test_learns_modadd_small_p() -> None:
    task = make_task("modadd", "smoke", p=11, train=100, val=21)
    result = train(arch(mlp=4.0), task, TrainConfig(steps=400, batch_size=64, lr=3e-3,
                                                    weight_decay=1.0, eval_every=100))
    assert result.metric is not None and result.metric > 5 / 11  # chance is 1/11


def test_learns_retrieval_small_m_max() -> None:
    task = make_task("retrieval", "smoke", m_max=3, vocab=32)
    result = train(arch(), task, TrainConfig(steps=400, batch_size=64, lr=3e-3, eval_every=100))
    assert result.metric is not None and result.metric > 5 / 15  # 15 possible values


def test_lion_trains() -> None:
    task = make_task("ngram", "smoke")
    result = train(arch(heads=(8, 8), layers=1, mlp=0), task,
                   TrainConfig(steps=100, batch_size=32, lr=3e-4, optimizer="lion",
                               eval_every=50))
    first, last = result.history[0].val_loss, result.history[-1].val_loss
    assert result.status == "completed" and last < first


SHORT = TrainConfig(steps=20, batch_size=8, lr=1e-3, eval_every=5)


def test_same_seed_same_curve_and_other_seed_differs() -> None:
    task = make_task("modadd", "smoke")
    a, b = train(arch(), task, SHORT), train(arch(), task, SHORT)
    c = train(arch(), task, TrainConfig(**{**SHORT.__dict__, "seed": 1}))
    assert [r.val_loss for r in a.history] == [r.val_loss for r in b.history]
    assert [r.train_loss for r in a.history] == [r.train_loss for r in b.history]
    assert [r.val_loss for r in a.history] != [r.val_loss for r in c.history]


def test_the_evaluation_states_its_standard_error() -> None:
    """The validation loss is the mean of the batches' losses; its standard error is their SD
    over sqrt(batches), recorded at every evaluation and on the result."""
    task = make_task("modadd", "smoke")
    trainer = Trainer(arch(), task, TrainConfig(steps=5, batch_size=8, eval_every=5,
                                                eval_batches=6))
    result = trainer.run()
    per_batch = []
    trainer.model.eval()
    with torch.no_grad():
        for i in range(6):
            batch = task.batch("val", i, 8)
            per_batch.append(float(task.loss(trainer.model(batch.x), batch)))
    expected = torch.tensor(per_batch, dtype=torch.float64)
    assert result.val_loss == pytest.approx(float(expected.mean()), rel=1e-6)
    assert result.val_loss_se == pytest.approx(float(expected.std() / 6**0.5), rel=1e-5)
    assert result.history[-1].val_loss_se == result.val_loss_se > 0
    one = measure(trainer.model, task, TrainConfig(batch_size=8, eval_batches=1), "cpu")
    assert one.loss_se is None  # one batch: no spread to measure
    assert one.loss == pytest.approx(per_batch[0], rel=1e-6)


def test_resume_continues_the_same_curve(tmp_path: Path) -> None:
    task = make_task("retrieval", "smoke")
    full = train(arch(kind="frozen_qk"), task, SHORT)
    ckpt = tmp_path / "run.pt"
    first = Trainer(arch(kind="frozen_qk"), task, SHORT, ckpt,
                    callbacks=[lambda r: r.step >= 10])  # stop halfway, as a scheduler would
    assert first.run().status == "stopped" and ckpt.exists()
    second = Trainer(arch(kind="frozen_qk"), task, SHORT, ckpt)
    assert second.resume() and second.step == 10
    resumed = second.run()
    assert resumed.status == "completed" and resumed.steps == 20
    assert [(r.step, r.train_loss, r.val_loss, r.metric) for r in resumed.history] == [
        (r.step, r.train_loss, r.val_loss, r.metric) for r in full.history]


@dataclass(frozen=True)
class PoisonedNgram(NgramTask):
    """Batch 3 of the training stream holds a NaN."""

    name: ClassVar[str] = "ngram"

    def batch(self, split: str, index: int, size: int) -> Batch:
        b = super().batch(split, index, size)
        if split == "train" and index == 3:
            b.x[0, 0, 0] = float("nan")
        return b


def test_non_finite_loss_ends_the_run_with_a_status() -> None:
    records: list[EvalRecord] = []
    result = train(arch(), PoisonedNgram(), TrainConfig(steps=10, batch_size=4, eval_every=2),
                   callbacks=[records.append])
    assert result.status == "diverged" and result.steps == 3
    assert result.error is not None
    assert "non-finite loss" in result.error and "step 3" in result.error
    assert [r.step for r in result.history] == [2] == [r.step for r in records]
    assert result.metric is not None and torch.isfinite(torch.tensor(result.metric))


def test_keyboard_interrupt_saves_and_reports(tmp_path: Path) -> None:
    def interrupt(record: EvalRecord) -> None:
        raise KeyboardInterrupt

    ckpt = tmp_path / "run.pt"
    result = train(arch(), make_task("ngram", "smoke"), SHORT, ckpt, callbacks=[interrupt])
    assert result.status == "interrupted" and ckpt.exists()
    assert torch.load(ckpt, weights_only=False)["step"] == 5


def test_cli_smoke_test_on_an_allocator_architecture(tmp_path: Path) -> None:
    arch_file = tmp_path / "arch.yaml"
    subprocess.run([sys.executable, "-m", "alloc.solve", "--budget", "64", "--layers", "2",
                    "--out", str(arch_file)], cwd=ROOT, check=True, capture_output=True)
    result = subprocess.run([sys.executable, "-m", "workers.train", "--arch", str(arch_file),
                             "--task", "ngram", "--smoke-test", "--format", "json", "--quiet"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["status"] == "completed" and summary["steps"] == 20
    for key in ("metric", "val_loss", "trainable_params", "tokens_per_s", "wall_s"):
        assert summary[key] > 0


@pytest.mark.parametrize("name", sorted(set(TASKS) - set(DATA_TASKS)))
def test_cli_runs_every_task_with_its_progress_bar(name: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    arch_file = tmp_path / "arch.yaml"
    layer = LayerSpec("mhsa", (HeadGroup(2, 8),), mlp_ratio=2.0)
    arch_file.write_text(ArchConfig(d_model=16, layers=(layer,), max_seq_len=1,
                                    vocab_size=2).to_yaml())
    assert main(["--arch", str(arch_file), "--task", name, "--smoke-test",
                 "--format", "json"]) == 0
    out, err = capsys.readouterr()
    summary = json.loads(out)
    assert summary["status"] == "completed" and summary["task"] == name
    assert "val_loss=" in err and "20/20" in err  # the progress bar ran to the end
    # The reported counts are the task-fitted model's: analytic and built agree.
    fitted = fit_arch(ArchConfig.from_yaml(arch_file.read_text()), make_task(name, "smoke"))
    count = param_count(fitted)
    assert (summary["trainable_params"], summary["total_params"]) == (count.trainable,
                                                                      count.total)
    assert count_params(build_model(fitted)) == (count.trainable, count.total)


@pytest.mark.parametrize(("argv", "message"), [
    (["--arch", "/nonexistent.yaml", "--task", "ngram"], "--arch '/nonexistent.yaml': cannot read"),
    (["--task", "ngram", "--task-param", "m_max=3"], "unknown parameter 'm_max' for task ngram"),
    (["--task", "ngram", "--task-param", "oops"], "--task-param 'oops': expected KEY=VALUE"),
    (["--task", "ngram", "--resume"], "--resume: needs --out PATH"),
    # An input checkpoint is --checkpoint everywhere; the trainer's output is --out.
    (["--task", "ngram", "--checkpoint", "run.pt"], "workers.train writes its checkpoint with "
                                                    "--out PATH"),
])
def test_cli_bad_input(argv: list[str], message: str, tmp_path: Path,
                       capsys: pytest.CaptureFixture[str]) -> None:
    arch_file = tmp_path / "arch.yaml"
    arch_file.write_text(arch().to_yaml())
    if "--arch" not in argv:
        argv = ["--arch", str(arch_file), *argv]
    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_cli_never_overwrites_a_checkpoint_silently(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """An existing --out is refused before any work unless --resume continues it or --force
    starts over; the file is untouched by the refusal."""
    arch_file, out = tmp_path / "arch.yaml", tmp_path / "run.pt"
    arch_file.write_text(arch(layers=1).to_yaml())
    base = ["--arch", str(arch_file), "--task", "ngram", "--smoke-test", "--quiet",
            "--out", str(out)]
    assert main(base) == 0
    assert f"wrote {out}" in capsys.readouterr().err
    before = out.read_bytes()
    assert main(base) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists; pass --force to overwrite it" in err
    assert out.read_bytes() == before
    assert main([*base, "--resume", "--steps", "30", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 30  # continued from step 20
    assert main([*base, "--force", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 20  # started over
    # Another task's checkpoint: the trainer names its field, the command its flags.
    assert main([*base[:3], "modadd", *base[4:], "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"workers.train: error: --out {str(out)!r}: "
                                                   "written for another"), err
    assert "write to a new --out, or --force to start over" in err


def test_cli_flags_given_win_over_smoke_test(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    arch_file = tmp_path / "arch.yaml"
    arch_file.write_text(arch(layers=1).to_yaml())
    assert main(["--arch", str(arch_file), "--task", "ngram", "--smoke-test", "--steps", "6",
                 "--eval-every", "3", "--quiet", "--format", "json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 6 and [r["step"] for r in summary["history"]] == [3, 6]


def test_cli_rejects_an_invalid_arch_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    bad = tmp_path / "arch.yaml"
    bad.write_text("d_model: 0\nmax_seq_len: 4\ninput_dim: 2\nlayers: [{attention: mhsa, "
                   "heads: ['2x8']}]\n")
    assert main(["--arch", str(bad), "--task", "ngram", "--quiet"]) == 2
    assert "d_model = 0: must be an integer >= 1" in capsys.readouterr().err


@pytest.mark.slow
def test_compiled_model_trains_the_same_curve() -> None:
    """torch.compile (CPU inductor here) gives the eager loss curve; ~1 min of compiling."""
    task = make_task("ngram", "smoke")
    config = TrainConfig(steps=10, batch_size=8, eval_every=5)
    eager = train(arch(layers=1), task, config)
    compiled = train(arch(layers=1), task, TrainConfig(**{**config.__dict__, "compile": True}))
    for a, b in zip(eager.history, compiled.history):
        assert a.val_loss == pytest.approx(b.val_loss, rel=1e-4)


@pytest.mark.parametrize("task", ["lm", "denoise", "addition"])
def test_the_evaluation_a_window_at_a_time_is_the_whole_batchs(
        task: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The evaluation runs a batch a few windows at a time (a large vocabulary's logits for a
    whole batch would not fit): loss, metric and standard error do not depend on the chunk,
    for a token loss, a vector loss with per-sequence side information, and a per-sequence
    metric."""
    import workers.chunks

    made = make_task(task, "smoke")
    layer = LayerSpec("mhsa", (HeadGroup(2, 8),), mlp_ratio=1.0)
    arch = fit_arch(ArchConfig(d_model=16, layers=(layer,), max_seq_len=made.seq_len,
                               input_dim=1), made)
    torch.manual_seed(0)
    model = build_model(arch)
    config = TrainConfig(eval_batches=3, batch_size=8)
    whole = measure(model, made, config, "cpu")
    monkeypatch.setattr(workers.chunks, "CHUNK_BYTES", 1)  # one window per chunk
    chunked = measure(model, made, config, "cpu")
    assert chunked.loss == pytest.approx(whole.loss, rel=1e-6)
    assert chunked.metric == pytest.approx(whole.metric, rel=1e-6)
    # the standard error is a spread of near-equal losses: float32 rounding shows at 1e-5
    assert chunked.loss_se == pytest.approx(whole.loss_se, rel=1e-4)
