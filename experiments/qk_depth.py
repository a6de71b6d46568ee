"""python -m experiments.qk_depth --teacher PATH --data TOKENS --eval DIR [DIR ...]

Do later layers tolerate smaller query-key dimensions? Yu et al. (2025, §6.2) cut the later
layers' query-key dimension of a trained LLaMA; here the same question on any Llama-family
teacher (docs/theory.md §4): every layer's RoPE heads are cut alone to ``--dim`` query-key dims
(each key/value head keeps its ``--dim / 2`` frequency pairs of largest query and key norm on a
calibration sample of ``--data``, the others dropped for all of its query heads), and the
held-out perplexity increase of each cut is measured on every ``--eval`` source; then the
first, middle and last third of the layers are cut together. The verdict: the rank correlation
of depth with the loss increase (Spearman, with its p-value), and the last third's increase
against the first third's with a 95% interval paired by window. Writes ``qk_depth.csv`` (per
layer), ``qk_depth_thirds.csv`` and ``qk_depth.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np

from arch import ArchConfig
from common.cli import int_in, render_table
from common.errors import UsageError
from common.files import write_csv
from common.plots import new_figure, write_figure
from common.stats import paired_bootstrap
from experiments import harness
from experiments.kv_compress import window_losses, windows
from experiments.kv_methods import norm_orders
from userdata import DataSpec, open_tokens
from workers.compression import build_student

NAME = "qk_depth"


def cut(arch: ArchConfig, layers: list[int], dim: int) -> ArchConfig:
    """``arch`` with every head group of ``layers`` at ``dim`` query-key dims."""
    specs = list(arch.layers)
    for i in layers:
        specs[i] = dataclasses.replace(specs[i], heads=tuple(
            dataclasses.replace(g, qk_dim=min(dim, g.qk_dim)) for g in specs[i].heads))
    return dataclasses.replace(arch, layers=tuple(specs))


def thirds(n: int) -> dict[str, list[int]]:
    """The first, middle and last third of ``n`` layers."""
    edges = [round(n * k / 3) for k in range(4)]
    return {name: list(range(edges[k], edges[k + 1]))
            for k, name in enumerate(("first", "middle", "last"))}


def spearman(x: list[float], y: list[float]) -> tuple[float, float]:
    """Spearman's rank correlation of ``x`` and ``y`` and its two-sided p-value."""
    from scipy.stats import spearmanr

    result = spearmanr(x, y)
    return float(result.statistic), float(result.pvalue)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from workers.checkpoints import load

    harness.prepare(args)
    teacher = load(args.teacher).model.eval()
    arch = teacher.arch
    if arch.positional != "rope" or any(x.attention != "mhsa" for x in arch.layers):
        raise UsageError(f"--teacher {args.teacher}: needs RoPE mhsa layers (a Llama-family "
                         "model)")
    widest = min(g.qk_dim for x in arch.layers for g in x.heads)
    if args.dim % 2 or not 2 <= args.dim < widest:
        raise UsageError(f"--dim {args.dim}: must be even and below the heads' {widest}")
    vocab = arch.vocab_size
    calibration = open_tokens(DataSpec(str(args.data), vocab_size=vocab), args.seq_len + 1)
    sample = windows(calibration.train, args.seq_len, args.sample_tokens)[:, :-1]
    orders = norm_orders(teacher, sample)
    evals = {Path(p).name: windows(_stream(p, vocab, args.seq_len), args.seq_len,
                                   args.eval_tokens) for p in args.eval}
    base = {s: window_losses(teacher, w) for s, w in evals.items()}
    rows, losses = [], {}
    groups = {f"layer {i}": [i] for i in range(arch.n_layers)} | {
        f"{name} third": layers for name, layers in thirds(arch.n_layers).items()}
    with harness.runs(args, NAME, len(groups), "students",
                      start=f"each layer, then each third, cut to qk_dim {args.dim}") as bar:
        for name, layers in groups.items():
            student = build_student(teacher, cut(arch, layers, args.dim), orders)
            for source, w in evals.items():
                losses[(name, source)] = window_losses(student, w)
                increase = float((losses[(name, source)] - base[source]).mean())
                rows.append({"cut": name, "layers": " ".join(map(str, layers)),
                             "source": source, "dim": args.dim, "increase": increase,
                             "teacher_loss": float(base[source].mean())})
            bar.update(1)
            bar.event(f"{name}: +{rows[-1]['increase']:.4f} nats on {source}")
    write_csv(args.out / f"{NAME}.csv", rows)
    return {"rows": rows, "verdicts": verdicts(rows, losses, list(evals), arch.n_layers),
            "out": str(args.out), "dim": args.dim, "teacher": str(args.teacher)}


