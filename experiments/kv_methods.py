"""The ways to shrink a trained GQA Llama's KV cache that ``kv_compress`` puts side by side, each
a function ``(teacher, calibration, fraction) -> student`` in ``METHODS``: every student caches
``fraction`` of its teacher's key and value units per token (in every layer, or in all of them
together where a method allocates), and is one of our ``latent`` or compact models, so that all
are evaluated, fine-tuned and exported the same way.

- ``svd``: separate truncated SVDs of each layer's key map ``W_k`` and value map ``W_v``, half
  the layer's units each (the ten lines a practitioner writes first); keys turned by RoPE after
  they are rebuilt;
- ``asvd``: the same, each map scaled by the inputs' magnitude per feature to the power 0.5
  before its SVD (Yuan et al., 2023, "ASVD"; the RMS stands for the mean magnitude);
- ``palu``: separate low-rank key and value maps of each layer (one group of its key/value
  heads), each whitened by the inputs' second moment (SVD-LLM's truncation-aware whitening,
  Wang et al., 2024), ranks allocated across layers and maps in proportion to the maps'
  Fisher information (Chang et al., 2025, "Palu");
- ``mha2mla``: partial RoPE, each key/value head keeping the pairs of largest query and key
  norm (a quarter of the head, within half the units) as a decoupled RoPE part, the rest of the
  keys and the values in one input-scaled joint latent without RoPE (Ji et al., 2025,
  "MHA2MLA");
- ``transmla``: RoRoPE (Meng et al., 2025, "TransMLA"): within each RoPE pair an orthogonal
  change of basis across the key/value heads (the eigenvectors of the pair's second moment over
  the inputs) puts the positional energy in a few mixed planes, the strongest of which, over
  all pairs, form one RoPE key shared by every query head (half the layer's units); the keys'
  remainder, scaled to the values' norm, and the values share one input-scaled latent without
  RoPE: it decodes absorbed (their recipe without our curvature; FreqFold left out);
- ``ours``: the compact student of the loss plan (``workers.profile --rule loss --kv-cache F``:
  RoPE pairs and value dims cut where one forward per cut says the loss rises least);
- ``ours-latent``: the latent plan estimated to second order (``workers.profile --rule loss
  --latent --kv-cache F``): one joint key-value latent per layer, turned after it is rebuilt,
  fitted to the curvature and sized across layers by it (docs/theory.md §10.6);
- ``ours-mla``: the same with a decoupled RoPE part of half the units (``--rope-dim``), the
  pairs that cost most to leave unturned: its latent parts are unturned, so it decodes from
  the cached latents as they are (absorbed);
- ``ours-rorope``: ``transmla``'s shared RoPE key (half the units) with our latent: fitted to
  the second-order loss and its widths allocated across the layers by it (the widths whose
  curvature singular values are the largest over every layer: the exact optimum of the summed
  second-order increases, which are convex in the width); decodes absorbed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from alloc.compression import (
    CheckpointMeasurement,
    CompressionError,
    CompressionPlan,
    plan_compression,
    plan_for_kv_cache,
)
from arch import ArchConfig
from workers.checkpoints import WholeModel
from workers.compression import (
    LayerCurvature,
    PairOrders,
    build_student,
    curvature_latent,
    latent_arch,
    latent_student,
    measure_layers,
    pair_orders,
    rorope_spectra,
    rorope_student,
)
from workers.models import Model, MultiHeadAttention

ASVD_ALPHA = 0.5  # ASVD's scaling exponent


@dataclass(frozen=True)
class Calibration:
    """What the methods read of one calibration sample of the teacher.

    Attributes:
        seed: which sample.
        x: its windows (B, T) and ``targets`` their next tokens.
        curvature: per mhsa layer, the second moments of ``workers.compression.curvature``.
        spectra: the teacher's spectra (no data), the base of the latent plans.
        norm_orders: MHA2MLA's ranking of each key/value head's pairs by query and key norms.
        derotation: each key/value head's pairs, costliest to leave unturned first.
        loss_plan: the compact loss plan (``ours``), or None where it was not measured.
    """

    seed: int
    x: Tensor
    targets: Tensor
    curvature: tuple[LayerCurvature, ...]
    spectra: CheckpointMeasurement
    norm_orders: PairOrders
    derotation: PairOrders
    loss_plan: CompressionPlan | None = None


Method = Callable[[Model, Calibration, float], Model | None]


def layer_units(arch: ArchConfig, fraction: float) -> int:
    """Each layer's share of ``fraction`` of the teacher's KV cache, in cached units."""
    return max(1, round(fraction * arch.kv_width / arch.n_layers))


def mhsa(model: Model, i: int) -> MultiHeadAttention:
    attn = model.block(i).attn
    assert isinstance(attn, MultiHeadAttention)
    return attn


def _key_value_rows(model: Model, i: int) -> tuple[Tensor, Tensor]:
    """Layer ``i``'s key rows and value rows (float64)."""
    attn = mhsa(model, i)
    w = attn.qkv.weight.detach().double()
    return (w[attn.qk_width:attn.qk_width + attn.k_width],
            w[attn.qk_width + attn.k_width:])


