"""python -m experiments.llama_compress [--smoke-test] [--out DIR] [--seed 0]

Per-layer plan vs one ``qk_dim`` for every layer on a grouped-query Llama, at equal KV cache
(docs/theory.md §10.2): a small Llama-style byte LM (RoPE, RMSNorm, SwiGLU, 8 query heads reading
2 key/value heads) is trained here on Python's standard-library sources, written as a stock
``transformers`` Llama folder and read back (the practitioner's path: everything after that uses
the folder), profiled once, and its RoPE heads cut to fewer frequency pairs three ways at several
sizes: (a) uniform, every layer keeps ``r`` of its key dims (Palu's uniform rank); (b) the
measured-error plan and (c) the loss plan under the same KV cache budget
(``workers.profile --checkpoint --kv-cache F``, ``--rule measured`` or ``--rule loss``: the least
worst attention error, or the least summed loss increase of each layer cut alone; docs/theory.md
§10.3). Every student is fine-tuned for the same steps. Reports each student's key dims per
layer (and the loss plan's value dims: with the loss rule the budget cuts keys and values,
§10.4), KV cache bytes per token (bf16), parameters, and the loss after the cut and after
fine-tuning; exports the smallest loss-planned student as a ``transformers`` folder. Writes
``llama_compress.csv`` and ``llama_compress.png``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from alloc.compression import CompressionPlan, Rule, plan_compression, plan_for_kv_cache
from arch import ArchConfig, HeadGroup, LayerSpec, TrainConfig, kv_cache_bytes, param_count
from common.cli import int_in, render_table
from common.files import write_csv
from common.plots import new_figure, write_figure
from experiments import harness
from userdata import DataSpec
from userdata.corpora import write_code
from workers.checkpoints import llama_config, load, save_llama
from workers.compression import IGNORE, SAMPLE_BATCH, build_student, measure_model, pair_orders
from workers.models import Model
from workers.tasks import Task, make_data_task
from workers.training import Trainer, evaluate

NAME = "llama_compress"
KV_DTYPE = "bfloat16"  # the KV cache is reported at the dtype a Llama is served in


@dataclass(frozen=True)
class Sizes:
    d_model: int
    heads: int
    kv_heads: int
    layers: int
    mlp_ratio: float
    length: int
    megabytes: float
    steps: int  # teacher training
    batch: int  # teacher and fine-tuning batch
    finetune: int  # student fine-tuning steps
    align: int  # candidate key dims are multiples of it
    ranks: tuple[int, ...]  # the uniform students' qk_dim


EVAL = TrainConfig(eval_batches=16, batch_size=32, device="cpu")  # every loss reported
SMOKE = Sizes(32, 4, 2, 2, 2.0, 32, 0.2, 30, 16, 5, 2, (4,))
FULL = Sizes(256, 8, 2, 4, 2.0, 128, 8.0, 1500, 16, 200, 4, (8, 16, 24))


def teacher_arch(sizes: Sizes) -> ArchConfig:
    """The Llama-style teacher: GQA heads of ``d_model / heads``, RoPE, RMSNorm, SwiGLU."""
    group = HeadGroup(sizes.heads, sizes.d_model // sizes.heads, kv_heads=sizes.kv_heads)
    layer = LayerSpec("mhsa", (group,), mlp_ratio=sizes.mlp_ratio)
    return ArchConfig(d_model=sizes.d_model, layers=(layer,) * sizes.layers, vocab_size=256,
                      max_seq_len=sizes.length, positional="rope", norm="rmsnorm",
                      mlp="swiglu", norm_eps=1e-6, rope_theta=10000.0)


def teacher(sizes: Sizes, task: Task, steps: int, seed: int, out: Path,
            args: argparse.Namespace) -> Model:
    """The teacher read from its Llama folder ``out/teacher``; trained first (from the
    initialisation of ``seed``, resuming from ``out/teacher.pt``) and written there when the
    folder is not finished yet."""
    folder = out / "teacher"
    if not (folder / "config.json").exists():
        trainer = Trainer(teacher_arch(sizes), task,
                          TrainConfig(steps=steps, batch_size=sizes.batch, lr=3e-3,
                                      eval_every=max(1, steps // 5), seed=seed,
                                      device="cpu"),
                          checkpoint=out / "teacher.pt")
        trainer.resume()
        harness.train(trainer, "teacher", args)
        model = trainer.model.eval()
        save_llama(model, llama_config(model.arch), folder)
    return load(folder).model.eval()


def with_dims(arch: ArchConfig, dims: list[int]) -> ArchConfig:
    """``arch`` with layer ``i``'s head group keeping ``dims[i]`` query-key dims."""
    layers = [replace(x, heads=(replace(x.heads[0], qk_dim=d),)) for x, d in
              zip(arch.layers, dims)]
    return ArchConfig.from_dict({**arch.to_dict(), "layers": [x.to_dict() for x in layers]})


