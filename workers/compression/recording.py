"""Recording what a model's attention does on a sample: ``record_attention`` (every layer's
logits, reduced as they are computed, and each attention's input) for a whole model, and
``record_block`` for one decoder block on its residual stream (the layer-by-layer measurement
of ``workers.compression.measure``, which may stream the blocks from disk). Both run a few windows
at a time (``workers.chunks``) so that no sample holds every head's ``T x T`` map."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from arch import LayerSpec
from workers.chunks import CHUNK_BYTES, window_chunks
from workers.models.attention import LogitRecorder
from workers.models.model import Block, Model


@dataclass(frozen=True)
class AttentionRecord:
    """Per layer: per head group, what ``record_attention``'s ``reduce`` made of its logits (by
    default ``head_statistics``: each head's logit bound and mean normalised entropy); the
    attention's input ``(B, T, d [+ 1])`` (the constant 1 appended when the model has biases)
    and its largest norm."""

    groups: list[list[Any]]
    inputs: list[Tensor]
    norms: list[float]
    causal: bool = True


@torch.no_grad()
def record_attention(model: Model, x: Tensor,
                     reduce: Callable[[Tensor], Any] | None = None) -> AttentionRecord:
    """Run ``model`` on ids or vectors ``x`` recording each head group's logits
    ``(B, H, T, T)`` (future entries -inf) reduced by ``reduce`` as they are computed, and each
    attention's input ``(B, T, d [+ 1])``.

    By default the reduction is ``head_statistics``, and the sample runs a few windows at a time
    (at most ``CHUNK_BYTES`` of logits and their softmax), the chunks' statistics combined:
    a long sample never holds every head's ``T x T`` map. A custom ``reduce`` (``lambda z: z``
    keeps the logits whole) sees the whole sample in one pass."""
    if reduce is not None:
        return _record_pass(model, x, reduce)
    t = x.shape[1]
    heads = max(g.count for layer in model.arch.layers for g in layer.heads)
    chunks = window_chunks(x, 3 * 8 * heads * t * t)  # logits, two float64 copies of softmax
    parts = [_record_pass(model, chunk, head_statistics) for chunk in chunks]
    weights = [len(chunk) for chunk in chunks]
    groups = [[_combine_stats([part.groups[i][j] for part in parts], weights)
               for j in range(len(parts[0].groups[i]))] for i in range(len(parts[0].groups))]
    inputs = [torch.cat([part.inputs[i] for part in parts]) for i in range(len(parts[0].inputs))]
    return AttentionRecord(groups, inputs, [max(part.norms[i] for part in parts)
                                     for i in range(len(inputs))], model.arch.causal)


def _combine_stats(stats: list[tuple[np.ndarray, np.ndarray]], windows: list[int]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Per head: the largest logit bound over chunks, and the mean entropy weighted by each
    chunk's windows (every window of one length has the same rows)."""
    bounds = np.max([b for b, _ in stats], axis=0)
    entropy = np.average([e for _, e in stats], axis=0, weights=windows)
    return bounds, entropy


def _record_pass(model: Model, x: Tensor, reduce: Callable[[Tensor], Any]) -> AttentionRecord:
    """One forward of ``model`` on ``x`` with the recording attention (see
    ``record_attention``)."""
    recorder = LogitRecorder(reduce)
    inputs: list[Tensor] = []
    blocks = [model.block(i) for i in range(model.arch.n_layers)]
    own = [block.attn.attention_fn for block in blocks]
    hooks = [block.attn_norm.register_forward_hook(lambda _m, _i, out: inputs.append(out))
             for block in blocks]
    try:  # the model's own modules, recording attention for this pass (no second copy)
        for block in blocks:
            block.attn.attention_fn = recorder
        model.hidden(x)  # the output logits are not needed
    finally:
        for block, attention_fn in zip(blocks, own):
            block.attn.attention_fn = attention_fn
        for hook in hooks:
            hook.remove()
    # Layers without queries and keys (MixiT) compute no logits: every other layer calls
    # attention_fn once per head group.
    counts = [len(layer.heads) if layer.kind.queries_keys else 0 for layer in model.arch.layers]
    groups, cursor = [], 0
    for count in counts:
        groups.append(recorder.logits[cursor:cursor + count])
        cursor += count
    if model.arch.bias or model.arch.qkv_bias:
        inputs = [torch.cat([x, x.new_ones(*x.shape[:-1], 1)], -1) for x in inputs]
    return AttentionRecord(groups, inputs, [float(x.double().norm(dim=-1).max()) for x in inputs],
                    model.arch.causal)