def _split_fit(keys: Tensor, values: Tensor, ranks: tuple[int, int],
               right: Tensor | None, right_inverse: Tensor | None) -> tuple[Tensor, Tensor]:
    """One latent of two independent parts, ``(up, down)``: the truncated SVD of the keys and
    of the values, each of ``keys @ right`` (``right``: a scaling or whitening of the inputs,
    undone by ``right_inverse`` on ``down``; None: plain)."""
    ups, downs = [], []
    for rows, rank in zip((keys, values), ranks):
        m = rows if right is None else rows @ right
        u, s, vh = torch.linalg.svd(m, full_matrices=False)
        k = min(rank, len(s))
        down = vh[:k] if right_inverse is None else vh[:k] @ right_inverse
        ups.append(u[:, :k] * s[:k])
        downs.append(torch.cat([down, down.new_zeros(rank - k, down.shape[1])]))
        ups[-1] = torch.cat([ups[-1], ups[-1].new_zeros(rows.shape[0], rank - k)], dim=1)
    up = torch.block_diag(*ups)  # keys read the first part, values the second
    return up.float(), torch.cat(downs).float()


def _separate(teacher: Model, ranks: Mapping[int, tuple[int, int]],
              right: Callable[[int], tuple[Tensor | None, Tensor | None]]) -> Model:
    """The student whose layer ``i`` caches ``ranks[i]`` (key, value) units of two independent
    SVDs (``_split_fit``), its keys turned after they are rebuilt."""
    fits = {}
    for i, (rk, rv) in ranks.items():
        keys, values = _key_value_rows(teacher, i)
        fits[i] = _split_fit(keys, values, (rk, rv), *right(i))
    arch = latent_arch(teacher.arch, [rk + rv for rk, rv in ranks.values()], 0,
                       rotate_latent=True)
    return latent_student(teacher, arch, {}, None, fits)


