"""python -m bench.throughput [--smoke-test] [--device cpu|cuda] [--arch A.yaml --arch B.yaml]
[--format table|json|yaml]

Training throughput (forward + backward + AdamW step, tokens/s) of a stack of blocks for each
attention kind at the same shapes, and of our ``mhsa`` block against PyTorch's own
``torch.nn.TransformerEncoderLayer`` (norm-first, GELU, no bias, no dropout) at equal size; with
``--arch``, of whole models instead (``ArchConfig`` files, e.g. ``studies export``'s: embedding,
blocks and head on random tokens, cross-entropy), the first the reference of the ratios.
Variants run interleaved in rounds and each reports its median round, so the printed ratios come
from one run on one machine. On CUDA the step runs under bf16 autocast.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from arch import ATTENTION_KINDS, ArchConfig, AttentionKind, ConfigError, HeadGroup, LayerSpec
from common.cli import Parser, add_format, dump, render_table
from workers.models import Block, build_model, count_params


@dataclass(frozen=True)
class Shape:
    d_model: int = 512
    heads: int = 8
    layers: int = 4
    seq_len: int = 256
    batch: int = 8
    mlp_ratio: float = 4.0


FULL, SMOKE = Shape(), Shape(d_model=64, heads=4, layers=1, seq_len=32, batch=2)
KINDS = ATTENTION_KINDS


def our_stack(shape: Shape, kind: AttentionKind, causal: bool) -> nn.Module:
    head = HeadGroup(shape.heads, shape.d_model // shape.heads)
    # a latent layer caches d_model units per token: half of what the mhsa layer caches
    layer = LayerSpec(kind, (head,), mlp_ratio=shape.mlp_ratio,
                      latent_dim=shape.d_model if kind == "latent" else 0)
    arch = ArchConfig(d_model=shape.d_model, layers=(layer,) * shape.layers,
                      max_seq_len=shape.seq_len, input_dim=shape.d_model, causal=causal)
    return nn.Sequential(*(Block(arch, i) for i in range(shape.layers)))


def torch_stack(shape: Shape) -> nn.Module:
    layers = [nn.TransformerEncoderLayer(shape.d_model, shape.heads,
                                         int(shape.mlp_ratio * shape.d_model), dropout=0.0,
                                         activation="gelu", batch_first=True, norm_first=True,
                                         bias=False) for _ in range(shape.layers)]
    return nn.Sequential(*layers)


class Runner:
    """One variant: a module, its optimizer, and a timed training step."""

    def __init__(self, name: str, module: nn.Module, shape: Shape, device: str) -> None:
        self.name, self.shape, self.device = name, shape, device
        self.module = module.to(device)
        params = [p for p in self.module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(shape.batch, shape.seq_len, shape.d_model, generator=g).to(device)
        self.rates: list[float] = []

    def loss(self) -> torch.Tensor:
        return self.module(self.x).float().pow(2).mean()

    def step(self) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device == "cuda"):
            loss = self.loss()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()

    def timed(self, steps: int) -> None:
        _sync(self.device)
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        _sync(self.device)
        self.rates.append(steps * self.shape.batch * self.shape.seq_len /
                          (time.perf_counter() - start))


class ModelRunner(Runner):
    """A whole model of an ``ArchConfig`` on random tokens (or vectors), trained on
    cross-entropy (or squared error): what a search's trial steps through."""

    def __init__(self, name: str, arch: ArchConfig, batch: int, device: str) -> None:
        shape = Shape(d_model=arch.d_model, layers=arch.n_layers, seq_len=arch.max_seq_len,
                      batch=batch)
        super().__init__(name, build_model(arch), shape, device)
        g = torch.Generator().manual_seed(0)
        self.vocab = arch.vocab_size
        self.x = (torch.randint(0, arch.vocab_size, (batch, arch.max_seq_len), generator=g)
                  if arch.vocab_size else
                  torch.randn(batch, arch.max_seq_len, arch.input_dim or 1, generator=g)
                  ).to(device)

    def loss(self) -> torch.Tensor:
        out = self.module(self.x).float()
        if self.vocab is None:
            return out.pow(2).mean()
        return nn.functional.cross_entropy(out.flatten(0, 1), self.x.flatten())


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def make_runners(shape: Shape, device: str) -> list[Runner]:
    runners = [Runner("torch TransformerEncoderLayer", torch_stack(shape), shape, device)]
    for kind in KINDS:
        runners.append(Runner(kind, our_stack(shape, kind, causal=False), shape, device))
    runners.append(Runner("mhsa causal", our_stack(shape, "mhsa", causal=True), shape, device))
    runners.append(Runner("mixit causal", our_stack(shape, "mixit", causal=True), shape, device))
    return runners


