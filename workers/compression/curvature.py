"""What a change of a layer's keys and values costs the loss, to second order, from one forward
and one backward pass of the model over a sample (docs/theory.md §10.6): per mhsa layer the
second moment of its attention inputs, ``C = E[x x^T]`` (d x d), and of the loss gradient at its
keys and values, ``G = E[g g^T]`` (kv_width x kv_width; keys before RoPE turns them, then
values, in the layer's fused order). Under the Kronecker-factored approximation of the Fisher
information (K-FAC, Martens and Grosse, 2015), changing the layer's stacked key and value rows
``W`` by ``dW`` raises the sample's loss by about ``1/2 tr(G dW C dW^T)`` per token.

``layer_curvature(source, x, targets)`` runs on any ``LayerSource``: a model in memory, or a
Llama-family folder or GGUF file streamed one decoder layer at a time. The sample goes through
in chunks of a few windows, each chunk's moments added to running sums, so that what is held
does not grow with the sample: per chunk, the forward pass keeps the residual stream entering
some blocks, the backward pass runs the blocks in reverse, each recomputed from its input with
gradients (activation checkpointing, Chen et al., 2016). When one window's stream at every
block would exceed ``STREAM_BYTES`` only every ``segment``-th block's input is kept and a
segment's others are recomputed from it before its backward (``sqrt(n)`` checkpointing: one
more forward). A block's MLP, which works position by position, runs a few thousand positions at
a time (``MLP_BYTES``); its attention sees whole windows. No weight gradient is computed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from arch import ArchConfig
from common.progress import Progress
from workers.checkpoints.stream import LayerSource
from workers.compression.loss_rule import IGNORE
from workers.models.attention import MultiHeadAttention
from workers.models.model import Block

HEAD_TOKENS = 256  # positions whose output logits are formed at once in the backward pass
STREAM_BYTES = 128 << 20  # residual streams kept for a chunk's backward pass, at most
MLP_BYTES = 64 << 20  # an MLP's activations (and their gradients) at once, at most


@dataclass(frozen=True)
class LayerCurvature:
    """One mhsa layer's second moments on the sample (float64).

    Attributes:
        index: the layer.
        inputs: ``E[x x^T]`` of its attention's inputs (after the norm), (d, d).
        grads: ``E[g g^T]`` of the summed loss's gradient at its keys (before RoPE) and
            values, (kv_width, kv_width), keys first.
        tokens: positions the means are over.
    """

    index: int
    inputs: Tensor
    grads: Tensor
    tokens: int


@dataclass(frozen=True)
class PassPlan:
    """How the sample goes through: ``windows`` per chunk, the input of every ``segment``-th
    block kept (``segment`` = the depth: every block's), an MLP ``rows`` positions at a time."""

    windows: int
    segment: int
    rows: int

    def block_passes(self, n_layers: int) -> int:
        """Blocks run per chunk: forward, the segments' recomputed inputs, backward."""
        starts = range(0, n_layers, self.segment)
        recomputed = sum(min(self.segment, n_layers - s) - 1 for s in list(starts)[:-1])
        return 2 * n_layers + recomputed


def pass_plan(arch: ArchConfig, windows: int, seq_len: int, chunk: int | None = None,
              segment: int | None = None, rows: int | None = None) -> PassPlan:
    """The chunks of ``windows`` windows of ``seq_len`` positions whose kept residual streams
    fit ``STREAM_BYTES`` (one window at least; the chunks as even as they can be), each given
    value kept."""
    n = arch.n_layers
    stream = seq_len * arch.d_model * 4  # one window's residual stream at one block, float32
    if segment is None:
        segment = n if n * stream <= STREAM_BYTES else max(1, math.isqrt(n - 1) + 1)
    kept = -(-n // segment) + segment  # the segments' first inputs and one segment's
    if chunk is None:
        most = max(1, STREAM_BYTES // (kept * stream))
        chunk = -(-windows // -(-windows // most))  # as even as the chunks can be
    hidden = max(arch.mlp_hidden(layer) for layer in arch.layers)
    per_row = 4 * (6 * arch.d_model + 6 * hidden)  # norm, maps, gate, their gradients
    if rows is None:
        rows = max(1, MLP_BYTES // per_row)
    return PassPlan(max(1, min(chunk, windows)), max(1, min(segment, n)), max(1, rows))


def layer_curvature(source: LayerSource, x: Tensor, targets: Tensor, windows: int | None = None,
                    quiet: bool = True, segment: int | None = None, rows: int | None = None
                    ) -> list[LayerCurvature]:
    """Every mhsa layer's ``LayerCurvature`` on ids ``x`` against ``targets`` (B, T;
    ``IGNORE`` where a position does not count); progress on stderr unless ``quiet``.

    Args:
        windows, segment, rows: windows per chunk, blocks per checkpointed segment, MLP
            positions at once (``PassPlan``; default: what fits ``STREAM_BYTES`` and
            ``MLP_BYTES``). They change what is held and how often a block runs, never the
            moments (beyond float rounding).
    """
    arch = source.arch
    layers = [i for i, layer in enumerate(arch.layers) if layer.kind.to_latent]
    sums = {i: _Moments(arch.d_model, arch.layers[i].kv_width) for i in layers}
    plan = pass_plan(arch, len(x), x.shape[1], windows, segment, rows)
    chunks = list(zip(x.split(plan.windows), targets.split(plan.windows)))
    start = (f"one forward and one backward pass of {arch.n_layers} blocks over {len(x):,} "
             f"window(s) of {x.shape[1]:,} positions, {plan.windows} at a time"
             + (f", every {plan.segment}th block's input kept" if plan.segment < arch.n_layers
                else ""))
    with Progress("curvature", total=plan.block_passes(arch.n_layers) * len(chunks),
                  unit="block passes", quiet=quiet, start=start) as bar:
        done = 0
        for ids, ys in chunks:
            _chunk(source, ids, ys, sums, plan, bar)
            done += len(ids)
            bar.event(f"{done:,}/{len(x):,} windows")
    tokens = int((targets != IGNORE).sum())
    return [LayerCurvature(i, sums[i].inputs / max(1, sums[i].rows),
                           sums[i].grads / max(1, sums[i].rows), tokens) for i in layers]


class _Moments:
    """Running sums of ``x x^T`` and ``g g^T`` over positions."""

    def __init__(self, d: int, kv_width: int) -> None:
        self.inputs = torch.zeros(d, d, dtype=torch.float64)
        self.grads = torch.zeros(kv_width, kv_width, dtype=torch.float64)
        self.rows = 0

    def add(self, x: Tensor, g: Tensor) -> None:
        x2, g2 = x.reshape(-1, x.shape[-1]).double(), g.reshape(-1, g.shape[-1]).double()
        self.inputs += x2.T @ x2
        self.grads += g2.T @ g2
        self.rows += x2.shape[0]


def _chunk(source: LayerSource, ids: Tensor, targets: Tensor, sums: dict[int, _Moments],
           plan: PassPlan, bar: Progress) -> None:
    """One chunk of windows: forward keeping the input of each segment's first block (and of
    every block of the last segment), the loss's gradient at the last block's output, then the
    segments backwards, each one's inputs recomputed from its first."""
    n = source.arch.n_layers
    starts = list(range(0, n, plan.segment))
    kept: dict[int, Tensor] = {}
    with torch.no_grad():
        h = source.inputs(ids)
        for i in range(n):
            if i % plan.segment == 0 or i >= starts[-1]:
                kept[i] = h
            with source.block(i) as block:
                h = _forward(block, h, plan.rows)
            bar.update(1)
    grad = _output_grad(source, h, targets)
    del h
    for first in reversed(starts):
        end = min(first + plan.segment, n)
        with torch.no_grad():
            for i in range(first + 1, end):
                if i not in kept:
                    with source.block(i - 1) as block:
                        kept[i] = _forward(block, kept[i - 1], plan.rows)
                    bar.update(1)
        for i in reversed(range(first, end)):
            with source.block(i) as block:
                grad = _block_backward(block, kept.pop(i), grad, sums.get(i), plan.rows)
            bar.update(1)


def _output_grad(source: LayerSource, h: Tensor, targets: Tensor) -> Tensor:
    """The gradient of the summed loss at the residual stream after the last block, a few
    positions at a time (a large vocabulary's logits are never formed for the whole chunk)."""
    flat_h, flat_y = h.reshape(-1, h.shape[-1]), targets.reshape(-1)
    grad = torch.zeros_like(flat_h)
    with source.output() as output:
        for start in range(0, flat_h.shape[0], HEAD_TOKENS):
            rows = slice(start, start + HEAD_TOKENS)
            part = flat_h[rows].detach().requires_grad_(True)
            loss = torch.nn.functional.cross_entropy(output(part), flat_y[rows],
                                                     ignore_index=IGNORE, reduction="sum")
            (grad[rows],) = torch.autograd.grad(loss, part)
    return grad.view_as(h)


def _attention_part(block: Block, h: Tensor) -> Tensor:
    """The residual stream after the block's attention, ``h + eta attn(norm(h))``."""
    out: Tensor = h + block.eta * block.attn(block.attn_norm(h))
    return out


def _forward(block: Block, h: Tensor, rows: int) -> Tensor:
    """``block(h)`` (no gradient), its MLP ``rows`` positions at a time."""
    mid = _attention_part(block, h)
    if block.mlp is None or block.mlp_norm is None:
        return mid
    out = mid.clone()
    flat_mid, flat_out = mid.view(-1, mid.shape[-1]), out.view(-1, out.shape[-1])
    for a in range(0, flat_mid.shape[0], rows):
        flat_out[a:a + rows] += block.mlp(block.mlp_norm(flat_mid[a:a + rows]))
    return out


def _mlp_backward(block: Block, mid: Tensor, grad: Tensor, rows: int) -> Tensor:
    """The gradient at the MLP's residual input ``mid`` from ``grad`` at the block's output,
    ``rows`` positions at a time (the MLP works position by position)."""
    if block.mlp is None or block.mlp_norm is None:
        return grad
    out = grad.clone()
    flat_mid, flat_grad = mid.view(-1, mid.shape[-1]), grad.reshape(-1, grad.shape[-1])
    flat_out = out.view(-1, out.shape[-1])
    for a in range(0, flat_mid.shape[0], rows):
        part = flat_mid[a:a + rows].detach().requires_grad_(True)
        with torch.enable_grad():
            y = block.mlp(block.mlp_norm(part))
            (g,) = torch.autograd.grad(y, part, flat_grad[a:a + rows])
        flat_out[a:a + rows] += g
    return out


def _block_backward(block: Block, h: Tensor, grad: Tensor, moments: _Moments | None,
                    rows: int) -> Tensor:
    """The gradient at the block's input from ``grad`` at its output, its forward recomputed
    from ``h``: the attention with whole windows, the MLP ``rows`` positions at a time; the
    layer's attention inputs and key/value gradients added to ``moments`` (an mhsa layer)."""
    h = h.detach().requires_grad_(True)
    with torch.enable_grad(), _keys_values(block) as seen:
        mid = _attention_part(block, h)
        mid_grad = _mlp_backward(block, mid.detach(), grad, rows)
        if moments is None:
            (h_grad,) = torch.autograd.grad(mid, h, mid_grad)
            return h_grad
        x, kv = seen
        h_grad, kv_grad = torch.autograd.grad(mid, (h, kv), mid_grad)
    moments.add(x.detach(), kv_grad)
    return h_grad


@contextmanager
def _keys_values(block: Block) -> Iterator[list[Tensor]]:
    """While it lasts, an mhsa block's attention records its input and its keys and values
    (one tensor, before RoPE) in the list it yields: ``[x, kv]``."""
    attn = block.attn
    seen: list[Tensor] = []
    if not isinstance(attn, MultiHeadAttention) or type(attn) is not MultiHeadAttention:
        yield seen
        return

    def project(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = MultiHeadAttention.project(attn, x)
        kv = torch.cat([k, v], dim=-1)
        seen[:] = [x, kv]
        k, v = kv.split([attn.k_width, attn.v_width], dim=-1)
        return q, k, v

    attn.project = project  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        del attn.project