def _halves(teacher: Model, fraction: float) -> dict[int, tuple[int, int]]:
    units = layer_units(teacher.arch, fraction)
    return {i: (units // 2, units - units // 2) for i in range(teacher.arch.n_layers)}


def svd(teacher: Model, cal: Calibration, fraction: float) -> Model:
    return _separate(teacher, _halves(teacher, fraction), lambda i: (None, None))


def asvd(teacher: Model, cal: Calibration, fraction: float) -> Model:
    moments = {c.index: c for c in cal.curvature}

    def scaling(i: int) -> tuple[Tensor, Tensor]:
        scale = moments[i].inputs.diagonal().sqrt().clamp_min(1e-8) ** ASVD_ALPHA
        return torch.diag(scale), torch.diag(1 / scale)

    return _separate(teacher, _halves(teacher, fraction), scaling)


def palu(teacher: Model, cal: Calibration, fraction: float) -> Model:
    moments = {c.index: c for c in cal.curvature}
    arch = teacher.arch
    k_width = mhsa(teacher, 0).k_width
    # the Fisher information of each map, E||g x^T||^2 ~ E||g||^2 E||x||^2 (K-FAC's factors)
    info = []
    for i in range(arch.n_layers):
        g, c = moments[i].grads, moments[i].inputs
        info += [float(g[:k_width, :k_width].trace() * c.trace()),
                 float(g[k_width:, k_width:].trace() * c.trace())]
    total = layer_units(arch, fraction) * arch.n_layers
    ranks = allocate(info, total, min(k_width, arch.d_model))
    pairs = {i: (ranks[2 * i], ranks[2 * i + 1]) for i in range(arch.n_layers)}

    def whitening(i: int) -> tuple[Tensor, Tensor]:
        c = moments[i].inputs
        c = c + 1e-6 * c.diagonal().mean() * torch.eye(c.shape[0], dtype=c.dtype)
        root = torch.linalg.cholesky(c)
        return root, torch.linalg.inv(root)

    return _separate(teacher, pairs, whitening)


def mha2mla(teacher: Model, cal: Calibration, fraction: float) -> Model:
    arch = teacher.arch
    units = layer_units(arch, fraction)
    g = arch.layers[0].heads[0]
    rope = max(0, min(g.qk_dim // 4, (units // 2) // g.kv_heads) // 2 * 2)
    rest = [units - g.kv_heads * rope] * arch.n_layers
    scales = {c.index: tuple(float(v) for v in c.inputs.diagonal().sqrt()) for c in cal.curvature}
    return latent_student(teacher, latent_arch(arch, rest, rope), cal.norm_orders, scales)


def transmla(teacher: Model, cal: Calibration, fraction: float) -> Model:
    arch = teacher.arch
    units = layer_units(arch, fraction)
    g = arch.layers[0].heads[0]
    rope = max(2, min(g.kv_heads * g.qk_dim, units // 2) // 2 * 2)
    moments = {c.index: c.inputs for c in cal.curvature}
    scales = {c.index: tuple(float(v) for v in c.inputs.diagonal().sqrt()) for c in cal.curvature}
    return rorope_student(teacher, [rope] * arch.n_layers, [units - rope] * arch.n_layers,
                          moments, scales, balance=True)


def ours_rorope(teacher: Model, cal: Calibration, fraction: float) -> Model:
    arch = teacher.arch
    units = layer_units(arch, fraction)
    g = arch.layers[0].heads[0]
    rope = [max(2, min(g.kv_heads * g.qk_dim, units // 2) // 2 * 2)] * arch.n_layers
    inputs = {c.index: c.inputs for c in cal.curvature}
    grads = {c.index: c.grads for c in cal.curvature}
    spectra = rorope_spectra(teacher, rope, inputs, grads)
    # one unit each, then the rest where the curvature says it buys most
    widths = largest_values(spectra, arch.n_layers * (units - 1) - sum(rope))
    return rorope_student(teacher, rope, [1 + widths[i] for i in range(arch.n_layers)],
                          inputs, grads=grads)


def largest_values(spectra: Mapping[int, Tensor], total: int) -> dict[int, int]:
    """Per layer how many of its values are among the ``total`` largest over every layer: the
    widths that minimise the summed tails of squared values (each tail convex in its width)."""
    ranked = sorted(((float(v), i) for i, s in spectra.items() for v in s), reverse=True)
    widths = dict.fromkeys(spectra, 0)
    for _, i in ranked[:max(0, total)]:
        widths[i] += 1
    return widths


def ours(teacher: Model, cal: Calibration, fraction: float) -> Model | None:
    if cal.loss_plan is None:
        return None
    try:
        plan = plan_for_kv_cache(cal.loss_plan, fraction)
    except CompressionError:
        return None
    return build_student(teacher, plan.student, pair_orders(plan), plan.input_scales())


def rope_dim_for(arch: ArchConfig, fraction: float) -> int:
    """``ours-mla``'s decoupled RoPE part: half of a layer's units, spread over its key/value
    heads, even."""
    g = arch.layers[0].heads[0]
    return max(2, min(g.qk_dim, layer_units(arch, fraction) // (2 * g.kv_heads)) // 2 * 2)


def latent_plan(teacher: Model, cal: Calibration, fraction: float, rope_dim: int
                ) -> tuple[CompressionPlan, Mapping[int, tuple[Tensor, Tensor]]]:
    """The curvature latent plan at ``fraction`` (``workers.profile --rule loss --latent``)."""
    measured, fits = curvature_latent(WholeModel(teacher), cal.spectra, cal.x, cal.targets,
                                      rope_dim, moments=cal.curvature, orders=cal.derotation)
    plan = plan_for_kv_cache(plan_compression(measured, 1.0, rule="loss"), fraction)
    return plan, fits


def _planned_latent(teacher: Model, cal: Calibration, fraction: float, rope_dim: int
                    ) -> Model | None:
    """The curvature latent plan's student (None below its floor at this size)."""
    try:
        plan, fits = latent_plan(teacher, cal, fraction, rope_dim)
    except CompressionError:
        return None
    return build_student(teacher, plan.student, pair_orders(plan), plan.input_scales(), fits)


def ours_latent(teacher: Model, cal: Calibration, fraction: float) -> Model | None:
    return _planned_latent(teacher, cal, fraction, 0)


def ours_mla(teacher: Model, cal: Calibration, fraction: float) -> Model | None:
    return _planned_latent(teacher, cal, fraction, rope_dim_for(teacher.arch, fraction))


METHODS: dict[str, Method] = {"svd": svd, "asvd": asvd, "palu": palu, "mha2mla": mha2mla,
                              "transmla": transmla, "ours": ours, "ours-latent": ours_latent,
                              "ours-mla": ours_mla, "ours-rorope": ours_rorope}


def allocate(weights: list[float], total: int, cap: int) -> list[int]:
    """``total`` units split in proportion to ``weights`` by largest remainders, each part in
    ``[1, cap]``; what a capped part cannot take goes to the others."""
    widths = [1] * len(weights)
    while True:
        left = total - sum(widths)
        open_ = [i for i, w in enumerate(widths) if w < cap]
        if left <= 0 or not open_:
            return widths
        mass = sum(weights[i] for i in open_)
        share = {i: left * (weights[i] / mass if mass > 0 else 1 / len(open_)) for i in open_}
        add = {i: min(cap - widths[i], math.floor(share[i])) for i in open_}
        rest = left - sum(add.values())
        for i in sorted(open_, key=lambda i: share[i] - math.floor(share[i]), reverse=True):
            if rest > 0 and widths[i] + add[i] < cap:
                add[i], rest = add[i] + 1, rest - 1
        if not any(add.values()):
            return widths
        for i, extra in add.items():
            widths[i] += extra


def calibrate(teacher: Model, x: Tensor, targets: Tensor, seed: int, align: int,
              quiet: bool = True, saved: Mapping[str, Any] | None = None) -> Calibration:
    """Everything the methods read of the sample ``x`` (but the compact loss plan, which
    ``kv_compress`` measures when ``ours`` is asked for); ``saved``: the measurements of an
    earlier ``Calibration.state()`` of the same sample, not measured again."""
    from workers.compression import DEROTATION_WINDOWS, derotation_orders, layer_curvature

    source = WholeModel(teacher)
    spectra = dataclasses.replace(measure_layers(source, None, x.shape[1], align, None, quiet),
                                  sample="calibration")
    if saved is not None:
        return Calibration(seed, x, targets, tuple(
            LayerCurvature(int(i), c, g, int(n)) for i, c, g, n in saved["curvature"]),
            spectra, _orders(saved["norm_orders"]), _orders(saved["derotation"]))
    return Calibration(seed, x, targets,
                       tuple(layer_curvature(source, x, targets, quiet=quiet)), spectra,
                       norm_orders(teacher, x[:DEROTATION_WINDOWS]),
                       derotation_orders(source, x[:DEROTATION_WINDOWS], quiet))


def calibration_state(cal: Calibration) -> dict[str, Any]:
    """What ``calibrate`` measured, as tensors and lists (``torch.save`` with
    ``weights_only`` reads it back)."""
    return {"curvature": [(c.index, c.inputs, c.grads, c.tokens) for c in cal.curvature],
            "norm_orders": [[*key, *order] for key, order in cal.norm_orders.items()],
            "derotation": [[*key, *order] for key, order in cal.derotation.items()]}


def _orders(rows: list[list[int]]) -> dict[tuple[int, int, int], tuple[int, ...]]:
    return {(int(r[0]), int(r[1]), int(r[2])): tuple(int(p) for p in r[3:]) for r in rows}


@torch.no_grad()
def norm_orders(model: Model, x: Tensor) -> dict[tuple[int, int, int], tuple[int, ...]]:
    """MHA2MLA's 2-norm ranking: each key/value head's RoPE pairs by the mean, over the
    sample and the query heads reading it, of ``|q_i| |k_i|`` (a pair's two dims together;
    RoPE turns a pair without changing its norm)."""
    inputs: dict[int, Tensor] = {}
    hooks = [mhsa(model, i).register_forward_pre_hook(
        lambda _m, args, i=i: inputs.__setitem__(i, args[0])) for i in range(model.arch.n_layers)]
    try:
        model.hidden(x)
    finally:
        for hook in hooks:
            hook.remove()
    orders: dict[tuple[int, int, int], tuple[int, ...]] = {}
    for i in range(model.arch.n_layers):
        q, k, _ = mhsa(model, i).project(inputs[i])
        g = model.arch.layers[i].heads[0]
        half = g.qk_dim // 2
        qn, kn = pair_norms(q, g.count, half), pair_norms(k, g.kv_heads, half)
        share = g.count // g.kv_heads
        for h in range(g.kv_heads):
            score = qn[h * share:(h + 1) * share].mean(0) * kn[h]
            orders[(i, 0, h)] = tuple(int(p) for p in score.argsort(descending=True))
    return orders


def pair_norms(rows: Tensor, heads: int, half: int) -> Tensor:
    """(B, T, heads * 2 half) -> (heads, half): each pair's mean norm over the sample."""
    r = rows.reshape(*rows.shape[:2], heads, 2, half)
    return r.square().sum(3).sqrt().mean((0, 1))
