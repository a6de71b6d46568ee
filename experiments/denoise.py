"""python -m experiments.denoise [--smoke-test] [--out results/denoise] [--layers 10]

Attention-only denoising (Wang et al., 2025, Fig. 4; docs/theory.md §7): tokens from a mixture of
noisy low-rank Gaussians (the ``denoise`` task: K orthogonal subspaces of rank p, each token a
signal in its own subspace plus noise of level delta in the others) pass through an attention-only
stack of MSSA layers whose bases are the subspaces (the paper's construction), updated by the
theorem's step ``Z <- Z + eta * MSSA(Z)`` (eq. 4) and by the product's pre-norm AoT block ``Z <- Z +
eta * MSSA(LayerNorm(Z))`` (the LayerNorm the paper adds in practice); no MLP. Per layer it measures
each cluster's SNR ``||U_k U_k^T Z_k|| / ||(I - U_k U_k^T) Z_k||``, the rate ``SNR_{l+1} / SNR_l``
and Thm 3.1's rate ``1 + eta * tau``, with tau read off the layer as the mean attention weight a
token keeps on itself in its own subspace's head (what the theorem's thresholded softmax keeps), and
``tau_noise``, the same weight in the other subspaces' heads (what the threshold zeroes). No
training: the layers are the theorem's. Writes ``denoise.csv`` and ``denoise.png``.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from arch import ArchConfig, HeadGroup, LayerSpec
from common.cli import int_in, number, render_table
from common.files import write_csv
from common.plots import new_figure, write_figure
from experiments import harness
from workers.models import LogitRecorder, Model, SubspaceAttention, build_model
from workers.tasks import DenoiseTask, cluster_snr, make_task

NAME = "denoise"
NOISES = (0.2, 0.5)
UPDATES = ("eq4", "prenorm")  # Z + eta MSSA(Z) | Z + eta MSSA(LayerNorm(Z)), the product's block


@dataclass(frozen=True)
class Sizes:
    clusters: int
    rank: int
    length: int
    layers: int
    batch: int


SMOKE = Sizes(clusters=3, rank=16, length=48, layers=4, batch=8)
FULL = Sizes(clusters=4, rank=32, length=128, layers=10, batch=32)


def stack(task: DenoiseTask, layers: int, eta: float, recorder: LogitRecorder) -> Model:
    """The product's AoT-MSSA model (tied output, no MLP) with every basis set to the task's."""
    k, p = task.clusters, task.rank
    layer = LayerSpec("mssa", (HeadGroup(k, p),), mlp_ratio=0.0, eta=eta, tied_output=True)
    arch = ArchConfig(d_model=k * p, layers=(layer,) * layers, max_seq_len=task.seq_len,
                      input_dim=task.input_dim, output_dim=task.input_dim, causal=False)
    model = build_model(arch, attention_fn=recorder).double()
    basis = torch.cat(list(task.bases().double()), dim=1).T  # (K*p, d) = [U_1 .. U_K]^T
    with torch.no_grad():
        for i in range(layers):
            attn = model.block(i).attn
            assert isinstance(attn, SubspaceAttention)
            attn.basis.weight.copy_(basis)
    return model


@torch.no_grad()
def trajectory(task: DenoiseTask, layers: int, eta: float, batch: int, update: str
               ) -> list[dict[str, Any]]:
    """Per layer: SNR, measured rate and ``1 + eta * tau`` of the layer that produced it."""
    recorder = LogitRecorder()
    model = stack(task, layers, eta, recorder)
    b = task.batch("val", 0, batch)
    z, bases, labels = b.x.double(), task.bases().double(), b.aux
    assert labels is not None
    rows: list[dict[str, Any]] = [{
        "update": update, "noise": task.delta, "layer": 0,
        "snr": cluster_snr(z, bases, labels).mean().item(), "rate": math.nan, "tau": math.nan,
        "predicted_rate": math.nan, "tau_noise": math.nan}]
    heads = torch.arange(task.clusters)[None, :, None]
    own = labels[:, None, :] == heads  # (B, K, T): head k is token t's own subspace
    for i in range(layers):
        block = model.block(i)
        z = block(z) if update == "prenorm" else z + eta * block.attn(z)
        # Self-attention weight A_ii of every head, (B, K, T), from this layer's logits.
        diagonal = torch.softmax(recorder.logits.pop(), dim=-1).diagonal(dim1=-2, dim2=-1)
        tau = diagonal[own].mean().item()
        # What the theorem's threshold zeroes: a token keeping itself in the heads of the
        # subspaces it is only noise in.
        tau_noise = diagonal[~own].mean().item()
        snr = cluster_snr(z, bases, labels).mean().item()
        rows.append({"update": update, "noise": task.delta, "layer": i + 1, "snr": snr,
                     "rate": snr / rows[-1]["snr"], "tau": tau, "predicted_rate": 1 + eta * tau,
                     "tau_noise": tau_noise})
    return rows


def plot(rows: list[dict[str, Any]], eta: float, path: Path) -> None:
    fig, axes = new_figure(2, (11, 4.2))
    curves = [(u, n) for u in UPDATES for n in NOISES]
    for color, (update, noise) in zip(("C0", "C3", "C2", "C1"), curves):
        mine = [r for r in rows if r["noise"] == noise and r["update"] == update]
        layers = [r["layer"] for r in mine]
        axes[0].plot(layers, [r["snr"] for r in mine], "o-", color=color,
                     label=f"{update}, delta = {noise:g}")
        predicted = [mine[0]["snr"]]
        for r in mine[1:]:
            predicted.append(predicted[-1] * r["predicted_rate"])
        axes[0].plot(layers, predicted, "--", color=color, lw=1)
        axes[1].plot(layers[1:], [r["rate"] for r in mine[1:]], "o-", color=color,
                     label=f"{update}, delta = {noise:g}")
        axes[1].plot(layers[1:], [r["predicted_rate"] for r in mine[1:]], "--", color=color,
                     lw=1)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("layer l")
    axes[0].set_ylabel("SNR (mean over clusters, log scale)")
    axes[0].set_title(f"AoT-MSSA denoising (eta = {eta:g}); dashed: SNR_0 prod(1 + eta tau_l)")
    axes[1].set_xlabel("layer l")
    axes[1].set_ylabel("per-layer rate SNR_l / SNR_(l-1)")
    axes[1].set_title("measured rate; dashed: Thm 3.1's 1 + eta tau_l")
    for ax in axes:
        ax.legend(fontsize=8)
    write_figure(fig, path)


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = SMOKE if args.smoke_test else FULL
    harness.prepare(args)
    layers = args.layers or sizes.layers
    rows = []
    with harness.runs(args, NAME, len(UPDATES) * len(NOISES), "trajectories") as bar:
        for update in UPDATES:
            for noise in NOISES:
                task = make_task("denoise", "paper", seed=args.seed, clusters=sizes.clusters,
                                 rank=sizes.rank, length=sizes.length, delta=noise)
                assert isinstance(task, DenoiseTask)
                rows += trajectory(task, layers, args.eta, sizes.batch, update)
                bar.update(1)
                bar.event(f"{update} update, noise {noise:g}")
    write_csv(args.out / "denoise.csv", rows)
    plot(rows, args.eta, args.out / "denoise.png")
    return {"eta": args.eta, "sizes": {**asdict(sizes), "layers": layers}, "rows": rows,
            "out": str(args.out)}


def render(result: dict[str, Any]) -> str:
    s = result["sizes"]
    rows = [[r["update"], f"{r['noise']:g}", r["layer"], f"{r['snr']:.4g}"]
            + ["-" if math.isnan(r[k]) else f"{r[k]:.3f}"
               for k in ("rate", "tau", "predicted_rate", "tau_noise")]
            for r in result["rows"]]
    return "\n".join([
        f"denoise: K={s['clusters']} subspaces of rank {s['rank']}, {s['length']} tokens, "
        f"{s['layers']} MSSA layers, eta={result['eta']:g}",
        render_table(["update", "noise", "layer", "SNR", "rate", "tau", "1 + eta tau",
                      "tau noise"], rows, right=[False] + [True] * 7),
        f"wrote {result['out']}/denoise.csv, denoise.png"])


def main(argv: list[str] | None = None) -> int:
    parser = harness.build_parser(NAME, __doc__)
    parser.add_argument("--layers", type=int_in(1, 64), help="MSSA layers (default: 10; 4 "
                                                            "with --smoke-test)")
    parser.add_argument("--eta", type=number(0, strict=True), default=0.1, help="step size")
    parser.add_argument("--seed", type=int_in(0), default=0, help="data seed")
    return harness.main(parser, argv, run, render)


if __name__ == "__main__":
    sys.exit(main())
