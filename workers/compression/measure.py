"""What a trained model's attention uses (docs/theory.md §10), measured with torch: per layer
and head, the singular values of the query-key map ``M_h = W_Q,h W_K,h^T / sqrt(d_qk)`` (biases
folded in by a constant input coordinate, as in GPT-2's fused ``c_attn``) and, on a data sample,
the logit bound ``R`` the head reaches, the largest input norm, the attention entropy over
``ln N`` and the attention error of every candidate ``qk_dim``. The result is a typed
``CheckpointMeasurement`` that ``alloc.compression`` plans from: ``measure_checkpoint`` is what
``python -m workers.profile --checkpoint`` measures with.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

from alloc.compression import (
    CheckpointMeasurement,
    CompressionError,
    FormName,
    HeadMeasurement,
    HeadStats,
    LayerMeasurement,
    MeasureRequest,
    candidate_dims,
    student_form,
)
from arch import ArchConfig, LayerSpec
from common.errors import Problem
from common.progress import Progress, duration, say
from workers.checkpoints import Loaded, is_family_folder, load, read_arch, source_of
from workers.checkpoints.stream import LayerSource, StreamedFolder, WholeModel
from workers.compression.curvature import LayerCurvature, layer_curvature
from workers.compression.forms import SENSITIVITY
from workers.compression.heads import HeadMap, layer_maps
from workers.compression.latent_measure import (
    DEROTATION_WINDOWS,
    curvature_latent,
    derotation_orders,
)
from workers.compression.loss_rule import IGNORE, input_scale
from workers.compression.pairs import rank_pairs
from workers.compression.recording import record_block
from workers.compression.student_inputs import LatentFits
from workers.models.attention import MultiHeadAttention
from workers.models.model import Block, Model
from workers.taskargs import check_fits, resolve_task, source


@torch.no_grad()
def measured_errors(head: HeadMap, x: Tensor, ranks: Sequence[int], causal: bool
                    ) -> dict[int, float]:
    """Per rank: the largest change of an attention weight on the inputs ``x`` (B, T, d [+ 1])
    when the head's query-key map is truncated to that rank (everything upstream unchanged)."""
    from workers.models.attention import future_mask

    xd = x.double()
    matrix = torch.from_numpy(head.matrix)
    u, s, vh = torch.linalg.svd(matrix)

    def attention(m: Tensor) -> Tensor:
        z = xd @ m @ xd.transpose(-1, -2)
        if causal:
            z = z.masked_fill(future_mask(z.shape[-1], z.device), float("-inf"))
        return torch.softmax(z, dim=-1)

    full = attention(matrix)  # the teacher's weights, once for every rank
    return {r: float((full - attention(u[:, :r] * s[:r] @ vh[:r])).abs().max()) for r in ranks}


def norm_bound(block: Block, arch: ArchConfig) -> float:
    """Without data: a bound on the attention input's norm from the block's norm parameters,
    ``sqrt(d) max|gamma| + ||beta||`` (a normalised vector has norm ``sqrt(d)``)."""
    params = dict(block.attn_norm.named_parameters())
    gamma = params["weight"].detach().abs().max().item()
    beta = params["bias"].detach().norm().item() if "bias" in params else 0.0
    bound = math.sqrt(arch.d_model) * gamma + beta
    return math.sqrt(bound * bound + 1) if arch.bias or arch.qkv_bias else bound



# --- the measurer -------------------------------------------------------------------------


WINDOW_TOKENS = 32 * 1024  # default checkpoint sample: 32 windows of 1,024 tokens

# Validation batches from this index on are the profile's sample: ``workers.compress`` and the
# trainer evaluate on batches 0, 1, ..., so a plan is never chosen on the windows it is scored on.
SAMPLE_BATCH = 1 << 20


