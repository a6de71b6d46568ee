"""Latent students: an ``mhsa`` teacher's layers rewritten as ``latent`` layers (docs/theory.md
§10.5): each key/value head keeps some RoPE frequency pairs as its RoPE part (the leading ones of
a ranking), the rest of its key rows and every value row are stacked and replaced by the
truncated SVD of the stack, weighted by the sample's input RMS per feature (activation-aware,
as ASVD), whose right factor is the layer's ``down`` map and left factor its ``up`` map. The
queries' rows are reordered to match; the output map and everything outside attention are
copied. At full rank the student computes what its teacher computes.
``latent_student(teacher, latent_arch(teacher.arch, dims, rope_dim), orders, scales)``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from alloc.compression import CompressionError
from arch import ArchConfig
from workers.attention import QKVLayout
from workers.model import Model, build_model
from workers.students import InputScales, PairOrders


def latent_arch(teacher: ArchConfig, latent_dims: Sequence[int], rope_dim: int,
                rotate_latent: bool = False) -> ArchConfig:
    """``teacher`` with every layer latent: layer ``i`` caches ``latent_dims[i]`` latent units
    and ``rope_dim`` RoPE dims per key/value head (its heads, MLP and the rest unchanged)."""
    if len(latent_dims) != teacher.n_layers:
        raise CompressionError(f"latent_dims: {len(latent_dims)} values for "
                          f"{teacher.n_layers} layers")
    for i, layer in enumerate(teacher.layers):
        if layer.attention != "mhsa":
            raise CompressionError(f"layers[{i}].attention = {layer.attention!r}: a latent "
                              "student is cut from mhsa layers")
    layers = tuple(dataclasses.replace(layer, attention="latent", latent_dim=c,
                                       rope_dim=rope_dim, rotate_latent=rotate_latent)
                   for layer, c in zip(teacher.layers, latent_dims))
    return dataclasses.replace(teacher, layers=layers)


def latent_student(teacher: Model, student_arch: ArchConfig, orders: PairOrders | None = None,
                   scales: InputScales | None = None) -> Model:
    """The student of ``student_arch`` (``latent_arch`` of the teacher's): RoPE parts from the
    leading pairs of ``orders`` (else pairs 0, 1, ..., the fastest turning), the latent from
    the SVD weighted by ``scales`` (else unweighted)."""
    student = build_model(student_arch)
    state = teacher.state_dict()
    for i in range(student_arch.n_layers):
        scale = None if scales is None else torch.tensor(scales[i][:student_arch.d_model])
        latent_layer(state, student_arch, i, orders or {}, scale)
    student.load_state_dict(state)
    return student.eval()


class PairSplit(NamedTuple):
    """A RoPE key/value head split: the rows of its RoPE part and of its latent part (each in
    rotate-half form), the pairs kept as its RoPE part and those left to the latent."""

    rope_rows: list[int]
    latent_rows: list[int]
    kept: list[int]
    left: list[int]


def split_pairs(qk: int, kept: Sequence[int]) -> PairSplit:
    """A head of ``qk`` dims (pair ``i`` = dims ``i, i + qk/2``) keeping the pairs ``kept``
    (in their order); the others, ascending, go to the latent."""
    half, chosen = qk // 2, list(kept)
    if not chosen:  # no RoPE part: every dim to the latent, in order (qk may be odd)
        return PairSplit([], list(range(qk)), [], list(range(half)))
    left = [i for i in range(half) if i not in set(chosen)]
    return PairSplit(chosen + [i + half for i in chosen], left + [i + half for i in left],
                     chosen, left)


def latent_factors(rows: Tensor, scale: Tensor | None, rank: int) -> tuple[Tensor, Tensor]:
    """``(up, down)``, (n, rank) and (rank, d), with ``up @ down`` the best rank-``rank``
    approximation of ``rows`` (n, d) in the norm weighted by ``scale`` (d; the inputs' RMS per
    feature): the truncated SVD of ``rows diag(scale)``, unweighted after. A rank beyond
    ``min(n, d)`` pads with zeros, so at full rank ``up @ down = rows``."""
    weights = torch.ones(rows.shape[1], dtype=torch.float64) if scale is None else (
        scale.double().clamp_min(float(scale.max()) * 1e-6 + 1e-30))
    u, s, vh = torch.linalg.svd(rows.double() * weights, full_matrices=False)
    k = min(rank, s.shape[0])
    up = torch.zeros(rows.shape[0], rank, dtype=torch.float64)
    down = torch.zeros(rank, rows.shape[1], dtype=torch.float64)
    up[:, :k] = u[:, :k] * s[:k]
    down[:k] = vh[:k] / weights
    return up.to(rows.dtype), down.to(rows.dtype)


# (group, key/value head) -> how it splits
Splits = dict[tuple[int, int], PairSplit]


def pair_splits(student: ArchConfig, i: int, orders: PairOrders) -> Splits:
    """How layer ``i`` of ``student`` splits each key/value head: the leading
    ``rope_dim / 2`` pairs of its ranking in ``orders`` (else pairs 0, 1, ...) as its RoPE
    part, the rest to the latent."""
    layer = student.layers[i]
    splits: Splits = {}
    for j, g in enumerate(layer.heads):
        for h in range(g.kv_heads):
            ranking = list(orders.get((i, j, h), range(g.qk_dim // 2)))
            splits[(j, h)] = split_pairs(g.qk_dim, ranking[:layer.rope_dim // 2])
    return splits


def gather(layout: QKVLayout, splits: Splits, rows: Tensor
           ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """A fused ``qkv`` block's rows (weights (n, d) or biases (n,)) as the latent layer's:
    the query heads' rows reordered ``[RoPE part | latent part]``, the keys' RoPE parts, the
    keys' latent parts, and the value rows, each group after group, head after head."""
    queries, keys, values = layout.split(rows)
    q, rope, rest = [], [], []
    for (j, h), (rope_rows, latent_rows, _, _) in splits.items():
        rope.append(keys[j][h][rope_rows])
        rest.append(keys[j][h][latent_rows])
        q += [queries[j][head][rope_rows + latent_rows] for head in layout.query_heads(j, h)]
    return torch.cat(q), torch.cat(rope), torch.cat(rest), values


def latent_layer(state: dict[str, Tensor], student: ArchConfig, i: int, orders: PairOrders,
                 scale: Tensor | None) -> None:
    """Replace block ``i``'s ``mhsa`` tensors in ``state`` by the latent layer's of
    ``student``: query rows reordered, RoPE key rows, ``down``/``up`` from ``latent_factors``
    and the kept (and, turned, the left) pairs' frequencies; the output map stays."""
    layer, prefix = student.layers[i], f"blocks.{i}.attn."
    layout, splits = QKVLayout.of(layer), pair_splits(student, i, orders)
    q, rope, rest, values = gather(layout, splits, state.pop(prefix + "qkv.weight"))
    up, down = latent_factors(torch.cat([rest, values]), scale, layer.latent_dim)
    tensors = {"q.weight": q, "down.weight": down, "up.weight": up, "k_rope.weight": rope}
    bias = state.pop(prefix + "qkv.bias", None)
    if bias is not None:
        q_bias, rope_bias, rest_bias, v_bias = gather(layout, splits, bias)
        tensors |= {"q.bias": q_bias, "up.bias": torch.cat([rest_bias, v_bias]),
                    "k_rope.bias": rope_bias}
    if not layer.rope_dim:  # no RoPE part: no map for it
        tensors = {k: v for k, v in tensors.items() if not k.startswith("k_rope.")}
    for j in range(len(layer.heads)):
        freqs = state.get(prefix + f"inv_freq{j}")  # (kv_heads, qk_dim / 2) with RoPE
        if freqs is None:
            continue
        heads = [splits[(j, h)] for h in range(freqs.shape[0])]
        tensors[f"inv_freq{j}"] = torch.stack([f[s.kept] for f, s in zip(freqs, heads)])
        if layer.rotate_latent:
            tensors[f"inv_freq_latent{j}"] = torch.stack([f[s.left] for f, s in zip(freqs, heads)])
    state.update({prefix + k: v for k, v in tensors.items()})