def layer_errors(plan: CompressionPlan) -> list[dict[int, float]]:
    """Each layer's measured attention error per candidate ``qk_dim`` (its worst head)."""
    errors = []
    for layer in plan.layers:
        measured = layer.groups[0].measured_errors
        assert measured is not None  # measured on the sample
        errors.append(dict(measured))
    return errors


def dims_of(arch: ArchConfig) -> list[int]:
    """Each layer's query-key dims per head."""
    return [x.heads[0].qk_dim for x in arch.layers]


# method -> the rule its KV-cache-budget plan minimises
METHODS: dict[str, Rule] = {"plan (attention error)": "measured", "plan (loss)": "loss"}


def max_error(errors: list[dict[int, float]], dims: list[int]) -> float:
    """The largest measured attention error over layers at ``dims``."""
    return max(e[d] for e, d in zip(errors, dims))


def student_row(method: str, rank: int, arch: ArchConfig, tolerance: float | None,
                model: Model, plan: CompressionPlan, task: Task, sizes: Sizes
                ) -> tuple[dict[str, Any], Model]:
    """Cut the teacher to ``arch`` (its key and value dims), evaluate, fine-tune, evaluate
    again (``tolerance``: the plan's worst error under its rule, None for the uniform cut;
    ``plan`` measured both)."""
    dims, values = dims_of(arch), [x.heads[0].v_dim for x in arch.layers]
    student = build_student(model, arch, pair_orders(plan), plan.input_scales())
    reduced_loss = evaluate(student, task, EVAL, "cpu")[0]
    trainer = Trainer(arch, task, TrainConfig(steps=sizes.finetune, lr=3e-4,
                                              batch_size=sizes.batch,
                                              eval_every=sizes.finetune, device="cpu"))
    trainer.model.load_state_dict(student.state_dict())
    trainer.run()
    tuned = trainer.model.eval()
    increase = sum(g.errors("loss")[d] + (g.value_losses or {}).get(v, 0.0)
                   for layer, d, v in zip(plan.layers, dims, values) for g in layer.groups)
    row = {"rank": rank, "method": method, "tolerance": "" if tolerance is None else tolerance,
           "qk_dims": " ".join(map(str, dims)), "v_dims": " ".join(map(str, values)),
           "qk_total": sum(dims), "kv_cache_bytes": kv_cache_bytes(arch, KV_DTYPE),
           "params": param_count(arch).total,
           "max_measured_error": max_error(layer_errors(plan), dims),
           "summed_loss_increase": increase,
           "reduced_loss": reduced_loss, "finetuned_loss": evaluate(tuned, task, EVAL, "cpu")[0]}
    return row, tuned


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = SMOKE if args.smoke_test else FULL
    harness.prepare(args)
    corpus = write_code(args.out / "corpus", sizes.megabytes)
    task = make_data_task(DataSpec(str(corpus)), length=sizes.length)
    model = teacher(sizes, task, args.steps or sizes.steps, args.seed, args.out, args)
    teacher_loss = evaluate(model, task, EVAL, "cpu")[0]
    sample = task.batch("val", SAMPLE_BATCH, 32)  # not the evaluation batches
    measured = measure_model(model, sample.x, sizes.length, align=sizes.align, sample="corpus",
                             targets=sample.y.masked_fill(~sample.mask, IGNORE),
                             quiet=args.quiet)
    plans = {rule: plan_compression(measured, 1.0, rule=rule)  # pair rankings and errors
             for rule in METHODS.values()}
    teacher_kv_units = model.arch.kv_width
    rows: list[dict[str, Any]] = []
    smallest: Model | None = None
    with harness.runs(args, NAME, len(sizes.ranks) * (1 + len(METHODS)), "students",
                      start=f"cut and fine-tune ({sizes.finetune} steps) the uniform and the "
                            "planned students at each KV cache") as bar:
        for rank in sizes.ranks:
            uniform = [rank] * model.arch.n_layers
            rows.append(student_row("uniform", rank, with_dims(model.arch, uniform), None,
                                    model, plans["loss"], task, sizes)[0])
            bar.update(1)
            bar.event(f"uniform qk_dim {rank}: fine-tuned loss {rows[-1]['finetuned_loss']:.4f}")
            fraction = with_dims(model.arch, uniform).kv_width / teacher_kv_units
            for method, rule in METHODS.items():
                budget = plan_for_kv_cache(plans[rule], fraction)
                row, tuned = student_row(method, rank, budget.student, budget.tolerance, model,
                                         plans["loss"], task, sizes)
                rows.append(row)
                if rule == "loss" and rank == min(sizes.ranks):
                    smallest = tuned
                bar.update(1)
                bar.event(f"{method} at the KV cache of qk_dim {rank}: fine-tuned loss "
                          f"{row['finetuned_loss']:.4f}")
    assert smallest is not None
    from workers.hf.export import save_student  # transformers: only when the student is saved

    report = save_student(smallest, args.out / "student")
    write_csv(args.out / "llama_compress.csv", rows)
    teacher_kv = kv_cache_bytes(model.arch, KV_DTYPE)
    plot(rows, teacher_loss, teacher_kv, args.out / "llama_compress.png")
    return {"teacher": model.arch.layers[0].heads_str, "teacher_loss": teacher_loss,
            "teacher_params": param_count(model.arch).total, "teacher_kv_cache_bytes": teacher_kv,
            "teacher_file_bytes": (args.out / "teacher" / "model.safetensors").stat().st_size,
            "student_qk_dims": rows[2]["qk_dims"], "student_params": report.params,
            "student_file_bytes": report.file_bytes, "rows": rows, "out": str(args.out)}


