"""The allocator's inputs measured from a bounded sample of the user's data, with numpy and
SciPy (docs/theory.md §9): the memory kernel rho(s) for offsets s = 1..N, the best-fitting
parametric kernel (ngram:K, exp:LAMBDA, poly:P) with its goodness of fit, the input dimension
d_in and the teacher spectrum with its rank at 90% energy.

Tokens (a text corpus or nanoGPT .bin files): bias-corrected mutual information between x_t and
x_{t-s} over the most frequent symbols, and the singular values of the offset-1 PMI matrix.
Vector sequences (.npy): a ridge regression of the target on the lagged inputs, the per-lag share
of its coefficients, and the covariance's participation ratio. A ``Profile`` holds these
statistics and, once the torch side trained one (``workers.profile``), the pilot's measurement;
``Profile.inputs`` is what the allocator takes from it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from alloc.profiling.pilot import PilotMeasurement
from alloc.profiling.spectra import ENERGY, participation_ratio, variance_rank
from arch import kernel_shape
from common.errors import Problem
from userdata import DataError, DataSpec, open_arrays, open_tokens

TOP_K = 64  # symbols kept apart; the rest are one "other" symbol
MAX_LAGS = 32  # lags of the vector regression (its cost grows with (lags x d_in)^2)
TOKEN_SEQ_LEN = 256  # default offsets measured on tokens
TOKEN_SAMPLE = 1_000_000  # default tokens sampled
VECTOR_SAMPLE = 16_384  # default vector positions: the regression is O(n (lags d_in)^2)
RIDGE = 1e-3  # ridge penalty, relative to the mean feature variance


@dataclass(frozen=True)
class KernelFit:
    """A parametric kernel fitted to the measured one: ``form:param`` and its R²."""

    form: str
    param: float
    r2: float

    @property
    def spec(self) -> str:
        value = int(self.param) if self.form == "ngram" else round(self.param, 4)
        return f"{self.form}:{value}"


@dataclass(frozen=True)
class MeasuredInputs:
    """The allocator's inputs as measured, each with the measurement it came from in
    ``sources``: the data statistics' (``Profile.statistics``), or those a profile chose
    (``Profile.inputs``: the pilot's where it learned)."""

    kernel: np.ndarray  # rho(s), s = 1..N, largest 1
    fits: tuple[KernelFit, ...]
    input_dim: int
    spectrum: np.ndarray  # decreasing
    sources: dict[str, str]
    logit_bounds: tuple[float, ...] | None = None
    input_variance: np.ndarray | None = None  # the pilot's: the compression term uses it
    patterns: tuple[float, ...] | None = None  # per later layer, distinct attention patterns

    @property
    def best(self) -> KernelFit:
        return max(self.fits, key=lambda f: f.r2)


@dataclass(frozen=True)
class Profile:
    """What was measured on the data: its statistics and, with a pilot, the pilot's."""

    source: str
    format: str
    seq_len: int
    sample: int  # tokens (or vector positions) measured
    estimator: str
    raw: np.ndarray  # per offset: bits of mutual information, or share of variance
    statistics: MeasuredInputs  # the allocator's inputs as the data's statistics give them
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    pilot: PilotMeasurement | None = None

    @cached_property
    def inputs(self) -> MeasuredInputs:
        """What the allocator takes from this profile, and which measurement each came from
        (chosen once: the choice refits the pilot's kernel)."""
        return choose_inputs(self)

    @property
    def rank_90(self) -> int:
        """The statistics' spectrum's rank at ``ENERGY`` of its squared singular values."""
        return variance_rank(self.statistics.spectrum ** 2, ENERGY)


def choose_inputs(profile: Profile) -> MeasuredInputs:
    """The pilot's measurements where there is a pilot, except its attention kernel when the
    pilot did not beat token frequencies (its attention had learned nothing to look at)."""
    stats, pilot = profile.statistics, profile.pilot
    if pilot is None:
        return stats
    trained = f"pilot ({pilot.steps} steps)"
    sources = {"input_dim": f"{trained}: the width of layer 0's attention input",
               "input_spectrum": f"{trained}: covariance eigenvalues of layer 0's attention input "
                                 f"(participation ratio {pilot.participation_ratio:.1f}, "
                                 f"{ENERGY:.0%} of the variance in {pilot.input_rank} "
                                 f"directions, signal dimension {pilot.signal_dim})"}
    kernel, fits = stats.kernel, stats.fits
    if pilot.learned_context:
        kernel = pilot.kernel()
        fits = fit_kernel(kernel)
        sources["kernel"] = f"{trained}: layer 0's attention mass per query-key distance"
    else:
        sources["kernel"] = (f"{stats.sources['kernel']} (not the pilot's attention: its loss "
                             f"{pilot.val_loss:.3f} did not beat token frequencies' "
                             f"{pilot.unigram_loss:.3f})")
    spectrum, bounds = stats.spectrum, None
    if pilot.spectra:
        spectrum, bounds = pilot.spectrum(), pilot.logit_bounds
        sources["spectrum"] = f"{trained}: later layers' mean query-key singular values"
        sources["logit_bounds"] = f"{trained}: each later layer's largest |logit|"
    else:
        sources["spectrum"] = (f"{stats.sources['spectrum']} (a one-layer pilot has no later "
                               "layer)")
    patterns = pilot.patterns or None
    if patterns:
        sources["patterns"] = (f"{trained}, later layers of {pilot.pattern_heads} heads: the "
                               "distinct attention patterns each later layer's heads use")
    variance = np.asarray(pilot.input_variance)
    return MeasuredInputs(kernel, fits, len(variance), spectrum, sources, bounds, variance,
                          patterns)


# --- estimators -------------------------------------------------------------------------------


def token_sample(tokens: np.ndarray, count: int, chunk: int, seed: int = 0) -> np.ndarray:
    """(C, chunk) windows, about ``count`` tokens, from distinct non-overlapping slots of
    ``tokens`` (overlapping windows would count pairs twice and bias the estimates); a memory
    map is read only where the windows fall."""
    chunk = min(chunk, len(tokens))
    slots = len(tokens) // chunk
    windows = max(1, min(count // chunk, slots))
    chosen = np.sort(np.random.default_rng(seed).choice(slots, windows, replace=False))
    return np.stack([np.asarray(tokens[s * chunk:(s + 1) * chunk]) for s in chosen])


def mutual_information(sample: np.ndarray, offsets: int, top_k: int = TOP_K
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Bias-corrected mutual information in bits between x_t and x_{t-s}, s = 1..offsets,
    over the ``top_k`` most frequent symbols (the rest pooled into one more category, if there
    is a rest), and the offset-1 PMI matrix.

    The plug-in estimate exceeds the truth by about ``(K - 1)^2 / (2 n ln 2)`` bits for K
    categories and n pairs (Miller-Madow); that is subtracted, and negative values clipped.
    """
    values, counts = np.unique(sample, return_counts=True)
    top = values[np.argsort(-counts)[:top_k]]
    k = len(top) + (len(values) > len(top))  # no empty "rest" category: it would inflate K
    lookup = np.full(int(values.max()) + 1, k - 1, dtype=np.int64)
    lookup[top] = np.arange(len(top))
    ids = lookup[sample]  # (C, L) in [0, k)
    mi, pmi = np.zeros(offsets), np.zeros((k, k))
    for s in range(1, offsets + 1):
        a, b = ids[:, :-s].ravel(), ids[:, s:].ravel()
        joint = np.bincount(a * k + b, minlength=k * k).reshape(k, k).astype(np.float64)
        n = joint.sum()
        p = joint / n
        pa, pb = p.sum(1, keepdims=True), p.sum(0, keepdims=True)
        nz = p > 0
        plug_in = float((p[nz] * np.log2(p[nz] / (pa @ pb)[nz])).sum())
        mi[s - 1] = max(plug_in - (k - 1) ** 2 / (2 * n * math.log(2)), 0.0)
        if s == 1:  # smoothed so unseen pairs stay finite
            smooth = (joint + 0.5) / (n + 0.5 * k * k)
            pmi = np.log(smooth / (smooth.sum(1, keepdims=True) @ smooth.sum(0, keepdims=True)))
    return mi, pmi


def lag_regression(x: np.ndarray, y: np.ndarray, lags: int, ridge: float = RIDGE
                   ) -> np.ndarray:
    """Ridge coefficients ``C`` (lags, d_out, d_in) of ``y_t ~ sum_s C_s x_{t-s}`` (zero
    before the sequence starts), accumulated sequence by sequence."""
    n, t, d_in = x.shape
    gram = np.zeros((lags * d_in, lags * d_in))
    cross = np.zeros((lags * d_in, y.shape[2]))
    for i in range(0, n, 64):
        xs = np.asarray(x[i:i + 64], dtype=np.float32)
        feats = np.zeros((len(xs), t, lags * d_in), dtype=np.float32)
        for s in range(1, lags + 1):
            feats[:, s:, (s - 1) * d_in:s * d_in] = xs[:, :-s]
        f = feats.reshape(-1, lags * d_in)
        gram += f.T @ f  # float32 products, float64 sums across chunks
        cross += f.T @ np.asarray(y[i:i + 64], dtype=np.float32).reshape(-1, y.shape[2])
    penalty = ridge * np.trace(gram) / len(gram)
    coef = np.linalg.solve(gram + penalty * np.eye(len(gram)), cross)  # (lags*d_in, d_out)
    return coef.T.reshape(y.shape[2], lags, d_in).transpose(1, 0, 2)


def covariance_eigenvalues(x: np.ndarray) -> np.ndarray:
    """The covariance eigenvalues of the vectors in ``x`` (..., d)."""
    flat = np.asarray(x, dtype=np.float64).reshape(-1, x.shape[-1])
    return np.linalg.eigvalsh(np.cov(flat, rowvar=False))


# --- parametric fits ----------------------------------------------------------------------------


def fit_kernel(rho: np.ndarray) -> tuple[KernelFit, ...]:
    """Least-squares fits of ngram:K, exp:LAMBDA and poly:P (each with a free scale)."""
    from scipy.optimize import minimize_scalar  # 0.3 s to import: not for --help

    n = len(rho)
    total = float(((rho - rho.mean()) ** 2).sum()) or 1.0

    def sse(form: str, param: float) -> float:
        shape = kernel_shape(form, param, n)
        scale = float(rho @ shape / (shape @ shape)) if shape.any() else 0.0
        return float(((rho - scale * shape) ** 2).sum())

    ngram = min(range(1, n + 1), key=lambda k: sse("ngram", k))
    fits = [KernelFit("ngram", ngram, 1 - sse("ngram", ngram) / total)]
    for form, bounds in (("exp", (1e-4, 20.0)), ("poly", (0.0, 10.0))):
        best = minimize_scalar(lambda v, f=form: sse(f, v), bounds=bounds, method="bounded",
                               options={"xatol": 1e-6})
        fits.append(KernelFit(form, float(best.x), 1 - float(best.fun) / total))
    return tuple(fits)


# --- measuring --------------------------------------------------------------------------------


def data_statistics(spec: DataSpec, seq_len: int | None = None, sample: int | None = None,
                    seed: int = 0) -> Profile:
    """Measure the allocator's inputs on ``spec`` from its statistics (see the module
    docstring): ``seq_len`` offsets (default 256 for tokens, the sequences' length for vectors)
    on about ``sample`` tokens or vector positions drawn with ``seed``.

    Raises:
        DataError: the data cannot be used.
    """
    start = time.perf_counter()
    spec = spec.resolved()
    if spec.format == "npy":
        profile = _profile_vectors(spec, seq_len, sample or VECTOR_SAMPLE)
    else:
        profile = _profile_tokens(spec, seq_len or TOKEN_SEQ_LEN, sample or TOKEN_SAMPLE, seed)
    return dataclasses.replace(profile, wall_s=time.perf_counter() - start)


def _profile_tokens(spec: DataSpec, seq_len: int, count: int, seed: int) -> Profile:
    data = open_tokens(spec, seq_len + 1)
    windows = token_sample(data.train, count, max(4 * seq_len, 4096), seed)
    offsets = min(seq_len, windows.shape[1] - 1)
    mi, pmi = mutual_information(windows, offsets)
    # MI of a weak linear dependence grows like rho^2: the kernel is its square root (§9).
    rho = np.sqrt(mi)
    rho = rho / rho.max() if rho.max() > 0 else rho
    spectrum = np.linalg.svd(pmi, compute_uv=False)
    estimator = f"mutual information, bias-corrected, top {TOP_K} symbols"
    stats = MeasuredInputs(
        rho, fit_kernel(rho), variance_rank(spectrum ** 2, ENERGY), spectrum,
        {"kernel": estimator,
         "input_dim": f"rank at {ENERGY:.0%} energy of the offset-1 PMI matrix",
         "spectrum": "singular values of the offset-1 PMI matrix"})
    return Profile(spec.path, str(spec.format), offsets, int(windows.size), estimator, mi, stats,
                   extra={"vocab_size": data.vocab_size})


def _profile_vectors(spec: DataSpec, seq_len: int | None, count: int) -> Profile:
    data = open_arrays(spec)
    lags = min(seq_len or data.length, data.length - 1, MAX_LAGS)
    if lags < 1:
        raise DataError.of([Problem("data.path", repr(spec.path),
                                    f"sequences of {data.length} steps have no lags")])
    rows = max(2, min(len(data.x_train), count // data.length))
    coef = lag_regression(data.x_train[:rows], data.y_train[:rows], lags)
    share = (coef ** 2).sum((1, 2))
    share = share / share.sum() if share.sum() > 0 else share
    rho = np.sqrt(share)  # the share of variance grows like rho^2 (§9)
    rho = rho / rho.max() if rho.max() > 0 else rho
    stacked = coef.transpose(1, 0, 2).reshape(coef.shape[1], -1)  # (d_out, lags * d_in)
    spectrum = np.linalg.svd(stacked, compute_uv=False)
    d_in = participation_ratio(covariance_eigenvalues(data.x_train[:rows]))
    estimator = f"ridge regression on {lags} lags"
    stats = MeasuredInputs(rho, fit_kernel(rho), max(1, round(d_in)), spectrum,
                           {"kernel": estimator,
                            "input_dim": "participation ratio of the input covariance",
                            "spectrum": "singular values of the lag-regression coefficients"})
    return Profile(spec.path, "npy", lags, rows * data.length, estimator, share, stats,
                   extra={"participation_ratio": d_in, "data_input_dim": data.input_dim})
