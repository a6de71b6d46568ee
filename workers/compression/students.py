"""Students of a trained model: the same model with some head groups' ``qk_dim`` or ``v_dim``
cut (docs/theory.md §10): each head's query and key maps from the truncated SVD of its
``W_Q,h W_K,h^T`` (Eckart-Young), or for RoPE heads the leading frequency pairs of its
key/value head in the plan's ranking (§10.2), with their frequencies; each key/value head's
value map and the output maps of the query heads reading it from the truncated SVD of their
product, scaled by the sample's input RMS (§10.4); everything else copied.
``build_student(teacher, student_arch, pair_orders(plan), input_scales(plan))``."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

import torch
from torch import Tensor, nn

from alloc.compression import CompressionError, CompressionPlan
from arch import ArchConfig, LayerSpec, kinds_text
from workers.checkpoints.stream import StreamedFolder
from workers.compression.heads import HeadMap, layer_maps
from workers.compression.latent_students import latent_layer
from workers.compression.student_inputs import InputScales, LatentFits, PairOrders
from workers.models.attention import QKVLayout
from workers.models.model import Model, build_model


def svd_factors(a: Tensor, b: Tensor, rank: int) -> tuple[Tensor, Tensor]:
    """Rank-``rank`` maps ``(A', B')`` with ``A' B'^T / sqrt(rank)`` the best rank-``rank``
    approximation of ``M = A B^T / sqrt(qk)`` (``A, B``: (d, qk)): ``A' = U_r S_r^(1/2) r^(1/4)``
    and ``B' = V_r S_r^(1/2) r^(1/4)`` (the student divides its logits by ``sqrt(rank)``)."""
    m = a @ b.T / math.sqrt(a.shape[1])
    u, s, vh = torch.linalg.svd(m)
    root = s[:rank].sqrt() * rank ** 0.25
    return u[:, :rank] * root, vh[:rank].T * root


def value_factors(values: Tensor, outputs: Sequence[Tensor], scale: Tensor | None, rank: int
                  ) -> tuple[Tensor, Tensor]:
    """``(E, F)``, ``E`` (rank, v) and ``F`` (v, rank), so that a key/value head's value rows
    ``E V`` (and bias ``E b``) and each reading query head's output columns ``O_h F`` keep
    what ``sum_h O_h V x`` carries of the inputs best: ``C F E Y`` is the rank-``rank``
    truncated SVD of ``C Y`` (Eckart-Young), ``C`` the outputs stacked (g d_out, v) and ``Y =
    V diag(scale)`` the value rows (v, d [+ 1]; a bias as the last column) weighted by the
    inputs' RMS per feature (none: 1), the diagonal of their second moment. At ``rank = v``,
    ``F E = I``: the teacher exactly. Computed on the (v, v) core of the two QR factors, never
    on the (g d_out, d) product."""
    c = torch.cat(list(outputs)).double()
    y = values.double() * (1.0 if scale is None else scale.double())
    rc = torch.linalg.qr(c).R  # C = Q_c R_c
    ry = torch.linalg.qr(y.T).R  # Y^T = Q_y R_y
    u, s, wh = torch.linalg.svd(rc @ ry.T)  # C Y = Q_c (R_c R_y^T) Q_y^T
    root = s[:rank].sqrt()
    f = torch.linalg.pinv(rc) @ (u[:, :rank] * root)
    e = (root[:, None] * wh[:rank]) @ torch.linalg.pinv(ry.T)
    return e.to(values.dtype), f.to(values.dtype)


class RankedHead(Protocol):
    """A head as measured or planned: its group, index and RoPE pair ranking (may be empty)."""

    @property
    def group(self) -> int: ...

    @property
    def head(self) -> int: ...

    @property
    def pairs(self) -> tuple[int, ...]: ...


def rankings(arch: ArchConfig, heads: Iterable[tuple[int, RankedHead]]
             ) -> dict[tuple[int, int, int], tuple[int, ...]]:
    """Each RoPE key/value head's pair ranking from ``(layer, head)`` entries (every query head
    of a key/value head carries its ranking; empty without RoPE)."""
    out: dict[tuple[int, int, int], tuple[int, ...]] = {}
    for i, h in heads:
        if h.pairs:
            kv = QKVLayout.of(arch.layers[i]).kv_head(h.group, h.head)
            out[(i, h.group, kv)] = h.pairs
    return out


def pair_orders(plan: CompressionPlan) -> dict[tuple[int, int, int], tuple[int, ...]]:
    """The plan's ranking of each RoPE key/value head's frequency pairs (empty without RoPE)."""
    return rankings(plan.student, ((layer.index, s) for layer in plan.layers
                                   for s in layer.spectra))


