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
from arch import ArchConfig, kinds_text
from workers.compression.student_inputs import InputScales, LatentFits, PairOrders
from workers.models.attention import QKVLayout
from workers.models.model import Model, build_model


def latent_arch(teacher: ArchConfig, latent_dims: Sequence[int], rope_dim: int,
                rotate_latent: bool = False) -> ArchConfig:
    """``teacher`` with every layer latent: layer ``i`` caches ``latent_dims[i]`` latent units
    and ``rope_dim`` RoPE dims per key/value head (its heads, MLP and the rest unchanged)."""
    if len(latent_dims) != teacher.n_layers:
        raise CompressionError(f"latent_dims: {len(latent_dims)} values for "
                          f"{teacher.n_layers} layers")
    for i, layer in enumerate(teacher.layers):
        if not layer.kind.to_latent:
            sources = kinds_text(lambda t: t.to_latent)
            raise CompressionError(f"layers[{i}].attention = {layer.attention!r}: a latent "
                                   f"student is cut from {sources} layers")
    layers = tuple(dataclasses.replace(layer, attention="latent", latent_dim=c,
                                       rope_dim=rope_dim, rotate_latent=rotate_latent)
                   for layer, c in zip(teacher.layers, latent_dims))
    return dataclasses.replace(teacher, layers=layers)


def latent_student(teacher: Model, student_arch: ArchConfig, orders: PairOrders | None = None,
                   scales: InputScales | None = None, fits: LatentFits | None = None) -> Model:
    """The student of ``student_arch`` (``latent_arch`` of the teacher's): RoPE parts from the
    leading pairs of ``orders`` (else pairs 0, 1, ..., the fastest turning), the latent from
    ``fits`` where given, else the SVD weighted by ``scales`` (else unweighted)."""
    student = build_model(student_arch)
    state = teacher.state_dict()
    for i in range(student_arch.n_layers):
        scale = None if scales is None else torch.tensor(scales[i][:student_arch.d_model])
        latent_layer(state, student_arch, i, orders or {}, scale, (fits or {}).get(i))
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


def curvature_factors(rows: Tensor, inputs: Tensor, grads: Tensor, rank: int
                      ) -> tuple[Tensor, Tensor]:
    """``(up, down)`` with ``up @ down`` the rank-``rank`` approximation of ``rows`` (n, d)
    that raises the loss least to second order (docs/theory.md §10.6): the truncated SVD of
    ``G^(1/2) rows C^(1/2)``, ``C`` (d, d) the second moment of the inputs and ``G`` (n, n)
    that of the loss gradient at the rows' outputs (``workers.compression.curvature``), mapped
    back. Its squared singular values beyond ``rank``, halved, are the loss increase it predicts
    (``curvature_spectrum``)."""
    u, s, vh, root_c, inv_root_g = _curvature_svd(rows, inputs, grads)
    k = min(rank, s.shape[0])
    up = torch.zeros(rows.shape[0], rank, dtype=torch.float64)
    down = torch.zeros(rank, rows.shape[1], dtype=torch.float64)
    up[:, :k] = inv_root_g @ (u[:, :k] * s[:k])
    # down = V^T L^-1 (L lower triangular): down^T solves L^T down^T = V
    down[:k] = torch.linalg.solve_triangular(root_c.T, vh[:k].T, upper=True).T
    return up.to(rows.dtype), down.to(rows.dtype)


def curvature_spectrum(rows: Tensor, inputs: Tensor, grads: Tensor) -> Tensor:
    """The singular values of ``G^(1/2) rows C^(1/2)`` (``curvature_factors``), descending."""
    return _curvature_svd(rows, inputs, grads)[1]


def _curvature_svd(rows: Tensor, inputs: Tensor, grads: Tensor
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``U S V^T = G^(1/2) rows L`` with ``L L^T = C`` (Cholesky; a ridge of 1e-6 of C's mean
    diagonal keeps it definite) and ``G^(1/2)``'s inverse (eigenvalues below 1e-8 of the
    largest raised to it: directions the loss does not see are kept, not amplified)."""
    c = inputs.double()
    c = c + 1e-6 * c.diagonal().mean().clamp_min(1e-30) * torch.eye(c.shape[0], dtype=c.dtype)
    root_c = torch.linalg.cholesky(c)
    values, vectors = torch.linalg.eigh(grads.double())
    values = values.clamp_min(float(values.max().clamp_min(1e-30)) * 1e-8)
    root_g = (vectors * values.sqrt()) @ vectors.T
    inv_root_g = (vectors / values.sqrt()) @ vectors.T
    u, s, vh = torch.linalg.svd(root_g @ rows.double() @ root_c, full_matrices=False)
    return u, s, vh, root_c, inv_root_g


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


def latent_rows(weight: Tensor, student: ArchConfig, i: int, orders: PairOrders
                ) -> tuple[Tensor, Tensor]:
    """The rows of layer ``i``'s fused ``qkv`` ``weight`` that its latent replaces (every key
    head's latent part, then every value row, as ``latent_layer`` stacks them) and, for each,
    its index among the teacher's key and value outputs (keys first:
    ``workers.compression.curvature``'s order)."""
    layer = student.layers[i]
    layout, splits = QKVLayout.of(layer), pair_splits(student, i, orders)
    _, _, rest, values = gather(layout, splits, weight)
    _, _, rest_at, values_at = gather(layout, splits, torch.arange(weight.shape[0]))
    return torch.cat([rest, values]), torch.cat([rest_at, values_at]) - layout.widths[0]


def curvature_fit(weight: Tensor, student: ArchConfig, i: int, orders: PairOrders,
                  inputs: Tensor, grads: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Layer ``i``'s latent maps at its full rank, ``(up, down)``, fitted to second order
    (``curvature_factors``: ``inputs`` and ``grads`` are its ``workers.compression.curvature``
    moments), and the singular values that price each width (docs/theory.md §10.6)."""
    rows, at = latent_rows(weight, student, i, orders)
    sub = grads[at][:, at]
    spectrum = curvature_spectrum(rows, inputs, sub)
    up, down = curvature_factors(rows, inputs, sub, len(spectrum))
    return up.float(), down.float(), spectrum


def latent_layer(state: dict[str, Tensor], student: ArchConfig, i: int, orders: PairOrders,
                 scale: Tensor | None, fit: tuple[Tensor, Tensor] | None = None) -> None:
    """Replace block ``i``'s ``mhsa`` tensors in ``state`` by the latent layer's of
    ``student``: query rows reordered, RoPE key rows, ``down``/``up`` from ``fit`` (its leading
    ``latent_dim``) or else ``latent_factors``, and the kept (and, turned, the left) pairs'
    frequencies; the output map stays."""
    layer, prefix = student.layers[i], f"blocks.{i}.attn."
    layout, splits = QKVLayout.of(layer), pair_splits(student, i, orders)
    q, rope, rest, values = gather(layout, splits, state.pop(prefix + "qkv.weight"))
    if fit is None:
        up, down = latent_factors(torch.cat([rest, values]), scale, layer.latent_dim)
    else:
        up, down = _widened(fit, layer.latent_dim)
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



def _widened(fit: tuple[Tensor, Tensor], width: int) -> tuple[Tensor, Tensor]:
    """A fit's leading ``width`` latent units; zeros beyond its rank (exact there)."""
    up, down = fit
    k = min(width, up.shape[1])
    wide_up, wide_down = up.new_zeros(up.shape[0], width), down.new_zeros(width, down.shape[1])
    wide_up[:, :k], wide_down[:k] = up[:, :k], down[:k]
    return wide_up, wide_down
