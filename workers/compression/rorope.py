"""Latent students with one shared RoPE key per head group, its positional part found by a
change of basis across the key heads within each RoPE frequency (RoRoPE, Meng et al., 2025,
"TransMLA: Multi-Head Latent Attention Is All You Need"; docs/theory.md §10.5).

RoPE turns every key head's pair ``f`` (dims ``f`` and ``f + qk/2``) by the same angle, so an
orthogonal mix ``U_f`` (kv x kv) of the key heads' pair-``f`` planes commutes with it: the query
of a head reading key head ``h`` sees the mixed planes through ``U_f[:, h]``. Taking ``U_f``'s
rows as the eigenvectors of the planes' second moment across heads (``C_f[h, h']``, both dims,
over the inputs) puts most of the pair's energy in a few mixed planes; those planes, over all
pairs, become one RoPE key shared by every query head of the group (cached once: ``rope_dim``
units), each query head reading it through its own scaled copy of its pair rows. What the kept
planes leave of each key head (the other mixed planes) joins the values in the latent,
unturned, which is what decodes from the cached latents as they are (absorbed). Keeping every
plane leaves nothing to the latent's keys: the student then computes its teacher exactly.

``rorope_student(teacher, planes, latent_dims, moments)``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from alloc.compression import CompressionError
from arch import ArchConfig, HeadGroup
from workers.compression.latent_students import latent_factors
from workers.models.attention import QKVLayout
from workers.models.model import Model, build_model

# (pair f, mixed plane e): plane e of pair f after the change of basis
Plane = tuple[int, int]


def plane_bases(keys: Tensor, inputs: Tensor | None) -> tuple[Tensor, Tensor]:
    """Per pair ``f`` the orthogonal change of basis across the key heads and the energy of
    each mixed plane, largest first: ``(bases (half, kv, kv), energies (half, kv))``, row ``e``
    of ``bases[f]`` the ``e``-th eigenvector of ``C_f[h, h'] = sum over pair f's two dims of
    W_h C W_h'^T`` (``keys``: (kv, qk, d) the key heads' rows; ``inputs``: the inputs' second
    moment C, (d, d); None: the identity)."""
    _, qk, d = keys.shape
    half = qk // 2
    c = torch.eye(d, dtype=torch.float64) if inputs is None else inputs.double()
    w = keys.double()
    bases, energies = [], []
    for f in range(half):
        rows = w[:, [f, f + half]]  # (kv, 2, d)
        moment = torch.einsum("hid,de,gie->hg", rows, c, rows)  # (kv, kv)
        values, vectors = torch.linalg.eigh(moment)
        bases.append(vectors.flip(-1).T)  # rows: eigenvectors, largest eigenvalue first
        energies.append(values.flip(-1).clamp_min(0.0))
    return torch.stack(bases), torch.stack(energies)


def strongest_planes(energies: Tensor, count: int) -> list[Plane]:
    """The ``count`` mixed planes of most energy over every pair (``energies``: (half, kv)),
    in pair order."""
    half, kv = energies.shape
    order = sorted(((float(energies[f, e]), f, e) for f in range(half) for e in range(kv)),
                   reverse=True)
    return sorted((f, e) for _, f, e in order[:count])


def rorope_arch(teacher: ArchConfig, rope_dims: Sequence[int], latent_dims: Sequence[int]
                ) -> ArchConfig:
    """``teacher`` with every mhsa layer latent with a shared RoPE key: layer ``i`` caches
    ``latent_dims[i]`` latent units and ``rope_dims[i]`` shared RoPE units per head group; each
    query head reads ``[RoPE part | its teacher's dims]`` (so its ``qk_dim`` grows by the
    RoPE part)."""
    layers = []
    for i, (layer, r, c) in enumerate(zip(teacher.layers, rope_dims, latent_dims)):
        if not layer.kind.to_latent or teacher.positional != "rope":
            raise CompressionError(f"layers[{i}]: a shared RoPE key is cut from a RoPE mhsa "
                                   f"layer (got {layer.attention}, {teacher.positional})")
        heads = tuple(HeadGroup(g.count, g.qk_dim + r, g.v_dim, g.kv_heads) for g in layer.heads)
        layers.append(dataclasses.replace(layer, attention="latent", heads=heads, latent_dim=c,
                                          rope_dim=r, rope_shared=True, rotate_latent=False))
    return dataclasses.replace(teacher, layers=tuple(layers))


def rorope_student(teacher: Model, rope_dims: Sequence[int], latent_dims: Sequence[int],
                   inputs: Mapping[int, Tensor] | None = None,
                   scales: Mapping[int, Sequence[float]] | None = None,
                   balance: bool = False) -> Model:
    """The student of ``rorope_arch``: per layer the ``rope_dims[i] / 2`` strongest mixed
    planes (``plane_bases`` on the layer's input moment ``inputs[i]`` where given) as the
    shared RoPE key; the keys' remainder and the values replaced by their truncated SVD at
    ``latent_dims[i]`` units, weighted by ``scales[i]`` (the inputs' RMS per feature) where
    given, the keys first scaled to the values' norm with ``balance`` (TransMLA's balancing,
    so that the joint SVD does not spend the latent on whichever part is larger); queries,
    output maps and the rest copied."""
    arch = rorope_arch(teacher.arch, rope_dims, latent_dims)
    state = teacher.state_dict()
    for i in range(arch.n_layers):
        moment = None if inputs is None else inputs.get(i)
        if moment is not None:
            moment = moment[:arch.d_model, :arch.d_model]  # a bias's constant input left out
        scale = None if scales is None else torch.tensor(list(scales[i])[:arch.d_model])
        _rorope_layer(state, teacher.arch, arch, i, moment, scale, balance)
    student = build_model(arch)
    student.load_state_dict(state)
    return student.eval()


def _rorope_layer(state: dict[str, Tensor], teacher: ArchConfig, student: ArchConfig, i: int,
                  moment: Tensor | None, scale: Tensor | None, balance: bool) -> None:
    """Replace block ``i``'s fused ``qkv`` tensors in ``state`` by the shared-RoPE latent
    layer's (one head group after another)."""
    prefix, layer = f"blocks.{i}.attn.", student.layers[i]
    weight, bias = state.pop(prefix + "qkv.weight"), state.pop(prefix + "qkv.bias", None)
    layout = QKVLayout.of(teacher.layers[i])
    q_rows, k_rows, v_rows = layout.split(weight)
    biases = None if bias is None else layout.split(bias)
    parts: dict[str, list[Tensor]] = {k: [] for k in ("q", "rope", "rest", "q.b", "rope.b",
                                                       "rest.b")}
    for j, group in enumerate(teacher.layers[i].heads):
        freqs = state[prefix + f"inv_freq{j}"]  # (kv, qk / 2): one table for every head
        if not torch.equal(freqs, freqs[:1].expand_as(freqs)):
            raise CompressionError(f"layers[{i}]: its key heads turn at different "
                                   "frequencies; a shared RoPE key needs one table")
        keys = torch.stack(list(k_rows[j]))  # (kv, qk, d)
        bases, energies = plane_bases(keys, moment)
        planes = strongest_planes(energies, layer.rope_dim // 2)
        mix = _Mix(group.qk_dim, group.count // group.kv_heads, bases, planes,
                   math.sqrt((group.qk_dim + layer.rope_dim) / group.qk_dim))
        parts["q"].append(mix.queries(q_rows[j]))
        parts["rope"].append(mix.rope(keys))
        parts["rest"].append(mix.rest(keys).reshape(-1, keys.shape[-1]))
        if biases is not None:
            q_bias, k_bias, _ = biases
            k_b = torch.stack(list(k_bias[j]))[..., None]  # (kv, qk, 1): a bias as a column
            parts["q.b"].append(mix.queries([b[:, None] for b in q_bias[j]])[:, 0])
            parts["rope.b"].append(mix.rope(k_b)[:, 0])
            parts["rest.b"].append(mix.rest(k_b).reshape(-1))
        state[prefix + f"inv_freq{j}"] = freqs[:, [f for f, _ in planes]]
    # every group's keys' remainder, then every value row: the latent's rows (``up``'s order)
    rest = torch.cat(parts["rest"])
    # balanced against the teacher's key rows (the remainder alone may be ~0: every plane kept)
    ratio = float(v_rows.norm() / torch.cat([torch.cat(list(k)) for k in k_rows]).norm()
                  .clamp_min(1e-30)) if balance else 1.0
    up, down = latent_factors(torch.cat([rest * ratio, v_rows]), scale, layer.latent_dim)
    up[:rest.shape[0]] /= ratio  # the keys' rows back to their own scale
    tensors = {"q.weight": torch.cat(parts["q"]), "k_rope.weight": torch.cat(parts["rope"]),
               "down.weight": down, "up.weight": up}
    if biases is not None:
        tensors |= {"q.bias": torch.cat(parts["q.b"]), "k_rope.bias": torch.cat(parts["rope.b"]),
                    "up.bias": torch.cat([*parts["rest.b"], biases[2]])}
    state.update({prefix + k: v.to(weight.dtype) for k, v in tensors.items()})


@dataclasses.dataclass(frozen=True)
class _Mix:
    """One head group's change of basis: the kept mixed ``planes`` of ``bases`` (half, kv, kv)
    as the shared RoPE key, each query head's reading of it, and the keys' remainder."""

    qk: int
    share: int  # query heads per key/value head
    bases: Tensor
    planes: list[Plane]
    q_scale: float  # keeps the teacher's logit scale, 1 / sqrt(qk), at the wider head

    def rope(self, keys: Tensor) -> Tensor:
        """The shared RoPE key's rows in rotate-half form (first dims, then second dims):
        mixed plane ``(f, e)`` is ``sum_h bases[f, e, h] keys[h, f]`` (and ``f + qk/2``)."""
        half = self.qk // 2
        first = [torch.einsum("h,hd->d", self.bases[f, e].to(keys), keys[:, f])
                 for f, e in self.planes]
        second = [torch.einsum("h,hd->d", self.bases[f, e].to(keys), keys[:, f + half])
                  for f, e in self.planes]
        return torch.stack(first + second)

    def rest(self, keys: Tensor) -> Tensor:
        """Each key head's rows less the kept mixed planes' share of them (kv, qk, d): what the
        latent carries, unturned."""
        half, out = self.qk // 2, keys.clone()
        rope = self.rope(keys)
        n = len(self.planes)
        for p, (f, e) in enumerate(self.planes):
            weights = self.bases[f, e].to(keys)  # (kv,)
            out[:, f] -= weights[:, None] * rope[p]
            out[:, f + half] -= weights[:, None] * rope[n + p]
        return out

    def queries(self, heads: Sequence[Tensor]) -> Tensor:
        """Every query head's rows ``[its reading of the RoPE key | its teacher rows]``, scaled
        to keep the teacher's logit scale (``heads``: each (qk, d), query head ``q`` reading
        key head ``q // share``)."""
        half, rows = self.qk // 2, []
        for q, head in enumerate(heads):
            h = q // self.share
            first = [self.bases[f, e, h].to(head) * head[f] for f, e in self.planes]
            second = [self.bases[f, e, h].to(head) * head[f + half] for f, e in self.planes]
            rows.append(torch.cat([torch.stack(first + second), head]) * self.q_scale
                        if self.planes else head * self.q_scale)
        return torch.cat(rows)