def build_student(teacher: Model, student_arch: ArchConfig,
                  pairs: PairOrders | None = None, scales: InputScales | None = None,
                  fits: LatentFits | None = None) -> Model:
    """The student: ``teacher``'s weights with every head's query/key maps cut to the student's
    ``qk_dim`` (at the teacher's, an exact copy): the truncated SVD of each head's
    ``W_Q,h W_K,h^T``, or for RoPE heads the leading frequency pairs of ``pairs`` (the plan's
    ranking) with their frequencies; and each key/value head's values cut to the student's
    ``v_dim`` by ``value_factors``, weighted by ``scales`` (the plan's input RMS); latent layers
    from ``fits`` where the plan fitted them (``latent_layer``)."""
    student = build_model(student_arch)
    state = teacher.state_dict()
    for i in range(student_arch.n_layers):
        cut_layer(state, teacher.arch, student_arch, i, pairs, scales, teacher.block(i).attn,
                  fits)
    student.load_state_dict(state)
    return student.eval()


def streamed_student(teacher: StreamedFolder, student_arch: ArchConfig,
                     pairs: PairOrders | None = None, scales: InputScales | None = None,
                     fits: LatentFits | None = None) -> Iterator[dict[str, Tensor]]:
    """``build_student``'s tensors one part at a time, the teacher read one block at a time:
    first the embedding, final norm and head (each a part, as stored), then each block's
    tensors (a block's weights are the only ones held at once)."""
    arch = teacher.arch
    stock = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
             "head.weight": "lm_head.weight"}
    if arch.tie_embeddings:
        del stock["head.weight"]
    shapes = {k: tuple(v.shape) for k, v in teacher.model.state_dict().items()}  # meta: sizes
    for ours, theirs in stock.items():  # copied as stored: no arithmetic, no float32 copy
        yield {ours: teacher.tensors.get(theirs, shapes[ours], dtype=None)}
    for i in range(arch.n_layers):
        with teacher.block(i) as block:
            # the state dict's tensors keep the block's weights alive after it goes to meta;
            # the attention's in float32 for the cut's arithmetic, the rest as stored
            state = {f"blocks.{i}.{k}": v for k, v in block.state_dict().items()}
            state.update({f"blocks.{i}.attn.{k}": v.float()
                          for k, v in block.attn.state_dict().items()})
            cut_layer(state, arch, student_arch, i, pairs, scales, block.attn, fits)
        yield state


def cut_layer(state: dict[str, Tensor], teacher: ArchConfig, student: ArchConfig, i: int,
              pairs: PairOrders | None, scales: InputScales | None, attn: nn.Module,
              fits: LatentFits | None = None) -> None:
    """Replace layer ``i``'s tensors in ``state`` (a state dict holding at least that block's)
    by the student's: keys by the SVD of the head maps of ``attn`` (the teacher's attention
    module of the layer) or the RoPE pair ranking, values by ``value_factors``; or, where the
    student's layer is latent, by its latent layer's (``latent_layer``)."""
    old, new = teacher.layers[i], student.layers[i]
    if old.kind.single_width or new == old:  # nothing cut: the teacher's rows
        return
    if new.kind.latent:
        scale = None if scales is None or i not in scales else torch.tensor(
            scales[i][:teacher.d_model])
        latent_layer(state, student, i, pairs or {}, scale, (fits or {}).get(i))
        return
    name = "qk" if old.kind.frozen_qk else "qkv"  # frozen query/key maps are held apart
    if [g.qk_dim for g in new.heads] != [g.qk_dim for g in old.heads]:
        if teacher.positional == "rope":
            state.update(_pair_rows(state, i, name, old, new, pairs or {}))
        else:
            state.update(_svd_rows(state, i, name, old, new, layer_maps(attn, i),
                                   teacher.bias or teacher.qkv_bias))
    if [g.v_dim for g in new.heads] != [g.v_dim for g in old.heads]:
        scale = None if scales is None or i not in scales else torch.tensor(scales[i])
        state.update(_value_rows(state, i, old, new, scale))


def _value_rows(state: dict[str, Tensor], i: int, old: LayerSpec, new: LayerSpec,
                scale: Tensor | None) -> dict[str, Tensor]:
    """Layer ``i``'s value rows (the last block of its fused ``qkv``, query and key rows
    already the student's) and output columns cut to the student's ``v_dim`` per group."""
    if not old.kind.cut_values:
        raise CompressionError(f"layer {i} ({old.attention}): only "
                               f"{kinds_text(lambda t: t.cut_values)} layers' "
                               "values are cut")
    prefix = f"blocks.{i}.attn."
    weight, bias = state[prefix + "qkv.weight"], state.get(prefix + "qkv.bias")
    v_width = QKVLayout.of(old).widths[2]
    qk_rows = weight.shape[0] - v_width
    # (v rows, d [+ 1]): the value rows with their bias as the last column
    values = weight[qk_rows:] if bias is None else torch.cat([weight[qk_rows:],
                                                              bias[qk_rows:, None]], dim=1)
    out = state[prefix + "out.weight"]  # (d, width): query heads' columns, group after group
    new_values, new_out, v_start, o_start = [], [], 0, 0
    for g_old, g_new in zip(old.heads, new.heads):
        share = g_old.count // g_old.kv_heads
        for kv in range(g_old.kv_heads):
            rows = values[v_start + kv * g_old.v_dim: v_start + (kv + 1) * g_old.v_dim]
            readers = [out[:, o_start + h * g_old.v_dim: o_start + (h + 1) * g_old.v_dim]
                       for h in range(kv * share, (kv + 1) * share)]
            if g_new.v_dim == g_old.v_dim:
                new_values.append(rows)
                new_out += readers
                continue
            e, f = value_factors(rows, readers, scale, g_new.v_dim)
            new_values.append(e @ rows)
            new_out += [o @ f for o in readers]
        v_start, o_start = v_start + g_old.kv_heads * g_old.v_dim, o_start + g_old.width
    cut = torch.cat(new_values)
    rows_out = {prefix + "qkv.weight": torch.cat([weight[:qk_rows], cut[:, :weight.shape[1]]]),
                prefix + "out.weight": torch.cat(new_out, dim=1)}
    if bias is not None:
        rows_out[prefix + "qkv.bias"] = torch.cat([bias[:qk_rows], cut[:, -1]])
    return rows_out