def plot(rows: list[dict[str, Any]], teacher_loss: float, teacher_kv: int, path: Path) -> None:
    """Loss after the cut and after fine-tuning against the KV cache, both methods."""
    fig, axes = new_figure(2, (11, 4.2))
    for ax, key, title in ((axes[0], "reduced_loss", "right after the cut"),
                           (axes[1], "finetuned_loss", "after fine-tuning")):
        for k, method in enumerate(("uniform", *METHODS)):
            mine = sorted((r for r in rows if r["method"] == method),
                          key=lambda r: r["kv_cache_bytes"])
            ax.plot([r["kv_cache_bytes"] for r in mine], [r[key] for r in mine],
                    ("x--", "o-", "s-")[k], color=f"C{k}", label=method)
        ax.axhline(teacher_loss, color="k", lw=0.8, ls=":",
                   label=f"teacher ({teacher_kv:,} B/token)")
        ax.set_xlabel(f"KV cache per token ({KV_DTYPE} bytes)")
        ax.set_ylabel("validation loss (nats per byte)")
        ax.set_title(f"GQA Llama students at equal KV cache: {title}")
        ax.legend(fontsize=8)
    write_figure(fig, path)


def render(result: dict[str, Any]) -> str:
    table = render_table(
        ["r", "method", "qk per layer", "v per layer", "KV B/token", "params", "max err",
         "sum dloss", "loss (cut)", "loss (fine-tuned)"],
        [[r["rank"], r["method"], r["qk_dims"], r["v_dims"], f"{r['kv_cache_bytes']:,}",
          f"{r['params']:,}",
          f"{r['max_measured_error']:.3g}", f"{r['summed_loss_increase']:.3g}",
          f"{r['reduced_loss']:.4f}", f"{r['finetuned_loss']:.4f}"] for r in result["rows"]],
        right=[True, False, False, False, True, True, True, True, True, True])
    return "\n".join([
        f"teacher {result['teacher']} (Llama folder): {result['teacher_params']:,} parameters, "
        f"KV cache {result['teacher_kv_cache_bytes']:,} B/token, validation loss "
        f"{result['teacher_loss']:.4f}", table,
        f"model.safetensors: teacher {result['teacher_file_bytes']:,} bytes; smallest loss-planned "
        f"student ({result['student_qk_dims']}) {result['student_file_bytes']:,} bytes, "
        f"{result['student_params']:,} parameters",
        f"wrote {result['out']}/llama_compress.csv, llama_compress.png, student/"])


def main(argv: list[str] | None = None) -> int:
    parser = harness.build_parser(NAME, __doc__)
    parser.add_argument("--steps", type=int_in(1), help="teacher training steps (default: 1500;"
                                                        " 30 with --smoke-test)")
    parser.add_argument("--seed", type=int_in(0), default=0,
                        help="the teacher's initialisation (a new --out for another one)")
    return harness.main(parser, argv, run, render)


if __name__ == "__main__":
    sys.exit(main())
