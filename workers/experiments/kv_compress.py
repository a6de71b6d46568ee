"""python -m workers.experiments.kv_compress [--smoke-test] [--out DIR] [--seeds 0 1]

Five ways to shrink a trained GQA Llama's KV cache, side by side at 50%, 25% and 12.5% of what
its teacher caches per token (docs/theory.md §10): the teacher of ``llama_compress`` (a byte LM
with RoPE, RMSNorm, SwiGLU, 8 query heads reading 2 key/value heads, trained here on Python's
standard-library sources, written as a stock Llama folder and read back), one per ``--seeds``
value, each cut by

- ``svd``: every layer's keys and values rebuilt from one latent of equal width per layer, the
  truncated SVD of the stacked key and value maps; keys turned by RoPE after they are rebuilt
  (a latent layer with ``rotate_latent``, §10.5). One SVD of all of a layer's key/value heads
  is at least as close to the maps as one per head at the same cache;
- ``asvd``: the same, weighted by the sample's input RMS per feature (Yuan et al., 2023);
- ``palu``: as ``asvd``, with the latent widths allocated across layers in proportion to the
  Fisher information of each layer's key and value maps on the sample (Palu's rank
  allocation; Chang et al., 2025);
- ``mha2mla``: each key/value head keeps the RoPE pairs whose query and key norms on the
  sample are largest (MHA2MLA's 2-norm choice; Ji et al., 2025) as a decoupled RoPE part of a
  quarter of the head; the rest of the keys and the values in one input-weighted latent,
  without RoPE;
- ``ours``: the loss plan of ``workers.profile --rule loss --kv-cache F``: each layer's RoPE
  pairs and value dims cut where the sample's loss rises least (§10.3-§10.4), as a compact
  student;
- ``ours-latent``: the latent plan of ``workers.profile --rule loss --latent --kv-cache F``:
  the same loss rule choosing each layer's latent width for the ``asvd`` latent (every layer's
  latent cut alone to each candidate width, multiples of 8, its loss increase on the sample
  measured; the widths within the budget with the least summed increase chosen by dynamic
  programming), built by ``workers.compress``'s code.

Every student is evaluated right after the cut and after the same fine-tuning. Writes
``kv_compress.csv`` (every student, after each; a second run on the same ``--out`` computes
only the rows it lacks), ``kv_compress_summary.csv`` (per size and method: the mean
over teachers and each teacher's value) and ``kv_compress.png``.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from alloc.compression import (
    CheckpointMeasurement,
    CompressionError,
    CompressionPlan,
    plan_compression,
    plan_for_kv_cache,
)
from arch import ArchConfig, TrainConfig, param_count
from common.cli import int_in, render_table
from common.files import write_csv
from common.plots import new_figure, write_figure
from userdata import DataSpec
from workers.attention import MultiHeadAttention
from workers.experiments import harness
from workers.experiments.llama_compress import EVAL, FULL, SMOKE, Sizes, teacher
from workers.latent_students import latent_arch, latent_student
from workers.loss_rule import IGNORE, latent_sensitivity
from workers.measure import SAMPLE_BATCH, measure_model
from workers.model import Model
from workers.students import PairOrders, build_student, pair_orders
from workers.tasks import Batch, Task, make_data_task
from workers.trainer import Trainer, evaluate

NAME = "kv_compress"
FRACTIONS = (0.5, 0.25, 0.125)  # of the teacher's KV cache per token
METHODS = ("svd", "asvd", "palu", "mha2mla", "ours", "ours-latent")
LATENT_STEP = 8  # the candidate latent widths of ours-latent
GOAL_GAP = 0.05  # nats: "within this of its teacher" after fine-tuning


def layer_units(model: Model, fraction: float) -> int:
    """Each layer's share of a ``fraction`` of the teacher's KV cache, in cached units."""
    return max(1, round(fraction * model.arch.kv_width / model.arch.n_layers))


def fisher_information(model: Model, batch: Batch) -> list[float]:
    """Per layer, the Fisher information of its key and value rows on the sample (their
    summed squared gradients of the loss): what Palu allocates the latent widths by."""
    model.zero_grad()
    logits = model(batch.x)
    targets = batch.y.masked_fill(~batch.mask, IGNORE)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                                      ignore_index=IGNORE).backward()
    info = []
    for i in range(model.arch.n_layers):
        attn = mhsa(model, i)
        grad = attn.qkv.weight.grad
        assert grad is not None
        info.append(float(grad[attn.qk_width:].square().sum()))  # key and value rows
    model.zero_grad()
    return info


def full_rank(model: Model) -> int:
    """The widest latent any layer can use: the rank bound of its stacked key and value
    maps."""
    return min(model.arch.d_model,
               *(mhsa(model, i).k_width + mhsa(model, i).v_width
                 for i in range(model.arch.n_layers)))


def mhsa(model: Model, i: int) -> MultiHeadAttention:
    """The teacher's attention of layer ``i`` (every layer is mhsa)."""
    attn = model.block(i).attn
    assert isinstance(attn, MultiHeadAttention)
    return attn


