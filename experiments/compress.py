"""python -m experiments.compress [--smoke-test] [--out results/compress] [--steps 1500]

Compressing a trained model's attention where the theory allows (docs/theory.md §10): a byte LM
is trained here on Python's standard-library sources (``--data``), profiled (``workers.profile
--checkpoint``: per-head query-key spectra, logit bounds, attention entropy per layer), and
compressed two ways at several sizes: (a) the profile's per-layer ``qk_dim`` plan (the measured
attention error of each layer within a tolerance) and (b) one ``qk_dim`` for every layer at the
same total parameter count. Both students start from the truncated SVD of each head's
``W_Q W_K^T`` and are fine-tuned for the same steps. Reports parameters, the loss of the
teacher, of each student after the SVD and after fine-tuning, and each layer's entropy (how
saturated its softmax is). Writes ``compress.csv`` and ``compress.png``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alloc.compression import plan_compression
from arch import ArchConfig, HeadGroup, LayerSpec, TrainConfig, merge_groups, param_count
from common.cli import int_in, render_table
from common.files import write_csv
from common.plots import new_figure, write_figure
from experiments import harness
from userdata import DataSpec
from userdata.corpora import write_code
from workers.compression import SAMPLE_BATCH, build_student, measure_model
from workers.models import Model
from workers.tasks import Task, make_data_task
from workers.training import Trainer, evaluate

NAME = "compress"


@dataclass(frozen=True)
class Sizes:
    d_model: int
    heads: int
    layers: int
    length: int
    megabytes: float
    steps: int  # teacher training
    finetune: int  # student fine-tuning
    tolerances: tuple[float, ...]


EVAL = TrainConfig(eval_batches=16, batch_size=32, device="cpu")  # every loss reported
SMOKE = Sizes(32, 2, 2, 32, 0.2, 40, 5, (0.05,))
FULL = Sizes(128, 4, 4, 128, 8.0, 1500, 200, (0.01, 0.03, 0.1))


def teacher(sizes: Sizes, task: Task, steps: int, checkpoint: Path,
            args: argparse.Namespace) -> Model:
    """The byte LM teacher (continued / reused from its checkpoint)."""
    layer = LayerSpec("mhsa", (HeadGroup(sizes.heads, sizes.d_model // sizes.heads),),
                      mlp_ratio=4.0)
    arch = ArchConfig(d_model=sizes.d_model, layers=(layer,) * sizes.layers, vocab_size=256,
                      max_seq_len=sizes.length, positional="learned")
    trainer = Trainer(arch, task, TrainConfig(steps=steps, batch_size=32, lr=3e-3,
                                              eval_every=max(1, steps // 5), device="cpu"),
                      checkpoint=checkpoint)
    trainer.resume()
    harness.train(trainer, "teacher", args)
    return trainer.model.eval()


def uniform_like(arch: ArchConfig, planned: ArchConfig) -> ArchConfig:
    """One ``qk_dim`` in every layer with the planned student's total query-key width (when it
    does not divide evenly, the first layers take one more)."""
    per_layer = [sum(g.count * g.qk_dim for g in x.heads) for x in planned.layers]
    heads = arch.layers[0].heads[0].count
    total, count = sum(per_layer), len(per_layer) * heads
    base, extra = divmod(total, count)
    layers, given = [], 0
    for layer in arch.layers:
        count, v_dim = layer.heads[0].count, layer.heads[0].v_dim
        dims = [base + (given + h < extra) for h in range(count)]
        given += count
        layers.append(LayerSpec(layer.attention, merge_groups(HeadGroup(1, r, v_dim)
                                                              for r in dims),
                                layer.mlp_ratio, layer.role))
    return ArchConfig.from_dict({**arch.to_dict(), "layers": [x.to_dict() for x in layers]})


def student_row(name: str, tolerance: float, model: Model, arch: ArchConfig, task: Task,
                sizes: Sizes) -> dict[str, Any]:
    """Compress to ``arch``, evaluate after the SVD, fine-tune, evaluate again."""
    student = build_student(model, arch)
    trainer = Trainer(arch, task, TrainConfig(steps=sizes.finetune, lr=3e-4, batch_size=32,
                                              eval_every=sizes.finetune, device="cpu"))
    trainer.model.load_state_dict(student.state_dict())
    svd_loss = evaluate(student, task, EVAL, "cpu")[0]
    trainer.run()
    return {"tolerance": tolerance, "plan": name,
            "qk_dims": " | ".join(x.heads_str for x in arch.layers),
            "params_trainable": param_count(arch).trainable, "svd_loss": svd_loss,
            "finetuned_loss": evaluate(trainer.model, task, EVAL, "cpu")[0]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = SMOKE if args.smoke_test else FULL
    harness.prepare(args)
    corpus = write_code(args.out / "corpus", sizes.megabytes)
    task = make_data_task(DataSpec(str(corpus)), length=sizes.length)
    model = teacher(sizes, task, args.steps or sizes.steps, args.out / "teacher.pt", args)
    teacher_loss = evaluate(model, task, EVAL, "cpu")[0]
    sample = task.batch("val", SAMPLE_BATCH, 32).x  # not the evaluation batches
    measured = measure_model(model, sample, sizes.length, align=4, sample="corpus",
                             quiet=args.quiet)
    rows: list[dict[str, Any]] = []
    with harness.runs(args, NAME, 2 * len(sizes.tolerances), "students",
                      start=f"cut and fine-tune ({sizes.finetune} steps) two students per "
                            "tolerance") as bar:
        for tolerance in sizes.tolerances:
            planned = plan_compression(measured, tolerance, rule="measured").student
            for name, arch in (("allocator", planned),
                               ("uniform", uniform_like(model.arch, planned))):
                rows.append(student_row(name, tolerance, model, arch, task, sizes))
                bar.update(1)
                bar.event(f"{name} at tolerance {tolerance:g}: fine-tuned loss "
                          f"{rows[-1]['finetuned_loss']:.4f}")
    layers = plan_compression(measured, sizes.tolerances[-1]).layers
    entropy = [{"layer": x.index, "entropy": x.entropy, "logit_bound_R": x.logit_bound}
               for x in layers]
    write_csv(args.out / "compress.csv", rows)
    plot(rows, entropy, teacher_loss, param_count(model.arch).trainable, args.out / "compress.png")
    return {"teacher_loss": teacher_loss, "teacher_params": param_count(model.arch).trainable,
            "teacher": " | ".join(x.heads_str for x in model.arch.layers), "rows": rows,
            "entropy": entropy, "out": str(args.out)}


def plot(rows: list[dict[str, Any]], entropy: list[dict[str, Any]], teacher_loss: float,
         teacher_params: int, path: Path) -> None:
    fig, axes = new_figure(2, (11, 4.2))
    for k, name in enumerate(("allocator", "uniform")):
        mine = sorted((r for r in rows if r["plan"] == name), key=lambda r: r["params_trainable"])
        x = [r["params_trainable"] for r in mine]
        axes[0].plot(x, [r["svd_loss"] for r in mine], "x:", color=f"C{k}",
                     label=f"{name}: right after the SVD")
        axes[0].plot(x, [r["finetuned_loss"] for r in mine], "o-", color=f"C{k}",
                     label=f"{name}: fine-tuned")
    axes[0].scatter([teacher_params], [teacher_loss], marker="*", s=120, c="k",
                    label="teacher")
    axes[0].set_xlabel("trainable parameters")
    axes[0].set_ylabel("validation loss (nats per byte)")
    axes[0].set_title("students at equal size: per-layer plan vs uniform qk_dim")
    axes[0].legend(fontsize=8)
    layers = [e["layer"] for e in entropy]
    axes[1].plot(layers, [e["entropy"] for e in entropy], "o-", label="entropy / ln N")
    axes[1].plot(layers, [1 / max(e["logit_bound_R"], 1e-9) for e in entropy], "s--",
                 label="1 / R (R: largest |logit|)")
    axes[1].set_xticks(layers)
    axes[1].set_xlabel("layer")
    axes[1].set_ylabel("mean over heads and rows")
    axes[1].set_title("how saturated each layer's softmax is (teacher)")
    axes[1].legend(fontsize=8)
    write_figure(fig, path)


def render(result: dict[str, Any]) -> str:
    table = render_table(["tolerance", "plan", "qk per layer", "trainable params", "loss (SVD)",
                          "loss (fine-tuned)"],
                         [[f"{r['tolerance']:g}", r["plan"], r["qk_dims"],
                           f"{r['params_trainable']:,}", f"{r['svd_loss']:.4f}",
                           f"{r['finetuned_loss']:.4f}"] for r in result["rows"]],
                         right=[True, False, False, True, True, True])
    entropy = ", ".join(f"L{e['layer']} {e['entropy']:.2f} (R {e['logit_bound_R']:.3g})"
                        for e in result["entropy"])
    return "\n".join([
        f"teacher {result['teacher']}: {result['teacher_params']:,} trainable parameters, "
        f"validation loss {result['teacher_loss']:.4f}", table,
        f"entropy / ln N per layer: {entropy}", f"wrote {result['out']}/compress.csv, "
        "compress.png"])


def main(argv: list[str] | None = None) -> int:
    parser = harness.build_parser(NAME, __doc__)
    parser.add_argument("--steps", type=int_in(1), help="teacher training steps (default: 1500;"
                                                        " 40 with --smoke-test)")
    return harness.main(parser, argv, run, render)


if __name__ == "__main__":
    sys.exit(main())
