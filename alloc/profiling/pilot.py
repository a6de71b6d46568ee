"""The pilot: the allocator's inputs as a trained model sees them (docs/theory.md §9.2).

Statistics of the raw tokens (mutual information, the rank of the offset-1 PMI matrix) say what
the data holds, not what a model of width D hands its first attention. The pilot trains the
uniform baseline (``D/64`` heads of 64 per layer) for a few hundred steps at the search's width,
depth, MLP and window, then measures on a held-out sample: the covariance spectrum of the
normalised vectors layer 0's attention reads (participation ratio and 90%-energy rank: the input
dimension ``d_in``), the attention mass layer 0 puts at each query-key distance (a memory
kernel), and each later layer's logit bound ``R`` and query-key singular values (the
saturation rule's inputs, as ``--checkpoint`` profiles measure them). This module holds the
typed request and result, with no torch; ``workers.pilot.run_pilot`` trains and measures,
and ``python -m workers.profile --data`` runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from alloc.profiling.spectra import ENERGY, participation_ratio, signal_dim, variance_rank
from userdata import DataSpec

MAX_PILOT_STEPS = 100_000
MAX_PILOT_WIDTH = 4096
MAX_PILOT_MLP_RATIO = 16


@dataclass(frozen=True)
class PilotRequest:
    """What to train and measure: the baseline at ``budget`` x ``layers`` with ``mlp_ratio``,
    ``steps`` of AdamW on windows of ``seq_len`` of ``data`` (or of the generated ``task``, at
    its paper size); ``quiet``: no progress on stderr."""

    data: DataSpec | None
    task: str | None = None
    budget: int = 128
    layers: int = 2
    mlp_ratio: float = 2.0
    seq_len: int = 64
    steps: int = 300
    batch_size: int = 16
    lr: float = 3e-3
    # The pilot's own warmup, not the training recipe's (arch.training.WARMUP, 20%): a 300-step
    # measurement run, validated at 5% (tests/test_pilot.py: a 4-bit corpus's embedding reads 4
    # dimensions at 5% warmup, 10 at 20%, where the spectrum has not yet settled).
    warmup: float = 0.05
    seed: int = 0
    sample_tokens: int = 16_384
    quiet: bool = False


@dataclass(frozen=True)
class PilotMeasurement:
    """What the pilot measured (typed: the boundary between the torch side and the profile).

    ``input_variance``: the covariance eigenvalues of layer 0's attention input, decreasing.
    ``attention_mass``: the mean attention weight layer 0 puts at query-key distance
    ``j = 0..N-1`` (over heads, windows and the queries that have a key that far back).
    ``logit_bounds``, ``spectra``: per later layer, the largest |logit| of any head on the
    sample, and the mean over its heads of the query-key singular values (each head's scaled to
    a largest value of 1).
    ``patterns``: per later layer, the distinct attention patterns its heads use
    (``alloc.profiling.patterns.distinct_patterns``), measured on a second pilot whose later layers
    have ``pattern_heads`` narrow heads, room for as many patterns as the data asks for."""

    arch: str
    steps: int
    seconds: float
    val_loss: float
    # The loss without context: token frequencies' cross-entropy, or the targets' variance.
    unigram_loss: float
    sample_tokens: int
    input_variance: tuple[float, ...]
    attention_mass: tuple[float, ...]
    logit_bounds: tuple[float, ...]
    spectra: tuple[tuple[float, ...], ...]
    patterns: tuple[float, ...] = ()
    pattern_heads: int = 0

    @property
    def participation_ratio(self) -> float:
        return participation_ratio(self.input_variance)

    @property
    def input_rank(self) -> int:
        """Fewest covariance directions holding ``ENERGY`` of the input's variance."""
        return variance_rank(self.input_variance, ENERGY)

    @property
    def signal_dim(self) -> int:
        """The dimension of a signal standing above a floor
        (``alloc.profiling.spectra.signal_dim``)."""
        return signal_dim(self.input_variance, ENERGY)

    @property
    def learned_context(self) -> bool:
        """The pilot predicts better than without context (token frequencies, or the mean
        target): its attention has learned where to look."""
        return self.val_loss < self.unigram_loss

    def kernel(self) -> np.ndarray:
        """``rho(s)``, s = 1..N, largest 1: the attention mass at distance ``s - 1`` (the token
        ``s`` places before the predicted one is ``s - 1`` before the query)."""
        mass = np.asarray(self.attention_mass, dtype=np.float64)
        return mass / mass.max() if mass.max() > 0 else mass

    def spectrum(self) -> np.ndarray:
        """The later layers' mean query-key spectrum (largest 1), or empty with one layer."""
        if not self.spectra:
            return np.zeros(0)
        width = min(len(s) for s in self.spectra)
        return np.mean([np.asarray(s[:width]) for s in self.spectra], axis=0)
