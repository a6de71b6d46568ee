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
from workers.compression.latent_students import (
    curvature_factors,
    curvature_spectrum,
    latent_factors,
)
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
                   balance: bool = False, grads: Mapping[int, Tensor] | None = None) -> Model:
    """The student of ``rorope_arch``: per layer the ``rope_dims[i] / 2`` strongest mixed
    planes (``plane_bases`` on the layer's input moment ``inputs[i]`` where given) as the
    shared RoPE key; the keys' remainder and the values replaced by their rank
    ``latent_dims[i]`` approximation: fitted to second order where ``grads[i]`` (the loss
    gradient's moment at the teacher's keys and values, ``workers.compression.curvature``)
    and ``inputs[i]`` are given (docs/theory.md §10.6: the remainder's error reaches the logits
    as an error of the teacher's keys would), else the truncated SVD weighted by ``scales[i]``
    (the inputs' RMS per feature), the keys first scaled to the values' norm with ``balance``
    (TransMLA's balancing); queries, output maps and the rest copied."""
    arch = rorope_arch(teacher.arch, rope_dims, latent_dims)
    state = teacher.state_dict()
    for i in range(arch.n_layers):
        moment = _moment(inputs, i, arch.d_model)
        rows = _layer_rows(state, teacher.arch, i, rope_dims[i], moment)
        c = latent_dims[i]
        if grads is not None and i in grads and moment is not None:
            up, down = curvature_factors(rows.latent, moment, grads[i], c)
        else:
            scale = None if scales is None else torch.tensor(list(scales[i])[:arch.d_model])
            keys = rows.rest.shape[0]
            ratio = rows.balance if balance else 1.0
            up, down = latent_factors(torch.cat([rows.rest * ratio, rows.values]), scale, c)
            up[:keys] /= ratio  # the keys' rows back to their own scale
        rows.write(state, f"blocks.{i}.attn.", up, down)
    student = build_model(arch)
    student.load_state_dict(state)
    return student.eval()


def rorope_spectra(teacher: Model, rope_dims: Sequence[int], inputs: Mapping[int, Tensor],
                   grads: Mapping[int, Tensor]) -> dict[int, Tensor]:
    """Per layer the singular values that price each latent width of its RoRoPE remainder and
    values to second order (``curvature_spectrum``; the loss increase of keeping ``c`` is half
    the sum of the squares beyond ``c``), for allocating the widths across layers."""
    state, spectra = teacher.state_dict(), {}
    for i in sorted(grads):
        moment = _moment(inputs, i, teacher.arch.d_model)
        assert moment is not None
        rows = _layer_rows(state, teacher.arch, i, rope_dims[i], moment)
        spectra[i] = curvature_spectrum(rows.latent, moment, grads[i])
    return spectra


def _moment(inputs: Mapping[int, Tensor] | None, i: int, d: int) -> Tensor | None:
    """Layer ``i``'s input moment (d, d), a bias's constant input left out; None if absent."""
    moment = None if inputs is None else inputs.get(i)
    return None if moment is None else moment[:d, :d]


@dataclasses.dataclass
class _LayerRows:
    """One layer's student rows before its latent is fitted: the queries, the shared RoPE
    keys, the keys' remainder (in the teacher's key order) and the values, their biases, and
    each group's kept frequencies."""

    q: Tensor
    rope: Tensor
    rest: Tensor
    values: Tensor
    freqs: list[Tensor]
    balance: float  # the values' norm over the teacher's keys' (TransMLA's balancing)
    biases: tuple[Tensor, Tensor, Tensor, Tensor] | None  # q, rope, rest, values

    @property
    def latent(self) -> Tensor:
        """The rows the latent replaces: every key's remainder, then every value row."""
        return torch.cat([self.rest, self.values])

    def write(self, state: dict[str, Tensor], prefix: str, up: Tensor, down: Tensor) -> None:
        """The layer's tensors into ``state`` in place of its fused ``qkv``."""
        dtype = state[prefix + "out.weight"].dtype
        tensors = {"q.weight": self.q, "k_rope.weight": self.rope, "down.weight": down,
                   "up.weight": up}
        if self.biases is not None:
            q_b, rope_b, rest_b, v_b = self.biases
            tensors |= {"q.bias": q_b, "k_rope.bias": rope_b,
                        "up.bias": torch.cat([rest_b, v_b])}
        state.pop(prefix + "qkv.weight", None)
        state.pop(prefix + "qkv.bias", None)
        state.update({prefix + k: v.to(dtype) for k, v in tensors.items()})
        # the kept pairs' frequencies as they were (float32), never in the weights' dtype
        state.update({prefix + f"inv_freq{j}": f for j, f in enumerate(self.freqs)})