def _stream(path: Path, vocab: int | None, seq_len: int) -> np.ndarray:
    tokens = open_tokens(DataSpec(str(path), vocab_size=vocab), seq_len + 1)
    return np.concatenate([tokens.train, tokens.val])


def verdicts(rows: list[dict[str, Any]], losses: dict[tuple[str, str], np.ndarray],
             sources: list[str], n: int) -> list[str]:
    """Per source: depth against each layer's increase (Spearman), and the last third's
    increase against the first third's (paired by window)."""
    lines = []
    for source in sources:
        per_layer = [r["increase"] for r in rows
                     if r["source"] == source and r["cut"].startswith("layer ")]
        rho, p = spearman(list(range(n)), per_layer)
        diff, low, high = paired_bootstrap(losses[("last third", source)],
                                           losses[("first third", source)])
        holds = high < 0 and rho < 0 and p < 0.05
        against = low > 0 and rho > 0 and p < 0.05
        word = "holds" if holds else "does not hold (the opposite)" if against else \
            "inconclusive"
        lines.append(f"{source}: Spearman rho(depth, increase) = {rho:+.2f} (p {p:.3g}); last "
                     f"third - first third = {diff:+.4f} nats [{low:+.4f}, {high:+.4f}]: "
                     f"'later layers tolerate smaller query-key dimensions' {word}")
    return lines


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    fig, axes = new_figure(1, (7, 4))
    ax = axes[0] if isinstance(axes, (list, np.ndarray)) else axes
    for k, source in enumerate(sorted({r["source"] for r in rows})):
        mine = [r for r in rows if r["source"] == source and r["cut"].startswith("layer ")]
        ax.plot([int(r["layers"]) for r in mine], [r["increase"] for r in mine], "o-",
                color=f"C{k}", label=source)
    ax.set_xlabel("layer cut alone")
    ax.set_ylabel("held-out loss increase (nats per token)")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.legend()
    write_figure(fig, path)


def render(result: dict[str, Any]) -> str:
    table = render_table(["cut", "source", "increase"],
                         [[r["cut"], r["source"], f"{r['increase']:+.4f}"]
                          for r in result["rows"]], right=[False, False, True])
    return "\n".join([f"teacher {result['teacher']}, query-key dims cut to {result['dim']}",
                      table, *result["verdicts"], f"wrote {result['out']}/{NAME}.csv"])


def main(argv: list[str] | None = None) -> int:
    parser = harness.build_parser(NAME, __doc__)
    parser.add_argument("--teacher", type=Path, required=True,
                        help="a Llama-family teacher: a transformers folder or a GGUF file")
    parser.add_argument("--data", type=Path, required=True,
                        help="calibration tokens (ranks each key/value head's pairs)")
    parser.add_argument("--eval", type=Path, nargs="+", required=True,
                        help="held-out token folders")
    parser.add_argument("--dim", type=int_in(2), default=16, help="the cut query-key dims")
    parser.add_argument("--seq-len", type=int_in(2), default=512)
    parser.add_argument("--sample-tokens", type=int_in(1), default=2048)
    parser.add_argument("--eval-tokens", type=int_in(1), default=4096)

    def with_plot(args: argparse.Namespace) -> dict[str, Any]:
        result = run(args)
        plot(result["rows"], args.out / f"{NAME}.png")
        return result

    return harness.main(parser, argv, with_plot, render)


if __name__ == "__main__":
    sys.exit(main())