def measure_model(model: Model, x: Tensor | None, seq_len: int, align: int,
                  sample: str | None = None, targets: Tensor | None = None,
                  quiet: bool = True, form: FormName = "compact") -> CheckpointMeasurement:
    """What planning needs of ``model`` (``measure_layers``) and, with ``targets`` (the
    sample's next tokens, (B, T)), each candidate's loss increase for the student ``form``
    (``workers.compression.forms.SENSITIVITY``): a compact form's head groups at each candidate
    ``qk_dim`` and ``v_dim``, the group alone cut (one forward of the model per group and
    candidate); a latent form's mhsa layers at each latent width instead."""
    scales: dict[int, tuple[float, ...]] = {}
    measured = measure_layers(WholeModel(model), x, seq_len, align, sample, quiet,
                              scales if targets is not None else None)
    if x is None or targets is None:
        return measured
    sensitivity = SENSITIVITY[form]
    if sensitivity is None:
        raise CompressionError.of([Problem("estimate", "forwards", f"a {form} student is "
                                           "planned with the curvature estimate")])
    layers = sensitivity(model, x, targets, list(measured.layers), align, scales, quiet)
    return dataclasses.replace(measured, layers=tuple(layers), form=form)


def measure_layers(source: LayerSource, x: Tensor | None, seq_len: int, align: int,
                   sample: str | None = None, quiet: bool = True,
                   scales: dict[int, tuple[float, ...]] | None = None) -> CheckpointMeasurement:
    """What planning needs of a model, one block at a time (``source``: in memory or streamed
    from a folder): every query-key head's spectrum and, on the sample ``x`` (ids or vectors,
    ``(B, T)`` / ``(B, T, d)``; None: no data), each head's logit statistics and the attention
    error of each candidate ``qk_dim`` (multiples of ``align``), the sample's residual stream
    carried from block to block.

    Args:
        seq_len: N of the saturation rule (the sample's length when there is one).
        sample: what ``x`` is, for the plan's record ("--task lm").
        quiet: False: progress on stderr (each layer).
        scales: filled, when given, with each mhsa layer's input RMS (the values' SVD weights).
    """
    arch = source.arch
    h = None if x is None else source.inputs(x)
    bias = arch.bias or arch.qkv_bias
    layers = []
    with Progress("measure", total=arch.n_layers, unit="layers", quiet=quiet,
                  start="spectra" + (f" and, on {len(x):,} windows of {x.shape[1]:,} positions, "
                                     "the errors of each candidate qk_dim" if x is not None
                                     else "") + ", layer by layer") as bar:
        for i, layer in enumerate(arch.layers):
            stats: tuple[HeadStats, ...] = ()
            inputs = None
            with source.block(i) as block:
                norm = norm_bound(block, arch)
                # RoPE heads' statistics come with their pair ranking, from the same maps
                ranked = isinstance(block.attn, MultiHeadAttention) and block.attn.rope
                if h is not None:
                    record = record_block(block, layer, h, bias, statistics=not ranked)
                    inputs, norm, h = record.inputs, record.norm, record.out
                    bounds = [float(b) for g, _ in record.groups for b in g]
                    entropy = [float(e) for _, g in record.groups for e in g]
                    stats = tuple(HeadStats(b, e) for b, e in zip(bounds, entropy))
                    if scales is not None and (layer.kind.cut_values or layer.kind.to_latent):
                        scales[i] = input_scale(inputs)
                heads, ranked_stats = _head_measurements(layer_maps(block.attn, i), layer,
                                                         inputs, arch.causal, align)
            layers.append(LayerMeasurement(i, heads, norm, ranked_stats or stats))
            bar.update(1)
            bar.event(f"layer {i} ({len(heads)} heads)")
    return CheckpointMeasurement(arch, seq_len, align, tuple(layers),
                                 sample if x is not None else None)


