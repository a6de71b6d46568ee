"""The pilot training behind ``python -m workers.profile --data`` on token data (docs/theory.md
§9.2), with torch: train the uniform baseline briefly, then measure what its attention reads and
where it looks. The typed request and result (``run_pilot``'s) live in ``alloc.profiling.pilot``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch
from torch import Tensor

from alloc import PilotError, PilotMeasurement, PilotRequest, baseline_head, distinct_patterns
from arch import ArchConfig, HeadGroup, LayerSpec, TrainConfig
from common.progress import duration, say
from workers.chunks import window_chunks
from workers.compression import (
    SAMPLE_BATCH,
    head_maps,
    head_statistics,
    record_attention,
)
from workers.models.model import Model
from workers.tasks import Task, TaskError, make_data_task, make_task
from workers.training.trainer import Trainer, run_with_progress


def baseline(request: PilotRequest, task: Task) -> ArchConfig:
    """``D/64`` heads of 64 in every layer (one head of D below 64): the usual uniform layer,
    the architecture nobody has to choose; token or vector input and output as ``task``'s."""
    head = baseline_head(request.budget)
    layers = tuple(LayerSpec("mhsa", (head,), request.mlp_ratio) for _ in range(request.layers))
    io: dict[str, Any] = ({"vocab_size": task.vocab_size} if task.inputs == "tokens" else
                          {"input_dim": task.input_dim, "output_dim": task.output_dim})
    return ArchConfig(d_model=request.budget, layers=layers, max_seq_len=task.seq_len,
                      positional="learned", **io)


PATTERN_HEAD_DIM = 8  # the pattern pilot's later heads: narrow, so that many fit
MAX_PATTERN_HEADS = 32  # more patterns than this in one layer are not told apart