def _svd_rows(state: dict[str, Tensor], i: int, name: str, old: LayerSpec, new: LayerSpec,
              maps: list[HeadMap], bias: bool) -> dict[str, Tensor]:
    """The student's query/key (and value) rows of layer ``i`` (``old`` in the teacher,
    ``new`` in the student) from the teacher's head maps."""
    if any(g.grouped for g in new.heads):
        raise CompressionError(f"layer {i} heads {new.heads_str}: grouped key/value heads "
                               "without RoPE share a key map that each query head's SVD would "
                               "cut differently; this is not implemented")
    layout = QKVLayout.of(old)
    key = f"blocks.{i}.attn.{name}."
    old_w = state[key + "weight"]
    queries, keys = [], []
    for m, rank in zip(maps, [g.qk_dim for g in new.heads for _ in range(g.count)]):
        a, b = svd_factors(torch.from_numpy(m.a), torch.from_numpy(m.b), rank)
        queries.append(a.T.to(old_w.dtype))  # (rank, d [+ 1])
        keys.append(b.T.to(old_w.dtype))
    values = layout.split(old_w)[2]  # none for frozen_qk's qk map
    if not bias:
        return {key + "weight": layout.fuse(queries, keys, values)}
    # the last column of each factor is the bias
    return {key + "weight": layout.fuse([q[:, :-1] for q in queries],
                                        [k[:, :-1] for k in keys], values),
            key + "bias": layout.fuse([q[:, -1] for q in queries], [k[:, -1] for k in keys],
                                      layout.split(state[key + "bias"])[2])}


def _pair_rows(state: dict[str, Tensor], i: int, name: str, old: LayerSpec, new: LayerSpec,
               pairs: PairOrders) -> dict[str, Tensor]:
    """A RoPE layer's student rows and frequencies: per key/value head its leading pairs (dims
    ``p`` and ``p + qk/2`` of the teacher's head, in the teacher's order) for the key and for
    each query head reading it, the query scaled by ``sqrt(r / qk)`` so that the student's
    ``1 / sqrt(r)`` gives the teacher's logit terms exactly."""
    prefix = f"blocks.{i}.attn."
    out: dict[str, Tensor] = {}
    for suffix in ("weight", "bias"):
        if prefix + name + "." + suffix not in state:
            continue
        layout = QKVLayout.of(old)
        q_all, k_all, rest = layout.split(state[prefix + name + "." + suffix])
        queries, keys = [], []
        for j, (g_old, g_new) in enumerate(zip(old.heads, new.heads)):
            freqs = state[f"{prefix}inv_freq{j}"]
            kept_freqs = []
            for kv in range(g_old.kv_heads):
                index = _pair_index(pairs, (i, j, kv), g_old.qk_dim, g_new.qk_dim)
                scale = math.sqrt(g_new.qk_dim / g_old.qk_dim)
                queries += [q_all[j][h][index] * scale for h in layout.query_heads(j, kv)]
                keys.append(k_all[j][kv][index])
                kept_freqs.append(freqs[kv][index[: g_new.qk_dim // 2]])
            out[f"{prefix}inv_freq{j}"] = torch.stack(kept_freqs)
        out[prefix + name + "." + suffix] = layout.fuse(queries, keys, rest)
    return out


def _pair_index(pairs: PairOrders, key: tuple[int, int, int], qk: int, rank: int) -> Tensor:
    """Teacher dims of the ``rank / 2`` leading pairs: pairs ascending, then their partners."""
    if rank == qk:
        kept = list(range(qk // 2))
    elif key not in pairs:
        raise CompressionError(f"layer {key[0]} group {key[1]} key/value head {key[2]}: the "
                               "plan has no ranking of its RoPE pairs; profile the checkpoint "
                               "again")
    else:
        kept = sorted(pairs[key][: rank // 2])
    index = torch.tensor(kept)
    return torch.cat([index, index + qk // 2])
