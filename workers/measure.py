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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from alloc.compression import (
    CheckpointMeasurement,
    CompressionError,
    HeadMeasurement,
    HeadStats,
    LayerMeasurement,
    MeasureRequest,
    candidate_dims,
)
from arch import ArchConfig, LayerSpec
from common.progress import Progress, duration, say
from workers.attention import LogitRecorder, rotate
from workers.checkpoints import load
from workers.chunks import window_chunks
from workers.heads import HeadMap, head_maps
from workers.model import Model
from workers.taskargs import check_fits, task_for_model


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
    # MixiT layers compute no logits: every other layer calls attention_fn once per head group.
    counts = [0 if layer.attention == "mixit" else len(layer.heads)
              for layer in model.arch.layers]
    groups, cursor = [], 0
    for count in counts:
        groups.append(recorder.logits[cursor:cursor + count])
        cursor += count
    if model.arch.bias or model.arch.qkv_bias:
        inputs = [torch.cat([x, x.new_ones(*x.shape[:-1], 1)], -1) for x in inputs]
    return AttentionRecord(groups, inputs, [float(x.double().norm(dim=-1).max()) for x in inputs],
                    model.arch.causal)


@torch.no_grad()
def measured_errors(head: HeadMap, x: Tensor, ranks: Sequence[int], causal: bool
                    ) -> dict[int, float]:
    """Per rank: the largest change of an attention weight on the inputs ``x`` (B, T, d [+ 1])
    when the head's query-key map is truncated to that rank (everything upstream unchanged)."""
    from workers.attention import future_mask

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


@dataclass(frozen=True)
class PairRanking:
    """One RoPE key/value head: its frequency pairs in the order a student keeps them (most
    contributing first), and per query head reading it the pair bounds in that order and, with
    a sample, the measured error of keeping each candidate number of dims."""

    order: tuple[int, ...]
    bounds: dict[int, np.ndarray]  # query head -> (qk/2,) pair_norms in ``order``
    errors: dict[int, dict[int, float]] | None = None  # query head -> rank -> error


def _rotated(head: HeadMap, x: Tensor) -> tuple[Tensor, Tensor]:
    """The head's queries and keys after RoPE on inputs ``x`` (B, T, d): (B, T, 2, qk/2) each,
    pair ``i`` at ``[..., :, i]``."""
    assert head.freqs is not None
    freqs = torch.from_numpy(head.freqs)[None]
    q = rotate((x @ torch.from_numpy(head.a))[:, None], freqs)[:, 0]  # (B, T, qk)
    k = rotate((x @ torch.from_numpy(head.b))[:, None], freqs)[:, 0]
    half = q.shape[-1] // 2
    return q.unflatten(-1, (2, half)), k.unflatten(-1, (2, half))


def _pair_scores(q: Tensor, k: Tensor, causal: bool) -> Tensor:
    """(qk/2,) per pair ``p``: the sum over windows and allowed positions ``j <= i`` of the
    squared logit term ``(q_i . k_j)^2`` (unscaled; q, k: (B, T, 2, qk/2)). A pair's term is a
    rank-2 map, so ``sum_j (q_i . k_j)^2 = q_i^T (sum_j k_j k_j^T) q_i`` with a running sum of
    2 x 2 outer products: O(T) per pair, no (T, T) map formed."""
    outer = k[:, :, :, None] * k[:, :, None, :]  # (B, T, 2, 2, qk/2): k_j k_j^T per pair
    running = outer.cumsum(dim=1) if causal else outer.sum(dim=1, keepdim=True)
    return torch.einsum("btcp,btcdp,btdp->p", q, running, q)


def _segment_logits(q: Tensor, k: Tensor, pairs: Sequence[int]) -> Tensor:
    """(B, T, T) logit terms of ``pairs`` together (unscaled)."""
    index = torch.tensor(list(pairs), dtype=torch.long)
    return torch.einsum("bicp,bjcp->bij", q.index_select(-1, index), k.index_select(-1, index))


