"""Training throughput at one shape (GPT-2 small on a GPU): ``bench.throughput``'s runner (a
stack of our blocks, forward + backward + fused AdamW, bf16 autocast on CUDA) for each
attention kind, causal, eager or under ``torch.compile``, beside a plain PyTorch block of the
same shape (``F.scaled_dot_product_attention``), with the model FLOPs utilisation of each.

FLOPs per token are counted from the modules (PaLM's appendix B convention, nanoGPT's
``estimate_mfu``): 2 per weight of every linear map forward, 2 more for the input's gradient
and 2 for the weight's where it trains (a frozen map skips that one); attention's ``QK^T`` and
``AV`` at the full length (not halved for causal masks), 3 times over for forward and backward.
MixiT's mixing has no ``QK^T``.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from arch import ATTENTION_KINDS, kind_traits
from bench.gpu.plan import Context, PartResult, TimeLimit
from bench.throughput import Runner, Shape, our_stack

KINDS = ATTENTION_KINDS  # every kind a layer may name (arch.KINDS owns the list)
REFERENCE = "pytorch sdpa block"
# bf16 dense tensor-core peaks (NVIDIA's data sheets), by a fragment of the device's name
PEAKS = (("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200", 989e12),
         ("GH200", 989e12), ("A100", 312e12), ("L40S", 362e12), ("A10G", 70e12))


class ReferenceBlock(nn.Module):
    """GPT-2's pre-norm block in plain PyTorch, no biases but the norms': fused QKV, causal
    ``F.scaled_dot_product_attention``, GELU MLP."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        d, hidden = shape.d_model, int(shape.mlp_ratio * shape.d_model)
        self.heads = shape.heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.up, self.down = nn.Linear(d, hidden, bias=False), nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, T, Dh)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


def stack(shape: Shape, name: str) -> nn.Module:
    """The blocks of variant ``name``: the reference, or our kind (causal)."""
    if name == REFERENCE:
        return nn.Sequential(*(ReferenceBlock(shape) for _ in range(shape.layers)))
    return our_stack(shape, name, causal=True)  # type: ignore[arg-type]  # a kind's name


def train_flops_per_token(module: nn.Module, shape: Shape, name: str) -> float:
    """Model FLOPs of one training token (see the module docstring)."""
    flops = 0.0
    for linear in module.modules():
        if isinstance(linear, nn.Linear):
            weights = linear.weight.numel()
            flops += (6 if linear.weight.requires_grad else 4) * weights
    # per layer and token: QK^T over every key (2 T d) and AV (2 T d); a kind without queries
    # and keys (MixiT) only mixes the values
    mixes = 2 if name in KINDS and not kind_traits(name).queries_keys else 4
    attention = mixes * shape.seq_len * shape.d_model
    return flops + 3 * attention * shape.layers


def peak_flops(device: str) -> float | None:
    """The bf16 dense peak of the CUDA device (None on the CPU or an unknown card)."""
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name()
    return next((peak for part, peak in PEAKS if part in name), None)


def matmul_tflops(device: str, n: int, repeats: int = 10) -> float:
    """TFLOP/s of an ``n``-cube matrix product (bf16 on CUDA, float32 on the CPU): what this
    card really reaches, beside its data-sheet peak."""
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b  # warm-up
    sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    sync(device)
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def make_runner(ctx: Context, name: str, compiled: bool) -> Runner:
    """``bench.throughput``'s runner of variant ``name``; compiled block by block (the repeated
    region: one compile serves every block of a kind)."""
    module = stack(ctx.sizes.shape, name)
    if compiled:
        module = nn.Sequential(*[cast(nn.Module, torch.compile(b, backend=ctx.backend))
                                 for b in module.children()])
    return Runner(name, module, ctx.sizes.shape, ctx.device)


@dataclass
class Measured:
    """One variant's numbers (its model and optimizer are freed once it is timed)."""

    name: str
    flops: float  # per training token
    warm_s: float  # the first two steps: allocator, kernels, optimizer state, the compile
    graphs: int | None  # graphs dynamo compiled (one per distinct block and pass: no
    # recompile per block; None eager)
    rates: list[float] = field(default_factory=list)  # tokens/s of each round