def measure(shape: Shape, device: str, rounds: int, steps: int,
            progress: Callable[[str], None],
            runners: list[Runner] | None = None) -> list[dict[str, Any]]:
    """Each runner's median tokens/s over ``rounds`` interleaved rounds; the ratios against our
    ``mhsa`` stack and PyTorch's layer (given ``runners``: against the first of them)."""
    given = runners is not None
    runners = runners if runners is not None else make_runners(shape, device)
    for r in runners:  # warm-up: allocator, kernels, optimizer state
        r.timed(2)
        r.rates.clear()
    for i in range(rounds):
        for r in runners:
            r.timed(steps)
        progress(f"round {i + 1}/{rounds}: " + ", ".join(
            f"{r.name} {r.rates[-1]:,.0f}" for r in runners))
    base = statistics.median(runners[0 if given else 1].rates)  # our mhsa, or the first
    torch_rate = statistics.median(runners[0].rates)
    rows = []
    for r in runners:
        rate = statistics.median(r.rates)
        trainable, total = count_params(r.module)
        rows.append({"variant": r.name, "tokens_per_s": rate, "vs_mhsa": rate / base,
                     "vs_torch": rate / torch_rate, "trainable_params": trainable,
                     "total_params": total})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="bench.throughput", description=__doc__.split("\n\n")[1])
    parser.add_argument("--smoke-test", action="store_true", help="tiny shapes, one round")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="training steps per round")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch default)")
    parser.add_argument("--arch", type=Path, action="append", default=[], metavar="YAML",
                        help="time this whole model (an ArchConfig file; repeatable): the "
                             "first is the ratios' reference")
    parser.add_argument("--batch-size", type=int, default=8, help="--arch: windows per step")
    add_format(parser)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = SMOKE if args.smoke_test else FULL
    rounds, steps = (1, 1) if args.smoke_test else (args.rounds, args.steps)
    runners: list[Runner] | None = None
    if args.arch:
        archs = [(path, read_arch(parser, path)) for path in args.arch]
        runners = [ModelRunner(f"{path.stem}: {arch.describe()}", arch, args.batch_size,
                               args.device) for path, arch in archs]
    rows = measure(shape, args.device, rounds, steps, lambda m: print(m, file=sys.stderr),
                   runners)
    if args.format != "table":
        print(dump({"shape": shape.__dict__, "device": args.device, "rows": rows}, args.format))
        return 0
    sized = f"whole models, batch {args.batch_size}" if args.arch else str(shape)
    print(f"{sized} on {args.device} ({torch.get_num_threads()} threads)")
    columns = ["variant", "tokens/s", "vs our mhsa", "vs torch layer", "trainable", "total"]
    keys = ["tokens_per_s", "vs_mhsa", "vs_torch", "trainable_params", "total_params"]
    if args.arch:  # whole models: the ratio to the first; no PyTorch layer ran
        columns, keys = ["model", "tokens/s", "vs first", "trainable", "total"], \
            ["tokens_per_s", "vs_mhsa", "trainable_params", "total_params"]
    shown = {"tokens_per_s": "{:,.0f}", "vs_mhsa": "{:.2f}", "vs_torch": "{:.2f}",
             "trainable_params": "{:,}", "total_params": "{:,}"}
    print(render_table(columns, [[r["variant"], *(shown[k].format(r[k]) for k in keys)]
                                 for r in rows], right=[False] + [True] * len(keys)))
    return 0


def read_arch(parser: Parser, path: Path) -> ArchConfig:
    """``path``'s ``ArchConfig``, or the parser's one-line error (exit 2)."""
    try:
        return ArchConfig.from_yaml(path.read_text())
    except (OSError, ConfigError) as e:
        parser.error(f"--arch {str(path)!r}: {e}")


if __name__ == "__main__":
    sys.exit(main())