@torch.no_grad()
def rank_pairs(heads: Sequence[HeadMap], x: Tensor | None, ranks: Sequence[int],
               causal: bool) -> PairRanking:
    """Rank the frequency pairs of one key/value head (``heads``: the query heads reading it).

    With a sample ``x`` (B, T, d [+ 1]), pairs are ranked by their mean squared logit term
    summed over the query heads (what the logits really receive from each pair, after RoPE;
    ``_pair_scores``), and each candidate rank's error is the largest attention-weight change
    when only its leading pairs are kept; without one, by the summed ``pair_norms``. The kept
    logits grow one candidate's segment of pairs at a time, one chunk of windows at a time
    (memory: a few (windows, T, T) maps).
    """
    bounds = {h.head: h.pair_norms() for h in heads}
    if x is None:
        score = np.sum([bounds[h.head] for h in heads], axis=0)
        order = tuple(int(i) for i in np.argsort(-score, kind="stable"))
        return PairRanking(order, {h: b[list(order)] for h, b in bounds.items()})
    from workers.attention import future_mask

    t = x.shape[1]
    hidden = future_mask(t) if causal else torch.zeros(t, t, dtype=torch.bool)
    pairs = heads[0].a.shape[1] // 2
    scale = 1.0 / math.sqrt(2 * pairs)
    chunks = window_chunks(x.double(), 3 * 8 * t * t)  # full, cut and running (T, T) maps
    total = torch.zeros(pairs, dtype=torch.float64)
    for chunk in chunks:
        for h in heads:
            total += _pair_scores(*_rotated(h, chunk), causal)
    score = total.numpy()  # the scale is common to every pair: the order does not need it
    order = tuple(int(i) for i in np.argsort(-score, kind="stable"))
    kept_pairs = sorted({r // 2 for r in ranks if 0 < r // 2 <= pairs})
    errors = {h.head: dict.fromkeys(ranks, 0.0) for h in heads}
    for chunk in chunks:
        for h in heads:
            q, k = _rotated(h, chunk)
            logits = torch.einsum("bicp,bjcp->bij", q, k) * scale  # every pair: the teacher's
            full = torch.softmax(logits.masked_fill(hidden, float("-inf")), dim=-1)
            kept, done = torch.zeros_like(logits), 0  # the leading pairs' terms so far
            for n in kept_pairs:
                kept += _segment_logits(q, k, order[done:n]) * scale
                done = n
                cut = torch.softmax(kept.masked_fill(hidden, float("-inf")), dim=-1)
                errors[h.head][2 * n] = max(errors[h.head][2 * n],
                                            float((full - cut).abs().max()))
    return PairRanking(order, {h: b[list(order)] for h, b in bounds.items()}, errors)


def head_statistics(logits: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per head: the largest |logit| over allowed pairs, and the mean over rows (with at least
    two keys) of the attention entropy over ``ln N_row``. ``logits``: (B, H, T, T)."""
    allowed = torch.isfinite(logits)
    bound = logits.masked_fill(~allowed, 0).abs().amax(dim=(0, 2, 3))
    p = torch.softmax(logits.double(), dim=-1)
    entropy = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)  # (B, H, T)
    keys = allowed.sum(-1).double()  # (B?, H?, T)
    rows = keys >= 2
    normalised = torch.where(rows, entropy / keys.clamp_min(2).log(), torch.zeros(()))
    mean = normalised.sum(dim=(0, 2)) / rows.sum(dim=(0, 2)).clamp_min(1)
    return bound.numpy(), mean.numpy()


def norm_bound(model: Model, index: int) -> float:
    """Without data: a bound on the attention input's norm from the layer's norm parameters,
    ``sqrt(d) max|gamma| + ||beta||`` (a normalised vector has norm ``sqrt(d)``)."""
    params = dict(model.block(index).attn_norm.named_parameters())
    gamma = params["weight"].detach().abs().max().item()
    beta = params["bias"].detach().norm().item() if "bias" in params else 0.0
    bound = math.sqrt(model.arch.d_model) * gamma + beta
    return math.sqrt(bound * bound + 1) if model.arch.bias or model.arch.qkv_bias else bound



# --- the measurer -------------------------------------------------------------------------


WINDOW_TOKENS = 32 * 1024  # default checkpoint sample: 32 windows of 1,024 tokens

# Validation batches from this index on are the profile's sample: ``workers.compress`` and the
# trainer evaluate on batches 0, 1, ..., so a plan is never chosen on the windows it is scored on.
SAMPLE_BATCH = 1 << 20


def measure_model(model: Model, x: Tensor | None, seq_len: int, align: int,
                  sample: str | None = None, targets: Tensor | None = None,
                  quiet: bool = True) -> CheckpointMeasurement:
    """What planning needs of ``model``: every query-key head's spectrum and, on the sample
    ``x`` (ids or vectors, ``(B, T)`` / ``(B, T, d)``; None: no data), each head's logit
    statistics and the attention error of each candidate ``qk_dim`` (multiples of ``align``);
    with ``targets`` (the sample's next tokens, (B, T)), each head group's loss increase at
    each candidate, the group alone cut (one forward of the model per group and candidate).

    Args:
        seq_len: N of the saturation rule (the sample's length when there is one).
        sample: what ``x`` is, for the plan's record ("--task lm").
        quiet: False: progress on stderr (the sample pass, each layer, the loss forwards).
    """
    maps = head_maps(model)
    recorded = None
    if x is not None:
        tick = time.perf_counter()
        say(f"measure: the sample pass, {len(x):,} windows of {x.shape[1]:,} positions",
            quiet=quiet)
        recorded = record_attention(model, x)
        say(f"measure: the sample pass took {duration(time.perf_counter() - tick)}",
            quiet=quiet)
    layers = []
    with Progress("measure", total=model.arch.n_layers, unit="layers", quiet=quiet,
                  start="spectra" + (" and the errors of each candidate qk_dim"
                                     if x is not None else "") + ", layer by layer") as bar:
        for i, layer in enumerate(model.arch.layers):
            stats: tuple[HeadStats, ...] = ()
            norm = norm_bound(model, i)
            if recorded is not None and recorded.groups[i]:
                bounds = np.concatenate([b for b, _ in recorded.groups[i]])
                entropy = np.concatenate([e for _, e in recorded.groups[i]])
                stats = tuple(HeadStats(float(b), float(e)) for b, e in zip(bounds, entropy))
                norm = recorded.norms[i]
            inputs = None if recorded is None else recorded.inputs[i]
            heads = _head_measurements([m for m in maps if m.layer == i], layer, inputs,
                                       model.arch.causal, align)
            layers.append(LayerMeasurement(i, heads, norm, stats))
            bar.update(1)
            bar.event(f"layer {i} ({len(heads)} heads)")
    if x is not None and targets is not None:
        layers = loss_sensitivity(model, x, targets, layers, align, quiet,
                                  None if recorded is None else recorded.inputs)
    return CheckpointMeasurement(model.arch, seq_len, align, tuple(layers),
                                 sample if x is not None else None)


IGNORE = -100  # a target that does not count


@torch.no_grad()
def sample_loss(model: Model, x: Tensor, targets: Tensor) -> float:
    """Mean cross-entropy of ``model`` on ids ``x`` against ``targets`` (B, T; ``IGNORE`` where
    a position does not count)."""
    per_window = 4 * x.shape[1] * (model.arch.vocab_size or 1)  # float32 output logits
    total = 0.0
    for xs, ys in zip(window_chunks(x, per_window), window_chunks(targets, per_window)):
        logits = model(xs)
        total += float(torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ys.reshape(-1), ignore_index=IGNORE,
            reduction="sum"))
    return total / max(1, int((targets != IGNORE).sum()))


def loss_sensitivity(model: Model, x: Tensor, targets: Tensor, layers: list[LayerMeasurement],
                     align: int, quiet: bool = True,
                     inputs: Sequence[Tensor] | None = None) -> list[LayerMeasurement]:
    """``layers`` with each head group's loss increase on the sample at each candidate
    ``qk_dim`` and, in mhsa layers, each candidate ``v_dim``, every other group and side kept
    (docs/theory.md §10.3-10.4): the student of that cut alone, built as ``workers.compress``
    builds it (the SVD, the measured pair ranking, or the values' SVD weighted by the RMS of
    each layer's recorded attention ``inputs``). One forward of the model on the sample per
    group and candidate, the slow part of a profile: counted on stderr unless ``quiet``."""
    from workers.students import build_student, rankings

    scales = {m.index: input_scale(inputs[m.index]) for m in layers
              if inputs is not None and m.heads and model.arch.layers[m.index].attention == "mhsa"}
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
                                input_scale=scales.get(m.index, ()))
            for m in layers]


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
    layers = list(arch.layers)
    layers[layer] = dataclasses.replace(spec, heads=heads)
    return dataclasses.replace(arch, layers=tuple(layers))


def _head_measurements(maps: list[HeadMap], layer: LayerSpec, x: Tensor | None, causal: bool,
                       align: int) -> tuple[HeadMeasurement, ...]:
    """The layer's heads: SVD spectra and errors of truncated maps, or, for RoPE heads, pair
    bounds (each pair's value split over its two dims) and errors in each key/value head's
    pair ranking (``pairs`` records the ranking: the student keeps pairs in that order)."""
    if not maps:
        return ()
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
            for m in maps)
    if align % 2:
        raise CompressionError(f"--align {align}: RoPE heads keep whole frequency pairs, so "
                               "reduced qk_dims must be even; use an even --align")
    out: dict[tuple[int, int], HeadMeasurement] = {}
    for (j, kv) in sorted({(m.group, m.kv) for m in maps}):
        readers = [m for m in maps if (m.group, m.kv) == (j, kv)]
        ranks = candidate_dims(layer.heads[j].qk_dim, align)
        ranking = rank_pairs(readers, x, ranks, causal)
        for m in readers:
            sigma = tuple(float(v) / 2 for v in ranking.bounds[m.head] for _ in range(2))
            errors = None if ranking.errors is None else ranking.errors[m.head]
            out[(j, m.head)] = HeadMeasurement(j, m.head, sigma, errors, ranking.order)
    return tuple(out[key] for key in sorted(out))


def measure_checkpoint(request: MeasureRequest) -> CheckpointMeasurement:
    """The measurement of ``python -m workers.profile --checkpoint``: the checkpoint, on a
    sample of the requested data or task drawn apart from the evaluation batches (see
    ``SAMPLE_BATCH``).

    Raises:
        CheckpointError, TaskError, DataError, CompressionError: one line each.
    """
    tick = time.perf_counter()
    loaded = load(request.checkpoint)
    read_s = time.perf_counter() - tick
    task, source = task_for_model(
        loaded.arch, data=request.data, task=request.task, params=request.task_params,
        size="smoke" if request.smoke_test else "paper", seed=request.seed,
        seq_len=request.seq_len)
    x, seq_len = None, min(request.seq_len or loaded.arch.max_seq_len, loaded.arch.max_seq_len)
    targets = None
    if task is not None:
        check_fits(task, loaded.arch, trains=False, source=source)
        windows = max(1, (request.sample_tokens or WINDOW_TOKENS) // task.seq_len)
        batch = task.batch("val", SAMPLE_BATCH, windows)
        x, seq_len = batch.x, task.seq_len
        if request.loss_sensitivity:
            if loaded.arch.vocab_size is None:
                raise CompressionError("--rule loss: needs a token model (this one reads "
                                       "vectors)")
            targets = batch.y.masked_fill(~batch.mask, IGNORE)  # positions that count
    arch = loaded.arch
    say(f"measure: read {request.checkpoint} ({loaded.layout}, {arch.n_layers} layers, "
        f"{sum(len(layer.heads) for layer in arch.layers)} head groups) in {duration(read_s)}",
        quiet=request.quiet)
    measured = measure_model(loaded.model, x, seq_len, request.align, source, targets,
                             request.quiet)
    return dataclasses.replace(measured, checkpoint=str(request.checkpoint),
                               layout=loaded.layout)