def _head_measurements(maps: list[HeadMap], layer: LayerSpec, x: Tensor | None, causal: bool,
                       align: int) -> tuple[tuple[HeadMeasurement, ...], tuple[HeadStats, ...]]:
    """The layer's heads: SVD spectra and errors of truncated maps, or, for RoPE heads, pair
    bounds (each pair's value split over its two dims) and errors in each key/value head's
    pair ranking (``pairs`` records the ranking: the student keeps pairs in that order), with
    each head's statistics on the sample ``x`` (empty without RoPE or a sample)."""
    if not maps:
        return (), ()
    if maps[0].freqs is None:
        grouped = [str(g) for g in layer.heads if g.grouped]
        if grouped:
            raise CompressionError(f"heads {', '.join(grouped)}: grouped key/value heads "
                                   "without RoPE share a key map that each query head's SVD "
                                   "would truncate differently; this is not implemented")
        return tuple(HeadMeasurement(
            m.group, m.head, tuple(float(v) for v in m.singular_values()),
            None if x is None else measured_errors(
                m, x, candidate_dims(layer.heads[m.group].qk_dim, align), causal))
            for m in maps), ()
    if align % 2:
        raise CompressionError.of([Problem("align", align, "RoPE heads keep whole frequency "
                                           "pairs, so reduced qk_dims must be even; use an "
                                           "even {align}")])
    out: dict[tuple[int, int], HeadMeasurement] = {}
    stats: dict[tuple[int, int], HeadStats] = {}
    for (j, kv) in sorted({(m.group, m.kv) for m in maps}):
        readers = [m for m in maps if (m.group, m.kv) == (j, kv)]
        ranks = candidate_dims(layer.heads[j].qk_dim, align)
        ranking = rank_pairs(readers, x, ranks, causal)
        for m in readers:
            sigma = tuple(float(v) / 2 for v in ranking.bounds[m.head] for _ in range(2))
            errors = None if ranking.errors is None else ranking.errors[m.head]
            out[(j, m.head)] = HeadMeasurement(j, m.head, sigma, errors, ranking.order)
            if ranking.stats is not None:
                stats[(j, m.head)] = ranking.stats[m.head]
    return tuple(out[key] for key in sorted(out)), tuple(stats[key] for key in sorted(stats))


def measure_checkpoint(request: MeasureRequest) -> CheckpointMeasurement:
    """The measurement of ``python -m workers.profile --checkpoint``: the checkpoint, on a
    sample of the requested data or task drawn apart from the evaluation batches (see
    ``SAMPLE_BATCH``).

    Raises:
        CheckpointError, TaskError, DataError, CompressionError: one line each.
    """
    return measure_for_plan(request)[0]


def measure_for_plan(request: MeasureRequest) -> tuple[CheckpointMeasurement, LatentFits]:
    """``measure_checkpoint``, and the latent maps a plan fitted to second order (a latent
    plan's ``curvature`` estimate; else none).

    Raises:
        CheckpointError, TaskError, DataError, CompressionError: one line each.
    """
    tick = time.perf_counter()
    curvature = request.estimate == "curvature" and \
        request.estimate in student_form(request.form).estimates
    # the loss rule's forwards run the whole model per cut; otherwise a Llama-family folder
    # (or GGUF file) is streamed
    streamed = (curvature or not request.loss_sensitivity) and is_family_folder(
        request.checkpoint)
    arch = read_arch(request.checkpoint)
    loaded = None if streamed else load(request.checkpoint)
    read_s = time.perf_counter() - tick
    x, targets, seq_len, source = _sample(request, arch)
    layout = "llama" if loaded is None else loaded.layout
    fits: LatentFits = {}
    with _layers(request, loaded) as layers:
        _say_read(request, arch, layout, read_s if loaded else time.perf_counter() - tick,
                  streamed=loaded is None)
        if curvature:
            if x is None or targets is None:
                raise CompressionError.of([Problem(
                    "latent", True, "the curvature estimate needs a sample of a token model "
                    "({task.data} or {task.name})", shown="")])
            spectra = measure_layers(layers, None, seq_len, request.align, None, request.quiet)
            measured, fits = curvature_latent(layers, spectra, x, targets, request.rope_dim,
                                              request.quiet)
            measured = dataclasses.replace(measured, sample=source)
        elif loaded is not None:
            measured = measure_model(loaded.model, x, seq_len, request.align, source, targets,
                                     request.quiet, request.form)
        else:
            measured = measure_layers(layers, x, seq_len, request.align, source, request.quiet)
    return dataclasses.replace(measured, checkpoint=str(request.checkpoint),
                               layout=layout), fits