def allocate(weights: list[float], total: int, cap: int) -> list[int]:
    """``total`` units split in proportion to ``weights`` by largest remainders, each layer in
    ``[1, cap]``; what a capped layer cannot take goes to the others."""
    widths = [1] * len(weights)
    while True:
        left = total - sum(widths)
        open_ = [i for i, w in enumerate(widths) if w < cap]
        if left <= 0 or not open_:
            return widths
        mass = sum(weights[i] for i in open_)
        share = {i: left * (weights[i] / mass if mass > 0 else 1 / len(open_)) for i in open_}
        add = {i: min(cap - widths[i], math.floor(share[i])) for i in open_}
        rest = left - sum(add.values())
        for i in sorted(open_, key=lambda i: share[i] - math.floor(share[i]), reverse=True):
            if rest > 0 and widths[i] + add[i] < cap:
                add[i], rest = add[i] + 1, rest - 1
        if not any(add.values()):
            return widths
        for i, extra in add.items():
            widths[i] += extra


def norm_orders(model: Model, x: torch.Tensor) -> dict[tuple[int, int, int], tuple[int, ...]]:
    """MHA2MLA's 2-norm ranking: each key/value head's RoPE pairs by the mean, over the
    sample and the query heads reading it, of ``|q_i| |k_i|`` (a pair's two dims together;
    RoPE turns a pair without changing its norm)."""
    inputs: dict[int, torch.Tensor] = {}
    hooks = [mhsa(model, i).register_forward_pre_hook(
        lambda _m, args, i=i: inputs.__setitem__(i, args[0])) for i in range(model.arch.n_layers)]
    with torch.no_grad():
        model(x)
        for hook in hooks:
            hook.remove()
        orders: dict[tuple[int, int, int], tuple[int, ...]] = {}
        for i in range(model.arch.n_layers):
            q, k, _ = mhsa(model, i).project(inputs[i])
            g = model.arch.layers[i].heads[0]
            half = g.qk_dim // 2
            qn = pair_norms(q, g.count, half)  # (count, half)
            kn = pair_norms(k, g.kv_heads, half)  # (kv, half)
            share = g.count // g.kv_heads
            for h in range(g.kv_heads):
                score = qn[h * share:(h + 1) * share].mean(0) * kn[h]
                orders[(i, 0, h)] = tuple(int(p) for p in score.argsort(descending=True))
    return orders


def pair_norms(rows: torch.Tensor, heads: int, half: int) -> torch.Tensor:
    """(B, T, heads * 2 half) -> (heads, half): each pair's mean norm over the sample."""
    r = rows.reshape(*rows.shape[:2], heads, 2, half)
    return r.square().sum(3).sqrt().mean((0, 1))


