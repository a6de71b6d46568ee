"""What a change of a layer's keys and values costs the loss, to second order, from one forward
and one backward pass of the model over a sample (docs/theory.md §10.6): per mhsa layer the
second moment of its attention inputs, ``C = E[x x^T]`` (d x d), and of the loss gradient at its
keys and values, ``G = E[g g^T]`` (kv_width x kv_width; keys before RoPE turns them, then
values, in the layer's fused order). Under the Kronecker-factored approximation of the Fisher
information (K-FAC, Martens and Grosse, 2015), changing the layer's stacked key and value rows
``W`` by ``dW`` raises the sample's loss by about ``1/2 tr(G dW C dW^T)`` per token.

``layer_curvature(source, x, targets)`` runs on any ``LayerSource``: a model in memory, or a
Llama-family folder or GGUF file streamed one decoder layer at a time. The forward pass keeps
each block's input; the backward pass then runs the blocks in reverse, each recomputed from its
input with gradients (activation checkpointing, Chen et al., 2016), so what is held is one
block, the head for a few positions at a time, and the residual stream entering every block.
No weight gradient is computed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from common.progress import Progress
from workers.checkpoints.stream import LayerSource
from workers.compression.loss_rule import IGNORE
from workers.models.attention import MultiHeadAttention
from workers.models.model import Block

HEAD_TOKENS = 256  # positions whose output logits are formed at once in the backward pass


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


def layer_curvature(source: LayerSource, x: Tensor, targets: Tensor, windows: int = 2,
                    quiet: bool = True) -> list[LayerCurvature]:
    """Every mhsa layer's ``LayerCurvature`` on ids ``x`` against ``targets`` (B, T;
    ``IGNORE`` where a position does not count), ``windows`` windows at a time; progress on
    stderr unless ``quiet`` (two passes over the layers per chunk)."""
    arch = source.arch
    layers = [i for i, layer in enumerate(arch.layers) if layer.kind.to_latent]
    sums = {i: _Moments(arch.d_model, arch.layers[i].kv_width) for i in layers}
    chunks = list(zip(x.split(windows), targets.split(windows)))
    with Progress("curvature", total=2 * arch.n_layers * len(chunks), unit="layers",
                  quiet=quiet, start=f"one forward and one backward pass over {len(x):,} "
                                     f"windows of {x.shape[1]:,} positions, {windows} at a "
                                     "time") as bar:
        for ids, ys in chunks:
            _chunk(source, ids, ys, sums, bar)
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
           bar: Progress) -> None:
    """One chunk of windows: forward keeping each block's input, the loss's gradient at the
    last block's output, then the blocks backwards."""
    n = source.arch.n_layers
    with torch.no_grad():
        h = source.inputs(ids)
        entering = []
        for i in range(n):
            entering.append(h)
            with source.block(i) as block:
                h = block(h)
            bar.update(1)
    grad = _output_grad(source, h, targets)
    for i in reversed(range(n)):
        with source.block(i) as block:
            grad = _block_backward(block, i, entering.pop(), grad, sums.get(i))
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


def _block_backward(block: Block, index: int, h: Tensor, grad: Tensor,
                    moments: _Moments | None) -> Tensor:
    """The gradient at block ``index``'s input from ``grad`` at its output, its forward
    recomputed from ``h``; the layer's attention inputs and key/value gradients added to
    ``moments`` (an mhsa layer)."""
    h = h.detach().requires_grad_(True)
    with torch.enable_grad(), _keys_values(block) as seen:
        out = block(h)
        if moments is None:
            (h_grad,) = torch.autograd.grad(out, h, grad)
            return h_grad
        x, kv = seen
        h_grad, kv_grad = torch.autograd.grad(out, (h, kv), grad)
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
