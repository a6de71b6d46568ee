"""What the torch side measures of a trained model, as typed records: ``workers.profile`` asks
``workers.compression.measure.measure_checkpoint`` with a ``MeasureRequest`` and gets a
``CheckpointMeasurement``, which the planner (torch-free) reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from alloc.compression.forms import FormName
from arch import ArchConfig
from userdata import TaskSpec


@dataclass(frozen=True)
class HeadStats:
    """One head on the data sample: its largest |logit|, and its mean attention entropy over
    ``ln N`` (1: uniform attention, 0: one key)."""

    logit_bound: float
    entropy: float


@dataclass(frozen=True)
class HeadMeasurement:
    """One query-key head: the singular values of ``M_h = W_Q,h W_K,h^T / sqrt(qk_dim)`` and,
    with a data sample, the largest attention-weight change measured at each candidate rank.

    A RoPE head has no such matrix (docs/theory.md §10.2): ``pairs`` is the order in which a
    student keeps its key/value head's frequency pairs, ``sigma`` each pair's logit bound in that
    order (split over its two dims, so that the tail beyond rank ``r`` is what dropping all but
    the leading ``r / 2`` pairs can change), and the errors are of keeping those pairs."""

    group: int
    head: int
    sigma: tuple[float, ...]
    measured_errors: Mapping[int, float] | None = None
    pairs: tuple[int, ...] = ()


@dataclass(frozen=True)
class LayerMeasurement:
    """One layer: its query-key heads (none for MSSA and MixiT), the largest attention-input
    norm (measured, or bounded from the norm's parameters without data), and per-head logit
    statistics on the sample."""

    index: int
    heads: tuple[HeadMeasurement, ...]
    token_norm: float
    head_stats: tuple[HeadStats, ...] = ()
    # per head group: candidate qk_dim -> the sample's next-token loss increase (nats per token)
    # when only this group is cut to it (token models, when asked for: one forward each)
    loss_increases: tuple[Mapping[int, float], ...] = ()
    # the same for each candidate v_dim (mhsa layers, with the loss rule): the group's values
    # alone cut, by the SVD weighted with ``input_scale``
    value_losses: tuple[Mapping[int, float], ...] = ()
    input_scale: tuple[float, ...] = ()  # the RMS of each attention input feature (d [+ 1])
    # candidate latent width -> the loss increase with this layer alone made latent (mhsa
    # layers, when a latent student is asked for; docs/theory.md §10.5)
    latent_losses: Mapping[int, float] | None = None


@dataclass(frozen=True)
class CheckpointMeasurement:
    """Everything planning needs of a trained model."""

    arch: ArchConfig
    seq_len: int  # N of the saturation rule: the sample's window, or the model's length
    align: int  # the candidate qk_dims measured are multiples of it
    layers: tuple[LayerMeasurement, ...]
    sample: str | None = None  # what was sampled ("--task lm", "--data x.txt"); None: no data
    checkpoint: str = ""
    layout: str = ""
    # the student form measured (``alloc.compression.forms``) and a latent form's layout and
    # fit (``latent_losses`` are for these): the decoupled RoPE part per key/value head, and how
    # the maps are fitted (schema.CompressionPlan.latent_fit)
    form: FormName = "compact"
    rope_dim: int = 0
    latent_fit: str = ""

    @property
    def measured(self) -> bool:
        return self.sample is not None


@dataclass(frozen=True)
class MeasureRequest:
    """What to measure: a checkpoint, on a sample of the ``task`` (the user's data or a
    generated task; naming none: spectra and norm bounds only)."""

    checkpoint: Path
    align: int = 8
    # the sample's task or data (naming none: spectra and norm bounds only)
    task: TaskSpec = field(default_factory=TaskSpec)
    seq_len: int | None = None  # sample window (default: the model's max_seq_len)
    sample_tokens: int | None = None
    loss_sensitivity: bool = False  # also each group's loss increase at each candidate
    # the student form planned (``alloc.compression.forms``): with loss_sensitivity, a latent
    # form measures each mhsa layer's loss increase at each latent width instead
    form: FormName = "compact"
    # a latent plan's loss increases: estimated to second order from one forward and backward
    # pass ("curvature", docs/theory.md §10.6), or measured, one forward per layer and width
    # ("forwards", §10.5)
    estimate: str = "curvature"
    rope_dim: int = 0  # a latent student's decoupled RoPE part per key/value head
    quiet: bool = False  # no progress on stderr