def _layer_rows(state: Mapping[str, Tensor], teacher: ArchConfig, i: int, rope_dim: int,
                moment: Tensor | None) -> _LayerRows:
    """Block ``i``'s shared-RoPE rows from the teacher's fused ``qkv`` in ``state`` (one head
    group after another)."""
    prefix = f"blocks.{i}.attn."
    weight, bias = state[prefix + "qkv.weight"], state.get(prefix + "qkv.bias")
    layout = QKVLayout.of(teacher.layers[i])
    q_rows, k_rows, v_rows = layout.split(weight)
    split_bias = None if bias is None else layout.split(bias)
    parts: dict[str, list[Tensor]] = {k: [] for k in ("q", "rope", "rest", "q.b", "rope.b",
                                                       "rest.b", "freqs")}
    for j, group in enumerate(teacher.layers[i].heads):
        freqs = state[prefix + f"inv_freq{j}"]  # (kv, qk / 2): one table for every head
        if not torch.equal(freqs, freqs[:1].expand_as(freqs)):
            raise CompressionError(f"layers[{i}]: its key heads turn at different "
                                   "frequencies; a shared RoPE key needs one table")
        keys = torch.stack(list(k_rows[j]))  # (kv, qk, d)
        bases, energies = plane_bases(keys, moment)
        planes = strongest_planes(energies, rope_dim // 2)
        mix = _Mix(group.qk_dim, group.count // group.kv_heads, bases, planes,
                   math.sqrt((group.qk_dim + rope_dim) / group.qk_dim))
        parts["q"].append(mix.queries(q_rows[j]))
        rope = mix.rope(keys)
        parts["rope"].append(rope)
        parts["rest"].append(mix.rest(keys, rope).reshape(-1, keys.shape[-1]))
        parts["freqs"].append(freqs[:, [f for f, _ in planes]])
        if split_bias is not None:
            q_bias, k_bias, _ = split_bias
            k_b = torch.stack(list(k_bias[j]))[..., None]  # (kv, qk, 1): a bias as a column
            parts["q.b"].append(mix.queries([b[:, None] for b in q_bias[j]])[:, 0])
            rope_b = mix.rope(k_b)
            parts["rope.b"].append(rope_b[:, 0])
            parts["rest.b"].append(mix.rest(k_b, rope_b).reshape(-1))
    keys_norm = torch.cat([torch.cat(list(k)) for k in k_rows]).norm().clamp_min(1e-30)
    biases = None if split_bias is None else (
        torch.cat(parts["q.b"]), torch.cat(parts["rope.b"]), torch.cat(parts["rest.b"]),
        split_bias[2])
    return _LayerRows(torch.cat(parts["q"]), torch.cat(parts["rope"]), torch.cat(parts["rest"]),
                      v_rows, parts["freqs"], float(v_rows.norm() / keys_norm), biases)


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

    def rest(self, keys: Tensor, rope: Tensor) -> Tensor:
        """Each key head's rows less the kept mixed planes' share of them (kv, qk, d): what the
        latent carries, unturned (``rope``: ``self.rope(keys)``)."""
        half, out = self.qk // 2, keys.clone()
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