def head_statistics(logits: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per head: the largest |logit| over allowed pairs, and the mean over rows (with at least
    two keys) of the attention entropy over ``ln N_row``. ``logits``: (B, H, T, T), taken a
    few heads at a time: each step's maps (a few float32 copies of its logits) are at most an
    eighth of ``CHUNK_BYTES``, a fraction of the logits themselves."""
    heads = logits.shape[1]
    step = max(1, heads * (CHUNK_BYTES // 8) // max(1, 4 * logits.numel()))
    parts = [_statistics(logits[:, h:h + step]) for h in range(0, heads, step)]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _statistics(logits: Tensor) -> tuple[np.ndarray, np.ndarray]:
    allowed = torch.isfinite(logits)
    bound = logits.masked_fill(~allowed, 0).abs().amax(dim=(0, 2, 3))
    # -sum p log p from log p (max-shifted by log_softmax: no cancellation, so float32 reads
    # the entropy to ~1e-6 of ln N); hidden keys have p = 0 and add nothing
    log_p = torch.log_softmax(logits.float(), dim=-1).masked_fill_(~allowed, 0.0)
    entropy = -(log_p.exp() * log_p).sum(-1).double()  # (B, H, T)
    keys = allowed.sum(-1).double()  # (B?, H?, T)
    rows = keys >= 2
    normalised = torch.where(rows, entropy / keys.clamp_min(2).log(), torch.zeros(()))
    mean = normalised.sum(dim=(0, 2)) / rows.sum(dim=(0, 2)).clamp_min(1)
    return bound.numpy(), mean.numpy()


@dataclass(frozen=True)
class BlockRecord:
    """One block on a sample: per head group each head's logit bound and mean normalised
    entropy (``head_statistics``), the attention's input ``(B, T, d [+ 1])``, its largest
    norm, and the block's output ``(B, T, d)`` (the next block's residual stream)."""

    groups: list[tuple[np.ndarray, np.ndarray]]
    inputs: Tensor
    norm: float
    out: Tensor


@torch.no_grad()
def record_block(block: Block, layer: LayerSpec, h: Tensor, bias: bool,
                 statistics: bool = True) -> BlockRecord:
    """Run ``block`` (of ``layer``) on its residual stream ``h`` (B, T, d) a few windows at a
    time, recording its attention like ``record_attention`` does (``bias``: append the
    constant 1 to the inputs, as the head maps fold biases in); ``statistics=False``: the
    block's own attention runs and ``groups`` is empty (the caller measures the heads)."""
    t, d = h.shape[1], h.shape[-1]
    heads = max(g.count for g in layer.heads)
    parts = []
    # the attention's inputs (the constant 1 appended with biases) and the block's outputs,
    # written a chunk at a time into their places: no list of chunks and a second copy
    x = h.new_ones(*h.shape[:-1], d + 1) if bias else torch.empty_like(h)
    out = torch.empty_like(h)
    rows = slice(0, 0)
    own = block.attn.attention_fn
    hook = block.attn_norm.register_forward_hook(
        lambda _m, _i, normed: x[rows, :, :d].copy_(normed))
    try:
        # per window: its logits and two float64 copies, or (the block's own attention
        # forms no map) its activations: a few float32 copies of an MLP's hidden rows
        per_window = 3 * 8 * heads * t * t if statistics else 4 * 16 * t * d
        for chunk in window_chunks(h, per_window):
            rows = slice(rows.stop, rows.stop + len(chunk))
            if statistics:
                recorder = LogitRecorder(head_statistics)
                block.attn.attention_fn = recorder
            out[rows] = block(chunk)
            if statistics:
                parts.append((recorder.logits, len(chunk)))
    finally:
        block.attn.attention_fn = own
        hook.remove()
    windows = [n for _, n in parts]
    groups = [_combine_stats([part[j] for part, _ in parts], windows)
              for j in range(len(parts[0][0]) if parts else 0)]
    return BlockRecord(groups, x, largest_norm(x), out)


def largest_norm(x: Tensor) -> float:
    """The largest norm of ``x``'s rows (B, T, d), summed in float64 a window at a time (a
    float64 copy of a long sample would be twice its size)."""
    return max(float(w.double().norm(dim=-1).max()) for w in x)