@dataclasses.dataclass(frozen=True)
class LatentFamily:
    """A latent student's measurements at several RoPE parts from one sample and one curvature
    pass: per RoPE part (per key/value head) the measurement and its maps at full rank, and the
    layers' curvature moments (``workers.compression.curvature``)."""

    measured: Mapping[int, CheckpointMeasurement]
    fits: Mapping[int, LatentFits]
    curvature: tuple[LayerCurvature, ...]


def measure_latent_family(request: MeasureRequest, rope_dims: Sequence[int],
                          width_align: int | None = None) -> LatentFamily:
    """``measure_for_plan``'s curvature estimate at each of ``rope_dims`` (0: no RoPE part),
    the sample drawn, the spectra measured, the curvature gathered and the RoPE pairs ranked
    once for all of them; the latent widths priced at multiples of ``width_align`` (default:
    the request's ``align``; 1 prices every width).

    Raises:
        CheckpointError, TaskError, DataError, CompressionError: one line each.
    """
    arch = read_arch(request.checkpoint)
    loaded = None if is_family_folder(request.checkpoint) else load(request.checkpoint)
    x, targets, seq_len, source = _sample(request, arch)
    if x is None or targets is None:
        raise CompressionError.of([Problem("latent", True, "the curvature estimate needs a "
                                           "sample of a token model ({task.data})", shown="")])
    measured: dict[int, CheckpointMeasurement] = {}
    fits: dict[int, LatentFits] = {}
    layout = "llama" if loaded is None else loaded.layout
    with _layers(request, loaded) as layers:
        spectra = measure_layers(layers, None, seq_len, request.align, None, request.quiet)
        spectra = dataclasses.replace(spectra, align=width_align or request.align)
        curvature = tuple(layer_curvature(layers, x, targets, quiet=request.quiet))
        orders = derotation_orders(layers, x[:DEROTATION_WINDOWS], request.quiet) \
            if any(rope_dims) else None
        for rope in rope_dims:
            found, fits[rope] = curvature_latent(layers, spectra, x, targets, rope,
                                                 request.quiet, moments=curvature,
                                                 orders=orders)
            measured[rope] = dataclasses.replace(found, sample=source,
                                                 checkpoint=str(request.checkpoint),
                                                 layout=layout)
    return LatentFamily(measured, fits, curvature)


def _sample(request: MeasureRequest, arch: ArchConfig
            ) -> tuple[Tensor | None, Tensor | None, int, str | None]:
    """The sample's windows, their targets (with the loss rule; ``IGNORE`` where a position
    does not count), the window (the model's length without a sample) and what was sampled."""
    task = resolve_task(request.task, arch, request.seq_len)
    if task is None:
        return None, None, min(request.seq_len or arch.max_seq_len, arch.max_seq_len), None
    check_fits(task, arch, trains=False, spec=request.task)
    windows = max(1, (request.sample_tokens or WINDOW_TOKENS) // task.seq_len)
    batch = task.batch("val", SAMPLE_BATCH, windows)
    targets = None
    if request.loss_sensitivity:
        if arch.vocab_size is None:
            raise CompressionError.of([Problem("loss_sensitivity", True, "needs a token model "
                                               "(this one reads vectors)", shown="")])
        targets = batch.y.masked_fill(~batch.mask, IGNORE)  # positions that count
    return batch.x, targets, task.seq_len, source(request.task)


@contextmanager
def _layers(request: MeasureRequest, loaded: Loaded | None) -> Iterator[LayerSource]:
    """The model as a ``LayerSource``: in memory when it was loaded, else streamed (every
    tensor checked before anything is measured)."""
    if loaded is not None:
        yield WholeModel(loaded.model)
        return
    with StreamedFolder(request.checkpoint, source_of(request.checkpoint)) as stream:
        yield stream


def _say_read(request: MeasureRequest, arch: ArchConfig, layout: str, seconds: float,
              streamed: bool) -> None:
    say(f"measure: {'checked' if streamed else 'read'} {request.checkpoint} ({layout}, "
        f"{arch.n_layers} layers, {sum(len(layer.heads) for layer in arch.layers)} head groups"
        f"{', streamed a layer at a time' if streamed else ''}) in {duration(seconds)}",
        quiet=request.quiet)
