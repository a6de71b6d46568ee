"""python -m experiments.saturation [--smoke-test] [--out results/saturation] [--steps 1500]

Softmax saturation (Yu et al., 2025, §6.2; docs/theory.md §4) on a model trained here: a
byte-level LM (the ``lm`` task, through ``workers.train``) is the teacher.
1. ``||J||_2`` of the attention softmax vs sequence length N: for the last query of
   sequences of length N (it attends to all N keys), ``J = diag(s) - s s^T``; averaged over
   sequences, for layer 0 head 0 (the paper's choice) and over all heads of layer 0, next to the
   bound ``2 e^{2R}/N`` (R = the largest |logit| seen). Theorem 5.1: it falls like 1/N.
2. Student heads: the last layer's head 0 is replaced by a query-key map of rank r, initialised by
   truncated SVD of the teacher's ``W_Q^T W_K`` (scaled as in the forward pass) and trained to
   fit the teacher's causal attention weights (MSE), for two sequence lengths. Error vs r.
Writes ``jacobian.csv``, ``students.csv`` and ``saturation.png``.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from alloc import PlanSettings, jacobian_bound
from arch import ArchConfig, HeadGroup, LayerSpec, TrainConfig
from common.cli import int_in, render_table
from common.files import write_csv
from common.plots import new_figure, write_figure
from experiments import harness
from userdata import DataSpec
from userdata.corpora import write_code
from workers.compression import record_attention
from workers.models import Model, MultiHeadAttention, build_model, future_mask
from workers.tasks import LMTask, Task, make_data_task, make_task
from workers.training import Trainer

NAME = "saturation"
FLOOR = 1e-16  # full-rank students are exact up to rounding: plot them at this floor


@dataclass(frozen=True)
class Sizes:
    d_model: int
    heads: int
    layers: int
    length: int  # the teacher's training (and longest) sequence length
    steps: int  # teacher training steps
    lengths: tuple[int, ...]  # N of the Jacobian measurement
    student_lengths: tuple[int, ...]
    ranks: tuple[int, ...]
    student_steps: int
    sequences: int  # per length


SMOKE = Sizes(32, 2, 2, 32, 30, (4, 8, 16, 32), (8, 32), (1, 2, 4, 8, 16), 40, 10)
FULL = Sizes(128, 4, 3, 256, 1500, (8, 16, 32, 64, 128, 256), (32, 256), (1, 2, 4, 8, 16, 32),
             300, 10)


def teacher(sizes: Sizes, seed: int, steps: int, checkpoint: Path, task: Task | None = None,
            args: argparse.Namespace | None = None) -> tuple[Model, Task, float]:
    """Train an LM teacher with the product's trainer (or continue / reuse its checkpoint) on
    ``task`` (default: the built-in ``lm`` task); returns it with its validation loss."""
    d, h = sizes.d_model, sizes.heads
    layer = LayerSpec("mhsa", (HeadGroup(h, d // h),), mlp_ratio=4.0)
    arch = ArchConfig(d_model=d, layers=(layer,) * sizes.layers, vocab_size=256,
                      max_seq_len=sizes.length, positional="learned")
    task = task or make_task("lm", "paper", seed=seed, length=sizes.length)
    trainer = Trainer(arch, task, TrainConfig(steps=steps, batch_size=16, lr=3e-3,
                                              eval_every=max(1, steps // 5), seed=seed,
                                              device="cpu"), checkpoint=checkpoint)
    trainer.resume()
    result = trainer.run() if args is None else harness.train(trainer, "teacher", args)
    return trainer.model, task, float(result.val_loss or math.nan)


def windows(task: Task, length: int, count: int, seed: int) -> Tensor:
    """``count`` validation byte windows of ``length`` (count, length), from the built-in
    ``lm`` task's text or a text corpus task's validation split."""
    data = (task.text("val") if isinstance(task, LMTask)
            else torch.from_numpy(np.asarray(task.data.val, dtype=np.int64)))  # type: ignore[attr-defined]
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, len(data) - length, (count, 1), generator=g)
    return data[start + torch.arange(length)]


def layer_logits(model: Model, x: Tensor) -> list[Tensor]:
    """Attention logits of every layer for ids ``x``: (B, H, T, T), causal entries -inf (one
    head group per layer, as in this experiment's teachers)."""
    return [group for (group,) in record_attention(model, x, reduce=lambda z: z).groups]


def jacobian_norm(z: Tensor) -> Tensor:
    """Spectral norm of ``diag(s) - s s^T`` for each row of logits z (..., N) (PSD: top
    eigenvalue)."""
    s = torch.softmax(z.double(), dim=-1)
    j = torch.diag_embed(s) - s[..., :, None] * s[..., None, :]
    return torch.linalg.eigvalsh(j)[..., -1]


def jacobian_rows(model: Model, task: Task, lengths: list[int], count: int, seed: int
                  ) -> list[dict[str, Any]]:
    """Per N: ||J|| of the trained model's layers, and of layer 0 of the same architecture at
    initialisation (small logits: the theorem's premise) for reference."""
    torch.manual_seed(seed)
    init = build_model(model.arch)
    rows = []
    for n in lengths:
        x = windows(task, n, count, seed)
        logits = [z[:, :, -1, :] for z in layer_logits(model, x)]
        norms = [jacobian_norm(z) for z in logits]  # per layer (B, H)
        r = logits[0].abs().max().item()
        row = {"seq_len": n, "head0": norms[0][:, 0].mean().item(),
               "all_heads": norms[0].mean().item(), "logit_bound_R": r,
               "bound": jacobian_bound(n, r)}
        for i in range(1, len(norms)):  # later layers, mean over heads
            row[f"layer{i}"] = norms[i].mean().item()
            row[f"layer{i}_R"] = logits[i].abs().max().item()
        at_init = layer_logits(init, x)[0][:, :, -1, :]
        row["init_layer0"] = jacobian_norm(at_init).mean().item()
        rows.append(row)
    return rows


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log y vs log x."""
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


# --- student heads ---------------------------------------------------------------------------


@torch.no_grad()
def head_inputs(model: Model, x: Tensor, layer: int) -> Tensor:
    """The normed hidden states entering ``layer``'s attention, (B, T, d)."""
    captured: list[Tensor] = []
    hook = model.block(layer).attn_norm.register_forward_hook(
        lambda _m, _i, out: captured.append(out))
    model.eval()(x)
    hook.remove()
    return captured[0]


def teacher_map(model: Model, layer: int, head: int) -> Tensor:
    """``M = W_Q^T W_K / sqrt(d_qk)`` of one head (d, d): its logits are ``X M X^T``."""
    attn = model.block(layer).attn
    assert isinstance(attn, MultiHeadAttention) and len(attn.groups) == 1
    count, qk, _, _ = attn.groups[0]
    w_q, w_k, _ = attn.qkv.weight.detach().split([count * qk, count * qk, attn.width], dim=0)
    rows = slice(head * qk, (head + 1) * qk)
    return w_q[rows].T @ w_k[rows] / math.sqrt(qk)


def causal_attention(x: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """softmax((x a)(x b)^T) with the causal mask; x (B, T, d), a, b (d, r) -> (B, T, T)."""
    z = (x @ a) @ (x @ b).transpose(-1, -2)
    t = z.shape[-1]
    return torch.softmax(z.masked_fill(future_mask(t), float("-inf")), dim=-1)


def fit_student(m: Tensor, train_x: Tensor, test_x: Tensor, rank: int, steps: int
                ) -> tuple[float, float, float]:
    """(MSE after SVD init, MSE after training, mean squared teacher weight) of a
    rank-``rank`` student on test inputs."""
    u, s, vh = torch.linalg.svd(m)
    root = s[:rank].sqrt()
    a = (u[:, :rank] * root).clone().requires_grad_(True)
    b = (vh[:rank].T * root).clone().requires_grad_(True)
    full = torch.eye(m.shape[0])
    target_train = causal_attention(train_x, m, full)
    target_test = causal_attention(test_x, m, full)

    def error(x: Tensor, target: Tensor) -> Tensor:
        return ((causal_attention(x, a, b) - target) ** 2).mean()  # masked entries are 0 - 0

    with torch.no_grad():
        initial = error(test_x, target_test).item()
    optimizer = torch.optim.Adam([a, b], lr=1e-3)
    best = (math.inf, a.detach().clone(), b.detach().clone())
    for _ in range(steps + 1):  # keep the parameters of the best training loss seen
        optimizer.zero_grad()
        loss = error(train_x, target_train)
        if loss.item() < best[0]:
            best = (loss.item(), a.detach().clone(), b.detach().clone())
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        a.copy_(best[1])
        b.copy_(best[2])
        return initial, error(test_x, target_test).item(), (target_test ** 2).mean().item()


def student_rows(model: Model, task: Task, sizes: Sizes, seed: int) -> list[dict[str, Any]]:
    layer = len(model.blocks) - 1
    m = teacher_map(model, layer, 0)
    rows = []
    for n in sizes.student_lengths:
        train_x = head_inputs(model, windows(task, n, sizes.sequences, seed + 1), layer)
        test_x = head_inputs(model, windows(task, n, sizes.sequences, seed + 2), layer)
        for r in sizes.ranks:
            initial, trained, energy = fit_student(m, train_x, test_x, r, sizes.student_steps)
            rows.append({"seq_len": n, "rank": r, "svd_init_mse": initial, "trained_mse": trained,
                         "relative_mse": trained / energy})
    return rows


def plot(jac: list[dict[str, Any]], students: list[dict[str, Any]],
         summary: list[dict[str, Any]], path: Path) -> None:
    fig, axes = new_figure(3, (16.5, 4.2))
    n = [r["seq_len"] for r in jac]
    axes[0].plot(n, [r["head0"] for r in jac], "o-", label="layer 0, head 0")
    axes[0].plot(n, [r["all_heads"] for r in jac], "s-", label="layer 0, mean over heads")
    for key in norm_columns(jac)[2:-1]:
        axes[0].plot(n, [r[key] for r in jac], "^-",
                     label=f"layer {key.removeprefix('layer')}, mean over heads")
    axes[0].plot(n, [r["init_layer0"] for r in jac], "d:", color="grey",
                 label="layer 0 at initialisation (small logits)")
    ref = jac[0]["init_layer0"] * n[0]
    axes[0].plot(n, [ref / x for x in n], "k--", label="1/N reference")
    axes[0].set_xscale("log", base=2)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("sequence length N (keys seen by the query)")
    axes[0].set_ylabel("||J||_2 of the softmax (mean over sequences)")
    axes[0].set_title("softmax Jacobian of the last query vs N (byte LM)")
    for n_len in sorted({r["seq_len"] for r in students}):
        mine = [r for r in students if r["seq_len"] == n_len]
        axes[1].plot([r["rank"] for r in mine], [max(r["trained_mse"], FLOOR) for r in mine],
                     "o-", label=f"trained student, N = {n_len}")
        axes[1].plot([r["rank"] for r in mine], [max(r["svd_init_mse"], FLOOR) for r in mine],
                     "x:", label=f"SVD init only, N = {n_len}")
    axes[1].set_xscale("log", base=2)
    axes[1].set_yscale("log")
    axes[1].set_xlabel("student query-key rank r")
    axes[1].set_ylabel(f"MSE on attention weights (held-out; floor {FLOOR:g})")
    axes[1].set_title("reduced-qk student of the last layer's head 0")
    for k, name in enumerate(dict.fromkeys(r["teacher"] for r in summary)):
        mine = [r for r in summary if r["teacher"] == name]
        x = np.array([r["layer"] for r in mine]) + (k - 0.5) * 0.35
        axes[2].bar(x, [r["slope"] for r in mine], width=0.35, label=f"{name} LM: slope")
        for r, xi in zip(mine, x):
            axes[2].annotate(f"H {r['entropy']:.2f}\nR {r['logit_bound_R']:.0f}",
                             (xi, r["slope"]), fontsize=6, ha="center", va="top")
    axes[2].axhline(-1, color="k", ls="--", label="-1: saturation (bounded logits)")
    axes[2].set_xlabel("layer")
    axes[2].set_ylabel("log-log slope of ||J|| vs N (last query)")
    axes[2].set_xticks(sorted({r["layer"] for r in summary}))
    axes[2].set_title("does each trained layer saturate?\n(H: last query's entropy / ln N, and R, "
                      "at the longest N)", fontsize=10)
    for ax in axes:
        ax.legend(fontsize=8)
    write_figure(fig, path)


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = SMOKE if args.smoke_test else FULL
    harness.prepare(args)
    steps = args.steps or sizes.steps
    with harness.runs(args, NAME, 5, "stages", start="two teachers, the Jacobian norms, "
                      "the low-rank students and the per-layer logits") as bar:
        model, task, val_loss = teacher(sizes, args.seed, steps, args.out / "teacher.pt",
                                        args=args)
        bar.update(1)
        bar.event(f"the documentation teacher: val loss {val_loss:.4f}")
        jac = jacobian_rows(model, task, list(sizes.lengths), sizes.sequences, args.seed)
        bar.update(1)
        bar.event(f"Jacobian norms at {len(sizes.lengths)} lengths")
        students = student_rows(model, task, sizes, args.seed)
        bar.update(1)
        bar.event(f"{len(students)} low-rank students fitted")
        # The same measurement per layer on a second teacher, trained on real code (the
        # stdlib's sources, a --data corpus) instead of documentation prose.
        corpus = write_code(args.out / "corpus", 0.2 if args.smoke_test else 8.0)
        code_task = make_data_task(DataSpec(str(corpus)), length=sizes.length, seed=args.seed)
        code, _, code_loss = teacher(sizes, args.seed, steps, args.out / "teacher_code.pt",
                                     code_task, args)
        bar.update(1)
        bar.event(f"the code teacher: val loss {code_loss:.4f}")
        layers = (layer_rows("docs", model, task, list(sizes.lengths), sizes.sequences,
                             args.seed)
                  + layer_rows("code", code, code_task, list(sizes.lengths), sizes.sequences,
                               args.seed))
        bar.update(1)
        bar.event("per-layer logits of both teachers")
    summary = saturation_summary(layers)
    write_csv(args.out / "jacobian.csv", jac)
    write_csv(args.out / "students.csv", students)
    write_csv(args.out / "layers.csv", layers)
    plot(jac, students, summary, args.out / "saturation.png")
    n = [r["seq_len"] for r in jac]
    slopes = {key: slope(n, [r[key] for r in jac]) for key in norm_columns(jac)}
    return {"teacher": {**asdict(sizes), "steps": steps, "val_loss": val_loss,
                        "code_val_loss": code_loss},
            "jacobian": jac, "slopes": slopes, "students": students, "layers": summary,
            "logit_bounds": {name: [r["logit_bound_R"] for r in summary
                                    if r["teacher"] == name
                                    and r["layer"] >= PlanSettings.extract_layers]
                             for name in ("docs", "code")},
            "out": str(args.out)}


def layer_rows(name: str, model: Model, task: Task, lengths: list[int], count: int,
               seed: int) -> list[dict[str, Any]]:
    """Per layer and N: mean over heads of ||J|| and of the attention entropy over ln N for
    the last query (which sees all N keys), and the largest |logit| R of the layer."""
    rows = []
    for n in lengths:
        for i, z in enumerate(layer_logits(model, windows(task, n, count, seed))):
            last = z[:, :, -1, :]  # (B, H, N)
            p = torch.softmax(last.double(), dim=-1)
            entropy = -(p * torch.log(p.clamp_min(1e-300))).sum(-1) / math.log(n)
            rows.append({"teacher": name, "layer": i, "seq_len": n,
                         "jacobian": jacobian_norm(last).mean().item(),
                         "entropy": entropy.mean().item(),
                         "logit_bound_R": z.masked_fill(~torch.isfinite(z), 0).abs().max()
                         .item()})
    return rows


def saturation_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per teacher and layer: the log-log slope of ||J|| vs N (-1: saturates like the theorem
    says; ~0: does not), the entropy over ln N and R at the longest N."""
    out = []
    for name in dict.fromkeys(r["teacher"] for r in rows):
        for layer in sorted({r["layer"] for r in rows if r["teacher"] == name}):
            mine = sorted((r for r in rows if (r["teacher"], r["layer"]) == (name, layer)),
                          key=lambda r: r["seq_len"])
            value = slope([r["seq_len"] for r in mine], [r["jacobian"] for r in mine])
            out.append({"teacher": name, "layer": layer, "slope": value,
                        "entropy": mine[-1]["entropy"], "logit_bound_R": mine[-1]["logit_bound_R"],
                        "saturates": value <= -0.5})
    return out


def norm_columns(jac: list[dict[str, Any]]) -> list[str]:
    """The ||J|| columns: layer 0 head 0, layer 0 mean over heads, later layers' means."""
    return ["head0", "all_heads"] + [k for k in jac[0] if k.startswith("layer")
                                     and not k.endswith("_R")] + ["init_layer0"]


def render(result: dict[str, Any]) -> str:
    t = result["teacher"]
    rows = result["jacobian"]
    cols = norm_columns(rows)
    names = {"head0": "L0 head 0", "all_heads": "L0 mean", "init_layer0": "L0 mean at init"}
    jac = render_table(["N"] + [f"||J|| {names.get(c, c.replace('layer', 'L') + ' mean')}"
                                for c in cols] + ["R (L0)", "2e^2R/N"],
                       [[r["seq_len"]] + [f"{r[c]:.4g}" for c in cols]
                        + [f"{r['logit_bound_R']:.3g}", f"{r['bound']:.3g}"] for r in rows],
                       right=[True] * (len(cols) + 3))
    slopes = ", ".join(f"{names.get(c, c.replace('layer', 'L') + ' mean')} {v:.2f}"
                       for c, v in result["slopes"].items())
    st = render_table(["N", "rank r", "MSE (SVD init)", "MSE (trained)", "MSE / mean A^2"],
                      [[r["seq_len"], r["rank"], f"{r['svd_init_mse']:.3g}",
                        f"{r['trained_mse']:.3g}", f"{r['relative_mse']:.3g}"]
                       for r in result["students"]], right=[True] * 5)
    layers = render_table(["teacher", "layer", "slope of ||J||", "last query's entropy / ln N", "R",
                           "saturates"],
                          [[r["teacher"], r["layer"], f"{r['slope']:.2f}", f"{r['entropy']:.3f}",
                            f"{r['logit_bound_R']:.3g}", "yes" if r["saturates"] else "no"]
                           for r in result["layers"]],
                          right=[False, True, True, True, True, False])
    bounds = "; ".join(f"{name}: --logit-bounds " + ",".join(f"{v:.3g}" for v in values)
                       for name, values in result["logit_bounds"].items())
    return "\n".join([
        f"saturation: teacher byte LM D={t['d_model']} x{t['layers']} layers, {t['heads']} "
        f"heads, {t['steps']} steps, val loss {t['val_loss']:.3f} nats/byte (docs), "
        f"{t['code_val_loss']:.3f} (code)", jac,
        f"log-log slope of ||J|| vs N: {slopes} (theory: -1 for bounded logits)", "", st, "",
        layers, f"measured logit bounds of the later layers for alloc.solve: {bounds}",
        f"wrote {result['out']}/jacobian.csv, students.csv, layers.csv, saturation.png"])


def main(argv: list[str] | None = None) -> int:
    parser = harness.build_parser(NAME, __doc__)
    parser.add_argument("--steps", type=int_in(1), help="teacher training steps (default: 1500;"
                                                        " 30 with --smoke-test)")
    parser.add_argument("--seed", type=int_in(0), default=0, help="training and data seed")
    return harness.main(parser, argv, run, render)


if __name__ == "__main__":
    sys.exit(main())
