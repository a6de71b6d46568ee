"""A latent student priced and fitted from one forward and one backward pass (docs/theory.md
§10.6), at any size: ``curvature_latent`` gives every mhsa layer's loss increase at each
candidate latent width (its curvature spectrum's tail) and its latent maps fitted to second
order, reading the model one decoder layer at a time when it is streamed. With a decoupled RoPE
part (``rope_dim > 0``), each key/value head first keeps the pairs whose RoPE costs most to
drop (``workers.compression.pairs.derotation_order``), measured on a few windows of the sample.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import Tensor

from alloc.compression import CheckpointMeasurement, form_of
from arch import ArchConfig
from common.progress import Progress
from workers.checkpoints.stream import LayerSource
from workers.compression.curvature import LayerCurvature, layer_curvature
from workers.compression.heads import layer_maps
from workers.compression.latent_students import curvature_fit
from workers.compression.pairs import derotation_order
from workers.compression.student_inputs import LatentFits, PairOrders
from workers.models.attention import MultiHeadAttention

DEROTATION_WINDOWS = 4  # windows of the sample that rank the pairs to leave unturned


def curvature_latent(source: LayerSource, measured: CheckpointMeasurement, x: Tensor,
                     targets: Tensor, rope_dim: int = 0, quiet: bool = True,
                     moments: Sequence[LayerCurvature] | None = None,
                     orders: PairOrders | None = None
                     ) -> tuple[CheckpointMeasurement, LatentFits]:
    """``measured`` (the model's spectra, ``workers.compression.measure.measure_layers`` without
    data) with every mhsa layer's ``latent_losses`` estimated to second order on ids ``x`` against
    ``targets``, its RoPE pairs ranked for a decoupled RoPE part of ``rope_dim`` per key/value
    head, and the latent maps of every layer at its full rank. ``moments`` and ``orders``:
    the curvature and the pair rankings already measured on that sample (else measured
    here)."""
    arch = source.arch
    if rope_dim:
        orders = orders or derotation_orders(source, x[:DEROTATION_WINDOWS], quiet)
        measured = _with_orders(measured, orders)
    orders = orders if rope_dim and orders else {}
    curvature = {c.index: c for c in moments or layer_curvature(source, x, targets, quiet=quiet)}
    fits: dict[int, tuple[Tensor, Tensor]] = {}
    losses: dict[int, dict[int, float]] = {}
    student, form = _latent_arch(arch, rope_dim), form_of(latent=True, rope_dim=rope_dim)
    with Progress("fit", total=len(curvature), unit="layers", quiet=quiet,
                  start="each layer's latent maps to second order") as bar:
        for i, layer in curvature.items():
            with source.block(i) as block:
                weight = _weight(block.attn)
            up, down, spectrum = curvature_fit(weight, student, i, orders, layer.inputs,
                                               layer.grads)
            fits[i] = (up, down)
            losses[i] = width_losses(spectrum, form.widths(arch.layers[i], arch.d_model,
                                                           measured.align, rope_dim))
            bar.update(1)
    layers = tuple(dataclasses.replace(m, latent_losses=losses.get(m.index))
                   for m in measured.layers)
    return dataclasses.replace(measured, layers=layers, form=form.name, rope_dim=rope_dim,
                               latent_fit="curvature"), fits


def width_losses(spectrum: Tensor, widths: list[int]) -> dict[int, float]:
    """Per candidate width ``c``, the loss increase per token the curvature predicts for
    keeping the leading ``c`` directions: half the squared singular values beyond them (0 at
    the full rank)."""
    energy = spectrum.double().square()
    tail = torch.cat([energy.flip(0).cumsum(0).flip(0), energy.new_zeros(1)])
    return {c: 0.5 * float(tail[min(c, len(energy))]) for c in widths}


def _weight(attn: torch.nn.Module) -> Tensor:
    """A teacher layer's fused query/key/value rows, float32."""
    assert isinstance(attn, MultiHeadAttention)
    return attn.qkv.weight.detach().float()


def _latent_arch(arch: ArchConfig, rope_dim: int) -> ArchConfig:
    """``arch`` with every mhsa layer latent at its full rank: the row layout the fits use."""
    form = form_of(latent=True, rope_dim=rope_dim)
    layers = tuple(form.layer_spec(layer, form.widths(layer, arch.d_model, 1, rope_dim)[-1],
                                   arch.positional, rope_dim) if layer.kind.to_latent
                   else layer for layer in arch.layers)
    return dataclasses.replace(arch, layers=layers)


@torch.no_grad()
def derotation_orders(source: LayerSource, x: Tensor, quiet: bool = True) -> PairOrders:
    """Every RoPE key/value head's pairs, the costliest to leave unturned first
    (``derotation_order``), the sample's residual stream carried from block to block."""
    arch = source.arch
    orders: dict[tuple[int, int, int], tuple[int, ...]] = {}
    h = source.inputs(x)
    bias = arch.bias or arch.qkv_bias
    with Progress("rank pairs", total=arch.n_layers, unit="layers", quiet=quiet,
                  start=f"which RoPE pairs cost most to leave unturned, on {len(x)} "
                        "window(s)") as bar:
        for i in range(arch.n_layers):
            with source.block(i) as block:
                inputs = block.attn_norm(h)
                if bias:
                    inputs = torch.cat([inputs, inputs.new_ones(*inputs.shape[:-1], 1)], -1)
                maps = layer_maps(block.attn, i) if arch.layers[i].kind.to_latent else []
                for j, kv in sorted({(m.group, m.kv) for m in maps}):
                    readers = [m for m in maps if (m.group, m.kv) == (j, kv)]
                    orders[(i, j, kv)] = derotation_order(readers, inputs, arch.causal)
                h = block(h)
            bar.update(1)
    return orders


def _with_orders(measured: CheckpointMeasurement, orders: PairOrders) -> CheckpointMeasurement:
    """``measured`` with each RoPE head's pair order replaced by ``orders`` (the student keeps
    the leading ones as its RoPE part)."""
    arch = measured.arch
    layers = []
    for m in measured.layers:
        spec = arch.layers[m.index]
        heads = []
        for head in m.heads:
            g = spec.heads[head.group]
            kv = head.head // (g.count // g.kv_heads)
            order = orders.get((m.index, head.group, kv))
            if order is None:
                heads.append(head)
                continue
            # sigma holds each pair's bound twice (its two dims), in the pairs' order
            bound = {p: head.sigma[2 * k] for k, p in enumerate(head.pairs)}
            sigma = tuple(bound[p] for p in order for _ in range(2))
            heads.append(dataclasses.replace(head, pairs=tuple(order), sigma=sigma))
        layers.append(dataclasses.replace(m, heads=tuple(heads)))
    return dataclasses.replace(measured, layers=tuple(layers))

