"""The loss rule (docs/theory.md §10.3-10.5): what cutting one head group's keys or values
costs the sample's next-token loss, each cut alone, one forward of the model per group and
candidate (``loss_sensitivity``); or what making one mhsa layer latent at each width costs
(``latent_sensitivity``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

from alloc.compression import LayerMeasurement, candidate_dims, form_of
from arch import ArchConfig, LayerSpec
from common.progress import Progress
from workers.chunks import window_chunks
from workers.compression.latent_students import latent_layer
from workers.models.kinds import make_attention
from workers.models.model import Model

IGNORE = -100  # a target that does not count


@torch.no_grad()
def sample_loss(model: Model, x: Tensor, targets: Tensor) -> float:
    """Mean cross-entropy of ``model`` on ids ``x`` against ``targets`` (B, T; ``IGNORE`` where
    a position does not count)."""
    return tail_loss(model, model.inputs(x), 0, targets)


@torch.no_grad()
def tail_loss(model: Model, h: Tensor, start: int, targets: Tensor) -> float:
    """``sample_loss`` from the residual stream ``h`` (B, T, d) entering block ``start``
    (``Model.tail``), a few windows at a time (their output logits fit ``CHUNK_BYTES``)."""
    per_window = 4 * h.shape[1] * (model.arch.vocab_size or 1)  # float32 output logits
    total = 0.0
    for hs, ys in zip(window_chunks(h, per_window), window_chunks(targets, per_window)):
        logits = model.tail(hs, start)
        total += float(torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ys.reshape(-1), ignore_index=IGNORE,
            reduction="sum"))
    return total / max(1, int((targets != IGNORE).sum()))


def loss_sensitivity(model: Model, x: Tensor, targets: Tensor, layers: list[LayerMeasurement],
                     align: int, scales: Mapping[int, Sequence[float]],
                     quiet: bool = True) -> list[LayerMeasurement]:
    """``layers`` with each head group's loss increase on the sample at each candidate
    ``qk_dim`` and, in mhsa layers, each candidate ``v_dim``, every other group and side kept
    (docs/theory.md §10.3-10.4): the student of that cut alone, built as ``workers.compress``
    builds it (the SVD, the measured pair ranking, or the values' SVD weighted by ``scales``,
    each mhsa layer's input RMS; a layer without one keeps its values). One forward of the
    model on the sample per group and candidate, the slow part of a profile: counted on stderr
    unless ``quiet``."""
    from workers.compression.students import build_student, rankings

    cuts = [(m, j, side, dim) for m in layers if m.heads
            for j, g in enumerate(model.arch.layers[m.index].heads)
            for side, dim in (("qk_dim", g.qk_dim), ("v_dim", g.v_dim))
            if side == "qk_dim" or m.index in scales]
    forwards = 1 + sum(len(candidate_dims(dim, align)) - 1 for *_, dim in cuts)
    with Progress("loss rule", total=forwards, unit="forwards", quiet=quiet,
                  start=f"one forward of the model on the sample per head group and candidate "
                        f"qk_dim or v_dim: {forwards:,} for {len(cuts)} key and value cuts"
                  ) as bar:
        base = sample_loss(model, x, targets)
        bar.update(1)
        orders = rankings(model.arch, ((m.index, h) for m in layers for h in m.heads))
        increases: dict[tuple[int, str], list[dict[int, float]]] = {}
        for m, j, side, dim in cuts:
            losses = {}
            for r in candidate_dims(dim, align)[:-1]:
                arch = _cut_alone(model.arch, m.index, j, **{side: r})
                student = build_student(model, arch, orders, scales)
                losses[r] = sample_loss(student, x, targets) - base
                bar.update(1)
            increases.setdefault((m.index, side), []).append({**losses, dim: 0.0})
            if losses:
                bar.event(f"layer {m.index} group {j} {side} ({len(losses)} cut(s))")
    return [dataclasses.replace(m, loss_increases=tuple(increases.get((m.index, "qk_dim"), ())),
                                value_losses=tuple(increases.get((m.index, "v_dim"), ())),
                                input_scale=tuple(scales.get(m.index, ())))
            for m in layers]


@torch.no_grad()
def latent_sensitivity(model: Model, x: Tensor, targets: Tensor,
                       layers: list[LayerMeasurement], align: int,
                       scales: Mapping[int, Sequence[float]], quiet: bool = True
                       ) -> list[LayerMeasurement]:
    """``layers`` with each mhsa layer's loss increase on the sample at each candidate latent
    width (``StudentForm.widths``), that layer alone made latent as ``workers.compress`` builds it
    (keys and values from the SVD of their stacked maps weighted by ``scales``, the layer's
    input RMS; keys turned after they are rebuilt where the teacher's are; docs/theory.md
    §10.5), every other layer the teacher's. One forward per layer and width, from the layer
    on (the residual stream entering it is carried from layer to layer): counted on stderr
    unless ``quiet``."""
    arch = model.arch
    form = form_of(latent=True, rope_dim=0)  # keys turned after they are rebuilt
    widths = {i: form.widths(arch.layers[i], arch.d_model, align) for i in sorted(scales)}
    forwards = 1 + sum(len(w) - 1 for w in widths.values())
    with Progress("loss rule", total=forwards, unit="forwards", quiet=quiet,
                  start=f"one forward of the model on the sample per layer and latent width: "
                        f"{forwards:,} for {len(widths)} layer(s)") as bar:
        h, reached = model.inputs(x), 0  # the residual stream entering block ``reached``
        base = tail_loss(model, h, 0, targets)
        bar.update(1)
        increases: dict[int, dict[int, float]] = {}
        for i, candidates in widths.items():
            h, reached = _advance(model, h, reached, i), i  # the blocks before i: the teacher's
            costs = {}
            for width in candidates[:-1]:
                with _latent_alone(model, i, width, scales[i]):
                    costs[width] = tail_loss(model, h, i, targets) - base
                bar.update(1)
            increases[i] = {**costs, candidates[-1]: 0.0}  # full rank: the teacher's layer
            bar.event(f"layer {i} latent ({len(costs)} width(s))")
    return [dataclasses.replace(m, latent_losses=increases.get(m.index),
                                input_scale=tuple(scales.get(m.index, ())))
            for m in layers]


def _advance(model: Model, h: Tensor, reached: int, start: int) -> Tensor:
    """The residual stream entering block ``start`` from ``h`` entering block ``reached``, a
    few windows at a time."""
    for i in range(reached, start):
        block = model.block(i)
        h = torch.cat([block(hs) for hs in window_chunks(h, 16 * h.shape[1] * h.shape[2])])
    return h


@contextmanager
def _latent_alone(model: Model, i: int, width: int, scale: Sequence[float]) -> Iterator[None]:
    """``model`` with block ``i``'s attention swapped for its latent student of ``width``
    units (``latent_layer``) while the context lasts: one small module built per width, not a
    model."""
    arch, prefix, block = model.arch, f"blocks.{i}.attn.", model.block(i)
    layer = form_of(latent=True, rope_dim=0).layer_spec(arch.layers[i], width, arch.positional)
    student = _with_layer(arch, i, layer)
    state = block.attn.state_dict(prefix=prefix)
    latent_layer(state, student, i, {}, torch.tensor(scale[:arch.d_model]))
    attn = make_attention(student, layer, i)
    attn.load_state_dict({k.removeprefix(prefix): v for k, v in state.items()})
    teacher = block.attn
    block.attn = attn.to(next(teacher.parameters()).dtype).eval()
    try:
        yield
    finally:
        block.attn = teacher


def _with_layer(arch: ArchConfig, i: int, layer: LayerSpec) -> ArchConfig:
    """``arch`` with layer ``i`` replaced by ``layer``."""
    layers = list(arch.layers)
    layers[i] = layer
    return dataclasses.replace(arch, layers=tuple(layers))


def input_scale(inputs: Tensor) -> tuple[float, ...]:
    """The RMS of each feature of a layer's attention inputs (B, T, d [+ 1]) on the sample:
    the diagonal of their second moment, which weights the values' SVD (docs/theory.md
    §10.4)."""
    return tuple(float(v) for v in inputs.double().pow(2).mean(dim=(0, 1)).sqrt())


def _cut_alone(arch: ArchConfig, layer: int, group: int, **dims: int) -> ArchConfig:
    """``arch`` with group ``group`` of layer ``layer`` at ``dims`` (``qk_dim`` or ``v_dim``),
    everything else kept."""
    spec = arch.layers[layer]
    heads = tuple(dataclasses.replace(g, **dims) if k == group else g
                  for k, g in enumerate(spec.heads))
    return _with_layer(arch, layer, dataclasses.replace(spec, heads=heads))