def measure(ctx: Context, result: PartResult, limit: TimeLimit, compiled: bool,
            say: Callable[[str], None]) -> None:
    """Each variant in turn: built, warmed, then its rounds, as many as the limit allows;
    each row its median round. A variant the limit does not reach is left out with a line;
    the rows measured before stay."""
    done: list[Measured] = []
    try:
        for name in (REFERENCE, *KINDS):
            limit.check(f"{name} ({len(done)} of {len(KINDS) + 1} variants measured)")
            runner, measured = warmed(ctx, name, compiled)
            done.append(measured)
            say(f"{'compiled' if compiled else 'eager'} {name}: warm in {measured.warm_s:.1f} s")
            timed_rounds(ctx, runner, limit, result)
            measured.rates = list(runner.rates)
            del runner
            free(ctx.device)
    finally:
        result.rows.extend(rows(ctx, done, compiled))


def warmed(ctx: Context, name: str, compiled: bool) -> tuple[Runner, Measured]:
    """Variant ``name``'s runner after two steps, and its record."""
    if compiled:
        torch._dynamo.reset()  # each kind compiles from scratch: its compile time is its own
        dynamo_counters().clear()
    runner = make_runner(ctx, name, compiled)
    start = time.perf_counter()
    runner.timed(2)
    warm = time.perf_counter() - start
    runner.rates.clear()
    graphs = dynamo_counters()["stats"].get("unique_graphs") if compiled else None
    return runner, Measured(name, train_flops_per_token(runner.module, ctx.sizes.shape, name),
                            warm, graphs)


def dynamo_counters() -> Any:
    """Dynamo's event counters (``unique_graphs``: graphs compiled since the last clear)."""
    from torch._dynamo.utils import counters

    return counters


def free(device: str) -> None:
    """Give the freed blocks back, so that the next variant's peak is its own."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def timed_rounds(ctx: Context, runner: Runner, limit: TimeLimit, result: PartResult) -> None:
    """Up to ``sizes.rounds`` rounds of ``sizes.steps`` steps; fewer when the next one would
    not fit the limit."""
    for i in range(ctx.sizes.rounds):
        start = time.perf_counter()
        runner.timed(ctx.sizes.steps)
        if i + 1 < ctx.sizes.rounds and limit.left() < 2 * (time.perf_counter() - start):
            result.note(f"{runner.name}: {i + 1} of {ctx.sizes.rounds} rounds (limit)")
            return


def rows(ctx: Context, done: list[Measured], compiled: bool) -> list[dict[str, Any]]:
    """A row per variant timed: tokens/s (median round), ratios to ``mhsa`` and to the
    reference, FLOPs per token and MFU."""
    rates = {m.name: statistics.median(m.rates) for m in done if m.rates}
    out = []
    for m in done:
        if m.name not in rates:
            continue
        rate = rates[m.name]
        out.append({"variant": m.name, "compiled": compiled, "tokens_per_s": rate,
                    "vs_mhsa": rate / rates["mhsa"] if "mhsa" in rates else None,
                    "vs_reference": rate / rates[REFERENCE] if REFERENCE in rates else None,
                    "flops_per_token": m.flops,
                    "mfu": None if ctx.peak_flops is None else rate * m.flops / ctx.peak_flops,
                    "warm_s": m.warm_s, "graphs": m.graphs, "rounds": len(m.rates)})
    return out


def run_eager(ctx: Context, result: PartResult, limit: TimeLimit,
              say: Callable[[str], None]) -> None:
    """The throughput part: the card's matrix product rate, then every variant eager."""
    n = 8192 if ctx.device == "cuda" else 256
    ctx.matmul_tflops = matmul_tflops(ctx.device, n)
    result.note(f"{n}-cube matrix product: {ctx.matmul_tflops:.3g} TFLOP/s "
                f"({'bf16' if ctx.device == 'cuda' else 'float32'})")
    measure(ctx, result, limit, compiled=False, say=say)


def run_compiled(ctx: Context, result: PartResult, limit: TimeLimit,
                 say: Callable[[str], None]) -> None:
    """The compiled part: every variant under ``torch.compile`` (``ctx.backend``)."""
    result.note(f"torch.compile backend {ctx.backend}, block by block")
    measure(ctx, result, limit, compiled=True, say=say)