def pattern_arch(request: PilotRequest, task: Task) -> ArchConfig:
    """The baseline with ``D/8`` heads (at most 32) in every later layer: room for each later
    layer to use as many distinct patterns as the data asks for (§4.1)."""
    base = baseline(request, task)
    count = max(1, min(MAX_PATTERN_HEADS, request.budget // PATTERN_HEAD_DIM))
    while request.budget % count:  # equal heads fill the width
        count -= 1
    later = LayerSpec("mhsa", (HeadGroup(count, request.budget // count),), request.mlp_ratio)
    return dataclasses.replace(base, layers=(base.layers[0],) + (later,) * (request.layers - 1))


def head_similarity(logits: Tensor) -> Tensor:
    """``(H, H)``: the cosine between two heads' attention rows, averaged over the windows and
    the queries. ``logits``: (B, H, T, T), future entries -inf."""
    p = torch.softmax(logits.double(), dim=-1)
    p = p / p.norm(dim=-1, keepdim=True)
    return torch.einsum("bitk,bjtk->ij", p, p) / (p.shape[0] * p.shape[2])


def layer_patterns(model: Model, x: Tensor) -> tuple[float, ...]:
    """Per later layer of ``model`` (one head group each): its heads' distinct patterns on the
    windows ``x``, the similarity averaged over chunks of windows (bounded memory)."""
    heads = max(layer.n_heads for layer in model.arch.layers)
    chunks = window_chunks(x, 3 * 8 * heads * x.shape[1] ** 2)
    total: list[Tensor] | None = None
    for chunk in chunks:
        groups = record_attention(model, chunk, reduce=head_similarity).groups[1:]
        sims = [g[0] * len(chunk) for g in groups]
        total = sims if total is None else [t + s for t, s in zip(total, sims)]
    return tuple(distinct_patterns((t / len(x)).numpy()) for t in total or [])


def train_pattern_pilot(request: PilotRequest, task: Task, config: TrainConfig) -> Model | None:
    """Train the pattern pilot (``pattern_arch``) like the pilot; with one layer there is no
    later layer to measure, so none."""
    if request.layers < 2:
        return None
    trainer = Trainer(pattern_arch(request, task), task, config)
    result = run_with_progress(trainer, "pilot (patterns)", request.quiet)
    if result.val_loss is None:
        raise PilotError(f"pattern pilot training ended {result.status}: {result.error}")
    return trainer.model.eval()


def measure_patterns(model: Model | None, x: Tensor) -> tuple[tuple[float, ...], int]:
    """The pattern pilot's later layers' distinct patterns on ``x`` and its heads per later
    layer; ``((), 0)`` without a pattern pilot."""
    if model is None:
        return (), 0
    return layer_patterns(model, x), model.arch.layers[1].n_heads


def offset_mass(logits: Tensor) -> Tensor:
    """Per query-key distance ``j``: the attention weight summed over heads, averaged over the
    windows and the queries ``t >= j``. ``logits``: (B, H, T, T), future entries -inf; returns
    (T,) summed over the H heads (the caller divides by the layer's head count)."""
    p = torch.softmax(logits.double(), dim=-1)
    t = p.shape[-1]
    return torch.stack([torch.diagonal(p, offset=-j, dim1=-2, dim2=-1).mean(dim=(0, 2)).sum()
                        for j in range(t)])


def context_free_loss(task: Task, x: Tensor) -> float:
    """The loss of a model that ignores context, on the sample ``x``: the cross-entropy (nats)
    of each token's frequency in ``x``, or for vectors the targets' variance per coordinate."""
    if task.inputs == "tokens":
        counts = torch.bincount(x.reshape(-1)).double()
        p = counts[counts > 0] / counts.sum()
        return float(-(p * p.log()).sum())
    y = task.batch("val", SAMPLE_BATCH, len(x)).y
    return float(y.reshape(-1, y.shape[-1]).double().var(0).mean())


def pilot_task(request: PilotRequest) -> Task:
    """The data's task (``DataError`` if unusable), or the generated one at its paper size."""
    if request.data is not None:
        return make_data_task(request.data, length=request.seq_len)
    if request.task is None:
        raise PilotError("the pilot needs data or a task")
    try:
        return make_task(request.task, "paper", request.seed)
    except TaskError as err:
        raise PilotError(str(err)) from None


def input_variance(inputs: Tensor) -> np.ndarray:
    """Covariance eigenvalues, decreasing, of the (B, T, D) vectors an attention reads."""
    flat = inputs.reshape(-1, inputs.shape[-1]).double()
    flat = flat - flat.mean(0)
    eig = torch.linalg.eigvalsh(flat.T @ flat / max(len(flat) - 1, 1))
    return eig.flip(0).clamp_min(0).numpy()


def later_spectra(model: Model) -> tuple[tuple[float, ...], ...]:
    """Per later layer: its heads' query-key singular values, each head's scaled to a largest
    value of 1, averaged over the heads."""
    out, maps = [], head_maps(model)
    for i in range(1, model.arch.n_layers):
        sigmas = [m.singular_values() for m in maps if m.layer == i]
        if sigmas:
            width = min(len(s) for s in sigmas)
            mean = np.mean([s[:width] / max(float(s[0]), 1e-30) for s in sigmas], axis=0)
            out.append(tuple(float(v) for v in mean))
    return tuple(out)


def run_pilot(request: PilotRequest) -> PilotMeasurement:
    """Train the baseline on ``request.data`` and measure it (see ``alloc.profiling.pilot``).

    Raises:
        DataError: the data cannot be used; PilotError: an unknown task, or training failed.
    """
    task = pilot_task(request)
    start = time.perf_counter()
    config = TrainConfig(steps=request.steps, batch_size=request.batch_size, lr=request.lr,
                         warmup=request.warmup, eval_every=request.steps, eval_batches=8,
                         seed=request.seed, device="cpu")
    trainer = Trainer(baseline(request, task), task, config)
    result = run_with_progress(trainer, "pilot", request.quiet)
    if result.val_loss is None:
        raise PilotError(f"pilot training ended {result.status}: {result.error}")
    model = trainer.model.eval()
    pattern_model = train_pattern_pilot(request, task, config)
    windows = max(1, request.sample_tokens // task.seq_len)
    x = task.batch("val", SAMPLE_BATCH, windows).x
    measuring = time.perf_counter()
    say(f"pilot: measuring the trained pilots' attention on {windows:,} windows of "
        f"{task.seq_len} tokens", quiet=request.quiet)
    measured = record_attention(model, x, reduce=lambda z: (head_statistics(z)[0], offset_mass(z)))
    first = model.arch.layers[0]
    mass = sum(m for _, m in measured.groups[0]) / first.n_heads
    bounds = tuple(float(max(b.max() for b, _ in groups)) for groups in measured.groups[1:])
    spectra = later_spectra(model)
    patterns, pattern_heads = measure_patterns(pattern_model, x)
    say(f"pilot: measured in {duration(time.perf_counter() - measuring)}; the pilot took "
        f"{duration(time.perf_counter() - start)}", quiet=request.quiet)
    return PilotMeasurement(
        arch=model.arch.describe(), steps=result.steps, seconds=time.perf_counter() - start,
        val_loss=float(result.val_loss), unigram_loss=context_free_loss(task, x),
        sample_tokens=int(x.shape[0] * x.shape[1]),  # windows x positions (ids or vectors)
        input_variance=tuple(float(v) for v in input_variance(measured.inputs[0])),
        attention_mass=tuple(float(v) for v in mass), logit_bounds=bounds,
        spectra=spectra, patterns=patterns, pattern_heads=pattern_heads)