def latent_for(method: str, model: Model, fraction: float, orders: PairOrders,
               scales: dict[int, tuple[float, ...]], widths: dict[str, list[int]]) -> Model:
    """The latent student of ``method`` at ``fraction`` of the teacher's KV cache
    (``widths``: the per-layer latent widths of ``palu``)."""
    units, arch = layer_units(model, fraction), model.arch
    if method == "mha2mla":
        g = arch.layers[0].heads[0]
        rope = max(0, min(g.qk_dim // 4, (units // 2) // g.kv_heads) // 2 * 2)
        rest = [units - g.kv_heads * rope] * arch.n_layers  # the latent: what RoPE leaves
        return latent_student(model, latent_arch(arch, rest, rope), orders, scales)
    chosen = widths.get(method, [units] * arch.n_layers)
    return latent_student(model, latent_arch(arch, chosen, 0, rotate_latent=True), {},
                          None if method == "svd" else scales)


def latent_plan(model: Model, measured: CheckpointMeasurement, sample: Batch,
                scales: dict[int, tuple[float, ...]], args: argparse.Namespace
                ) -> CompressionPlan:
    """The latent plan of ``workers.profile --rule loss --latent`` (widths in steps of
    ``LATENT_STEP``), at no cut yet: ``ours_for`` chooses its widths under each budget."""
    targets = sample.y.masked_fill(~sample.mask, IGNORE)
    layers = latent_sensitivity(model, sample.x, targets, list(measured.layers), LATENT_STEP,
                                scales, args.quiet)
    return plan_compression(replace(measured, layers=tuple(layers)), 1.0, rule="loss")


def ours_for(model: Model, plan: CompressionPlan, fraction: float) -> Model | None:
    """The loss plan's student at ``fraction`` (compact, or latent for a latent plan; None
    below what it can reach)."""
    try:
        budget = plan_for_kv_cache(plan, fraction)
    except CompressionError:
        return None
    return build_student(model, budget.student, pair_orders(plan), plan.input_scales())


def finetune(student: Model, task: Task, sizes: Sizes, seed: int) -> float:
    """The validation loss of ``student`` after ``sizes.finetune`` steps on ``task``."""
    trainer = Trainer(student.arch, task, TrainConfig(
        steps=sizes.finetune, lr=3e-4, batch_size=sizes.batch, eval_every=sizes.finetune,
        device="cpu", seed=seed))
    trainer.model.load_state_dict(student.state_dict())
    trainer.run()
    return evaluate(trainer.model.eval(), task, EVAL, "cpu")[0]


def describe(arch: ArchConfig) -> str:
    """Per layer: ``c24+r8`` for a latent layer, ``k16/v8`` for a compact one."""
    out = []
    for layer in arch.layers:
        g = layer.heads[0]
        out.append(f"c{layer.latent_dim}" + (f"+r{layer.rope_dim}" if layer.rope_dim else "")
                   if layer.attention == "latent" else f"k{g.qk_dim}/v{g.v_dim}")
    return " ".join(out)


def teacher_rows(model: Model, task: Task, sizes: Sizes, seed: int, args: argparse.Namespace,
                 bar: Any, done: set[tuple[int, float, str]],
                 keep: Callable[[dict[str, Any]], None]) -> None:
    """Every method at every size on one teacher, but those ``done`` (seed, fraction,
    method), each row handed to ``keep`` as it is measured."""
    sample = task.batch("val", SAMPLE_BATCH, 32)  # not the evaluation batches
    measured = measure_model(model, sample.x, sizes.length, align=sizes.align, sample="corpus",
                             targets=sample.y.masked_fill(~sample.mask, IGNORE),
                             quiet=args.quiet)
    plan = plan_compression(measured, 1.0, rule="loss")
    scales, orders = plan.input_scales(), norm_orders(model, sample.x)
    plans = {"ours": plan, "ours-latent": latent_plan(model, measured, sample, scales, args)}
    fisher = fisher_information(model, sample)
    teacher_loss = evaluate(model, task, EVAL, "cpu")[0]
    for fraction in FRACTIONS:
        total = layer_units(model, fraction) * model.arch.n_layers
        widths = {"palu": allocate(fisher, total, full_rank(model))}
        for method in METHODS:
            if (seed, fraction, method) in done:
                continue
            student = (ours_for(model, plans[method], fraction) if method in plans else
                       latent_for(method, model, fraction, orders, scales, widths))
            row: dict[str, Any] = {"seed": seed, "fraction": fraction, "method": method,
                                   "teacher_loss": teacher_loss}
            if student is None:
                row |= {"layers": "below the floor", "kv_units": "", "params": "",
                        "reduced_loss": math.nan, "finetuned_loss": math.nan}
            else:
                row |= {"layers": describe(student.arch), "kv_units": student.arch.kv_width,
                        "params": param_count(student.arch).total,
                        "reduced_loss": evaluate(student, task, EVAL, "cpu")[0],
                        "finetuned_loss": finetune(student, task, sizes, seed)}
            keep(row)
            bar.update(1)
            bar.event(f"teacher {seed}, {fraction:.1%} of the KV cache, {method}: loss "
                      f"{row['reduced_loss']:.4f} after the cut, {row['finetuned_loss']:.4f} "
                      "fine-tuned")


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per size and method: the mean over teachers of each loss, its range, and the gap to the
    teachers' mean loss."""
    out = []
    for fraction in FRACTIONS:
        for method in METHODS:
            mine = [r for r in rows if r["fraction"] == fraction and r["method"] == method
                    and not math.isnan(r["reduced_loss"])]
            if not mine:
                out.append({"fraction": fraction, "method": method, "teachers": 0})
                continue
            entry: dict[str, Any] = {"fraction": fraction, "method": method,
                                     "teachers": len(mine)}
            for key in ("reduced_loss", "finetuned_loss"):
                values = [r[key] for r in mine]
                entry |= {key: statistics.fmean(values), f"{key}_low": min(values),
                          f"{key}_high": max(values)}
            entry["gap"] = entry["finetuned_loss"] - statistics.fmean(
                r["teacher_loss"] for r in mine)
            out.append(entry)
    return out


def verdicts(summary: list[dict[str, Any]]) -> list[str]:
    """One line per size: the best method after fine-tuning and right after the cut, and
    where ours stands."""
    lines = []
    for fraction in FRACTIONS:
        mine = [s for s in summary if s["fraction"] == fraction and s["teachers"]]
        if not mine:
            continue
        tuned = min(mine, key=lambda s: s["finetuned_loss"])
        cut = min(mine, key=lambda s: s["reduced_loss"])
        ours = next((s for s in mine if s["method"] == "ours"), None)
        where = ("ours is below its floor here" if ours is None else
                 f"ours {ours['finetuned_loss']:.4f} fine-tuned ({ours['gap']:+.4f} from the "
                 f"teachers), {ours['reduced_loss']:.4f} right after the cut")
        lines.append(f"{fraction:.1%} of the KV cache: best fine-tuned {tuned['method']} "
                     f"{tuned['finetuned_loss']:.4f}, best right after the cut {cut['method']} "
                     f"{cut['reduced_loss']:.4f}; {where}")
    return lines


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows an earlier run on this ``--out`` wrote (none without the file), typed."""
    if not path.exists():
        return []
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for r in rows:
        r |= {"seed": int(r["seed"]), "fraction": float(r["fraction"]),
              **{k: float(r[k]) for k in ("teacher_loss", "reduced_loss", "finetuned_loss")},
              **{k: int(r[k]) for k in ("kv_units", "params") if r[k]}}
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = SMOKE if args.smoke_test else FULL
    harness.prepare(args)
    corpus = harness.write_corpus(args.out / "corpus", sizes.megabytes)
    task = make_data_task(DataSpec(str(corpus)), length=sizes.length)
    path = args.out / "kv_compress.csv"
    rows = read_rows(path)
    done = {(r["seed"], r["fraction"], r["method"]) for r in rows}

    def keep(row: dict[str, Any]) -> None:  # every row on disk as soon as it is measured
        rows.append(row)
        write_csv(path, rows)

    todo = [(seed, fraction, method) for seed in args.seeds for fraction in FRACTIONS
            for method in METHODS if (seed, fraction, method) not in done]
    with harness.runs(args, NAME, len(todo), "students",
                      start=f"cut and fine-tune ({sizes.finetune} steps) every method at "
                            f"{', '.join(f'{f:.1%}' for f in FRACTIONS)} of the KV cache") as bar:
        for seed in sorted({seed for seed, _, _ in todo}):
            folder = args.out / f"teacher{seed}"
            folder.mkdir(parents=True, exist_ok=True)
            model = teacher(sizes, task, args.steps or sizes.steps, seed, folder, args)
            teacher_rows(model, task, sizes, seed, args, bar, done, keep)
    rows = [r for r in rows if r["seed"] in args.seeds]
    summary = summarise(rows)
    write_csv(args.out / "kv_compress_summary.csv", summary)
    plot(summary, statistics.fmean(r["teacher_loss"] for r in rows), args.out / "kv_compress.png")
    return {"rows": rows, "summary": summary, "verdicts": verdicts(summary),
            "teacher_losses": sorted({r["teacher_loss"] for r in rows}), "out": str(args.out)}


def plot(summary: list[dict[str, Any]], teacher_loss: float, path: Path) -> None:
    """Loss after the cut and after fine-tuning against the KV cache fraction, per method,
    with the teachers' range as error bars."""
    fig, axes = new_figure(2, (11, 4.2))
    for ax, key, title in ((axes[0], "reduced_loss", "right after the cut"),
                           (axes[1], "finetuned_loss", "after fine-tuning")):
        for k, method in enumerate(METHODS):
            mine = [s for s in summary if s["method"] == method and s["teachers"]]
            shift = 1 + 0.04 * (k - len(METHODS) / 2)  # methods side by side at each size
            err = [[s[key] - s[f"{key}_low"] for s in mine],
                   [s[f"{key}_high"] - s[key] for s in mine]]
            ax.errorbar([s["fraction"] * shift for s in mine], [s[key] for s in mine],
                        yerr=err, fmt="o-", color=f"C{k}", label=method, capsize=3)
        ax.axhline(teacher_loss, color="k", lw=0.8, ls=":", label="teachers (mean)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(FRACTIONS, [f"{f:.1%}" for f in FRACTIONS])
        ax.set_xlabel("KV cache per token (of the teacher's); bars: the teachers' range")
        ax.set_ylabel("validation loss (nats per byte)")
        ax.set_title(f"GQA Llama students: {title}")
        ax.legend(fontsize=8)
    write_figure(fig, path)


def render(result: dict[str, Any]) -> str:
    table = render_table(
        ["KV", "method", "teachers", "loss (cut)", "range", "loss (fine-tuned)", "range",
         "gap"],
        [[f"{s['fraction']:.1%}", s["method"], s["teachers"],
          *((f"{s['reduced_loss']:.4f}", f"{s['reduced_loss_low']:.4f}-"
             f"{s['reduced_loss_high']:.4f}", f"{s['finetuned_loss']:.4f}",
             f"{s['finetuned_loss_low']:.4f}-{s['finetuned_loss_high']:.4f}",
             f"{s['gap']:+.4f}") if s["teachers"] else ("below floor", "", "", "", ""))]
         for s in result["summary"]],
        right=[True, False, True, True, True, True, True, True])
    losses = ", ".join(f"{v:.4f}" for v in result["teacher_losses"])
    return "\n".join([f"teachers' validation loss: {losses}", table, *result["verdicts"],
                      f"wrote {result['out']}/kv_compress.csv, kv_compress_summary.csv, "
                      "kv_compress.png"])


def main(argv: list[str] | None = None) -> int:
    parser = harness.build_parser(NAME, __doc__)
    parser.add_argument("--steps", type=int_in(1), help="teacher training steps (default: 1500;"
                                                        " 30 with --smoke-test)")
    parser.add_argument("--seeds", type=int_in(0), nargs="+", default=[0, 1],
                        help="one teacher per seed, each from its own initialisation")
    return harness.main(parser, argv, run, render)


if __name__ == "__main__":
    sys.exit(main())
