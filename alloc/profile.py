"""python -m alloc.profile --data PATH [--out profile.yaml] | --checkpoint PATH --task lm

Measure, from a bounded sample of your data, what the allocator takes as inputs
(docs/theory.md §9): the memory kernel rho(s) for offsets s = 1..N, the best-fitting parametric
kernel (ngram:K, exp:LAMBDA, poly:P) with its goodness of fit, the input dimension d_in and the
teacher spectrum with its rank at 90% energy. Tokens (a text corpus or nanoGPT .bin files):
bias-corrected mutual information between x_t and x_{t-s} over the most frequent symbols, and
the singular values of the offset-1 PMI matrix. Vector sequences (.npy): a ridge regression of
the target on the lagged inputs, the per-lag share of its coefficients, and the covariance's
participation ratio. ``--out`` writes the profile as YAML, with the per-offset kernel and the
spectrum as one-value-per-line files beside it that ``alloc.solve --kernel file:`` and
``--spectrum file:`` accept; ``alloc.solve --profile profile.yaml`` takes all of it at once.
With ``--checkpoint`` it profiles a trained model instead (docs/theory.md §10): per head the
spectrum of its query-key map and, on a sample of ``--data`` or of ``--task`` (the trainer's
task flags), its logit bound and attention entropy, and the per-layer plan of reduced ``qk_dim``
(``alloc.compression``) that ``python -m workers.compress`` builds. The model runs on the torch
side (``workers.measure``), reached through its entry point: this module imports no torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from alloc.compression import (
    RULES,
    MeasureRequest,
    load_measurer,
    plan_compression,
    plan_for_kv_cache,
    plot_plan,
    render_plan,
)
from alloc.pilot import (
    MAX_PILOT_MLP_RATIO,
    MAX_PILOT_STEPS,
    MAX_PILOT_WIDTH,
    PilotMeasurement,
    PilotRequest,
    load_pilot,
)
from alloc.spectra import ENERGY, participation_ratio, variance_rank
from arch.config import MAX_DEPTH
from arch.kernels import kernel_shape
from common.cli import (
    Parser,
    add_format,
    check_writable,
    dump,
    fail,
    int_in,
    number,
    parse_task_params,
    render_table,
    wrote,
)
from common.errors import TransformerAllocError, UsageError
from common.files import dump_yaml, read_yaml, write_atomic
from common.progress import say
from userdata import DataError, DataSpec, add_data_args, data_spec, open_arrays, open_tokens
from userdata.cli import DATA_HELP

DEFAULT_TOLERANCE = 0.05  # --checkpoint: the allowed error per head group
PROG = "alloc.profile"
TOP_K = 64  # symbols kept apart; the rest are one "other" symbol
MAX_LAGS = 32  # lags of the vector regression (its cost grows with (lags x d_in)^2)
VECTOR_SAMPLE = 16_384  # default vector positions: the regression is O(n (lags d_in)^2)
RIDGE = 1e-3  # ridge penalty, relative to the mean feature variance


OPTIONAL_INPUTS = {"input_spectrum", "logit_bounds", "sources"}  # beside the four every profile has


class ProfileError(TransformerAllocError):
    """A profile file that cannot be used."""


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
    variance = np.asarray(pilot.input_variance)
    return MeasuredInputs(kernel, fits, len(variance), spectrum, sources, bounds, variance)


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


# --- profiling ----------------------------------------------------------------------------------


def profile_data(spec: DataSpec, seq_len: int | None = None, sample: int | None = None,
                 seed: int = 0, pilot: PilotRequest | None = None,
                 on_pilot: Callable[[PilotRequest], None] | None = None) -> Profile:
    """Measure the allocator's inputs on ``spec`` (see the module docstring); with ``pilot``
    (token data only) also train and measure the pilot (``alloc.pilot``), in windows of the
    profile's ``seq_len``, calling ``on_pilot`` once the data's statistics are measured.

    Raises:
        DataError: the data cannot be used; PilotError: the pilot cannot run.
    """
    start = time.perf_counter()
    spec = spec.resolved()
    if spec.format == "npy":
        profile = _profile_vectors(spec, seq_len, sample or VECTOR_SAMPLE)
    else:
        profile = _profile_tokens(spec, seq_len or 256, sample or 1_000_000, seed)
        if pilot is not None:
            request = dataclasses.replace(pilot, data=spec, seq_len=profile.seq_len, seed=seed)
            run = load_pilot()
            if on_pilot is not None:
                on_pilot(request)
            profile = dataclasses.replace(profile, pilot=run(request))
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
        raise DataError(f"--data {spec.path!r}: sequences of {data.length} steps have no lags")
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


# --- output -------------------------------------------------------------------------------------


def allocator_inputs(profile: Profile, kernel_file: str, spectrum_file: str,
                     input_file: str = "") -> dict[str, Any]:
    """What ``alloc.solve --profile`` takes: the chosen kernel (its best parametric fit if it
    fits, R² >= 0.9, else the measured values), the input dimension, the sequence length, the
    spectrum, the later layers' logit bounds when a pilot measured them, and ``sources``: which
    measurement each input came from."""
    chosen = profile.inputs
    best = chosen.best
    inputs: dict[str, Any] = {
        "kernel": best.spec if best.r2 >= 0.9 else f"file:{kernel_file}",
        "input_dim": chosen.input_dim, "seq_len": profile.seq_len,
        "spectrum": f"file:{spectrum_file}"}
    if chosen.input_variance is not None:
        inputs["input_spectrum"] = f"file:{input_file}"
    if chosen.logit_bounds:
        inputs["logit_bounds"] = [round(b, 4) for b in chosen.logit_bounds]
    return {**inputs, "sources": chosen.sources}


def pilot_dict(pilot: PilotMeasurement) -> dict[str, Any]:
    kernel = pilot.kernel()
    return {"arch": pilot.arch, "steps": pilot.steps, "seconds": round(pilot.seconds, 2),
            "val_loss": pilot.val_loss, "unigram_loss": pilot.unigram_loss,
            "learned_context": pilot.learned_context, "sample_tokens": pilot.sample_tokens,
            "input_rank_90": pilot.input_rank, "signal_dim": pilot.signal_dim,
            "participation_ratio": round(pilot.participation_ratio, 3),
            "input_variance": [float(v) for v in pilot.input_variance],
            "attention_kernel": {
                "fits": {f.form: {"param": f.param, "r2": f.r2} for f in fit_kernel(kernel)},
                "values": [float(v) for v in kernel]},
            "logit_bounds": list(pilot.logit_bounds),
            "spectrum": [float(v) for v in pilot.spectrum()]}


def to_dict(profile: Profile, kernel_file: str = "", spectrum_file: str = "",
            input_file: str = "") -> dict[str, Any]:
    stats = profile.statistics
    data: dict[str, Any] = {
        "source": profile.source, "format": profile.format, "seq_len": profile.seq_len,
        "sample": profile.sample, "wall_s": round(profile.wall_s, 3),
        "kernel": {"estimator": profile.estimator, "best": stats.best.spec,
                   "fits": {f.form: {"param": f.param, "r2": f.r2} for f in stats.fits},
                   "values": [float(v) for v in stats.kernel], "raw": [
                       float(v) for v in profile.raw]},
        "input_dim": stats.input_dim,
        "spectrum": {"rank_90": profile.rank_90,
                     "values": [float(v) for v in stats.spectrum]},
        **profile.extra}
    if profile.pilot is not None:
        data["pilot"] = pilot_dict(profile.pilot)
    if kernel_file:
        data["kernel"]["file"] = kernel_file
        data["spectrum"]["file"] = spectrum_file
        data["allocator"] = allocator_inputs(profile, kernel_file, spectrum_file, input_file)
    return data


def write_profile(profile: Profile, out: Path) -> tuple[dict[str, Any], list[Path]]:
    """``out`` (YAML) and, beside it, ``<stem>.kernel.txt`` and ``<stem>.spectrum.txt`` (the
    kernel and spectrum the allocator is given) and, with a pilot, ``<stem>.input.txt`` (the
    first layer's input variances); returns the profile's data and the files written."""
    kernel, spectrum = out.with_suffix(".kernel.txt"), out.with_suffix(".spectrum.txt")
    chosen, inputs = profile.inputs, out.with_suffix(".input.txt")
    _write_values(kernel, "rho(s), s = 1, 2, ...", chosen.sources["kernel"], chosen.kernel)
    _write_values(spectrum, "singular values, decreasing", chosen.sources["spectrum"],
                  chosen.spectrum)
    written = [out, kernel, spectrum]
    if chosen.input_variance is not None:
        _write_values(inputs, "variances, decreasing", chosen.sources["input_spectrum"],
                      chosen.input_variance)
        written.append(inputs)
    data = to_dict(profile, kernel.name, spectrum.name, inputs.name)
    write_atomic(out, dump_yaml(data))
    return data, written


def _write_values(path: Path, what: str, source: str, values: np.ndarray) -> None:
    """One value per line, as ``file:`` inputs are read, under a comment saying what they are."""
    write_atomic(path, f"# {what} (alloc.profile: {source})\n"
                 + "".join(f"{v:.8g}\n" for v in values))


def read_allocator_inputs(path: Path) -> dict[str, Any]:
    """The ``allocator`` section of a profile, file paths made absolute (``ProfileError``)."""
    try:
        data = read_yaml(path)
    except (OSError, yaml.YAMLError) as err:
        raise ProfileError(f"--profile {str(path)!r}: cannot read ({err})".splitlines()[0]) \
            from None
    inputs = data.get("allocator") if isinstance(data, dict) else None
    keys = {"kernel", "input_dim", "seq_len", "spectrum"}
    if not isinstance(inputs, dict) or not keys <= set(inputs) \
            or not set(inputs) <= keys | OPTIONAL_INPUTS:
        raise ProfileError(f"--profile {str(path)!r}: needs an allocator section with "
                           f"{', '.join(sorted(keys))} (python -m alloc.profile --out writes it)")
    inputs = {k: v for k, v in inputs.items() if k != "sources"}
    for key in ("kernel", "spectrum", "input_spectrum"):
        if str(inputs.get(key)).startswith("file:"):
            inputs[key] = f"file:{path.parent / str(inputs[key])[5:]}"
    if "logit_bounds" in inputs:
        inputs["logit_bounds"] = _logit_bounds(path, inputs["logit_bounds"])
    return dict(inputs)


def _logit_bounds(path: Path, value: Any) -> tuple[float, ...]:
    ok = isinstance(value, list) and 0 < len(value) <= MAX_DEPTH and all(
        isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < math.inf
        for v in value)
    if not ok:
        raise ProfileError(f"--profile {str(path)!r}: allocator.logit_bounds = {value!r}: must "
                           f"be a list of 1 to {MAX_DEPTH} positive numbers")
    return tuple(float(v) for v in value)


def render(data: dict[str, Any]) -> str:
    fits = render_table(["kernel form", "parameter", "R²"],
                        [[form, f"{f['param']:.4g}", f"{f['r2']:.3f}"]
                         for form, f in data["kernel"]["fits"].items()],
                        right=[False, True, True])
    rho = data["kernel"]["values"]
    shown = ", ".join(f"{v:.3f}" for v in rho[:8]) + (", ..." if len(rho) > 8 else "")
    lines = [f"{PROG}: {data['source']} ({data['format']}), {data['sample']:,} sampled, "
             f"seq_len {data['seq_len']}, {data['wall_s']:.2f} s",
             f"kernel ({data['kernel']['estimator']}): rho(1..) = {shown}", fits,
             f"best fit: {data['kernel']['best']}",
             f"input dimension d_in: {data['input_dim']} (spectrum rank at 90% energy "
             f"{data['spectrum']['rank_90']} of {len(data['spectrum']['values'])})"]
    if "pilot" in data:
        p = data["pilot"]
        rho = ", ".join(f"{v:.3f}" for v in p["attention_kernel"]["values"][:8])
        lines.append(f"pilot: {p['arch']}, {p['steps']} steps in {p['seconds']:.1f} s, "
                     f"validation loss {p['val_loss']:.3f} (token frequencies "
                     f"{p['unigram_loss']:.3f}); layer-0 input: 90% of the variance in "
                     f"{p['input_rank_90']} directions, participation ratio "
                     f"{p['participation_ratio']:.1f}, signal dimension {p['signal_dim']}; "
                     f"attention "
                     f"rho(1..) = {rho}, ...")
    if "allocator" in data:
        a = data["allocator"]
        bounds = (f" --logit-bounds {','.join(f'{b:g}' for b in a['logit_bounds'])}"
                  if "logit_bounds" in a else "")
        given = f" --input-spectrum {a['input_spectrum']}" if "input_spectrum" in a else ""
        lines.append(f"allocator inputs: --kernel {a['kernel']} --input-dim {a['input_dim']} "
                     f"--seq-len {a['seq_len']} --spectrum {a['spectrum']}{given}{bounds}")
        lines += [f"  {key}: {source}" for key, source in a["sources"].items()]
    return "\n".join(lines)


def plot(profile: Profile, path: Path) -> None:
    from common.plots import new_figure, write_figure

    stats = profile.statistics
    fig, axes = new_figure(2, (11, 4.2))
    s = np.arange(1, len(stats.kernel) + 1, dtype=np.float64)
    axes[0].loglog(s, np.maximum(stats.kernel, 1e-4), "k.", label="measured rho(s)")
    for fit in stats.fits:
        shape = kernel_shape(fit.form, fit.param, len(s))
        scale = float(stats.kernel @ shape / (shape @ shape)) if shape.any() else 0.0
        axes[0].loglog(s, np.maximum(scale * shape, 1e-4), label=f"{fit.spec} (R² {fit.r2:.2f})")
    axes[0].set_xlabel("offset s")
    axes[0].set_ylabel("rho(s), largest = 1 (floor 1e-4)")
    axes[0].set_title(f"memory kernel ({profile.estimator})")
    axes[0].legend(fontsize=8)
    energy = np.cumsum(stats.spectrum ** 2) / max((stats.spectrum ** 2).sum(), 1e-300)
    axes[1].plot(np.arange(1, len(energy) + 1), energy, "o-", ms=3)
    axes[1].axhline(ENERGY, color="k", ls=":")
    axes[1].axvline(profile.rank_90, color="C3", ls="--", label=f"rank {profile.rank_90}")
    axes[1].set_xlabel("number of singular values r")
    axes[1].set_ylabel("share of squared singular values")
    axes[1].set_title("teacher spectrum: energy captured")
    axes[1].legend(fontsize=8)
    write_figure(fig, path)


# --- command line -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[1])
    add_data_args(p, data_help=f"{DATA_HELP} (with --checkpoint: the sample the model is "
                                "measured on)")
    p.add_argument("--checkpoint", type=Path,
                   help="profile a trained model instead (a workers.train .pt, or a GPT-2 "
                        "layout folder: config.json + model.safetensors; docs/theory.md §10)")
    p.add_argument("--task", help="--checkpoint: measure on a sample of this generated task "
                                  "(as workers.train --task), in windows of the model's length")
    p.add_argument("--task-param", action="append", default=[], metavar="KEY=VALUE",
                   help="--checkpoint: override a task parameter (repeatable)")
    p.add_argument("--smoke-test", action="store_true", help="--checkpoint: --task at its "
                                                             "smoke size")
    p.add_argument("--tolerance", type=number(0, strict=True),
                   help=f"--checkpoint: allowed error per head group under --rule (default "
                        f"{DEFAULT_TOLERANCE}; with --rule loss, nats per token)")
    p.add_argument("--align", type=int_in(1), default=8,
                   help="--checkpoint: reduced qk_dim are multiples of this")
    p.add_argument("--rule", choices=RULES,
                   help="--checkpoint: what decides each reduced qk_dim: the saturation rule's "
                        "bound (docs/theory.md §4), the attention error measured on the sample, "
                        "or the sample's loss increase with each head group alone cut (loss: "
                        "one forward per group and candidate; token models) (default: measured "
                        "with a sample, else bound)")
    p.add_argument("--kv-cache", type=number(0, strict=True), metavar="FRACTION",
                   help="--checkpoint: instead of --tolerance, the student's KV cache per token "
                        "as a fraction of the teacher's (e.g. 0.75), spent where the rule's "
                        "error is largest (docs/theory.md §10.3)")
    p.add_argument("--logit-bound", type=number(0, strict=True),
                   help="--checkpoint without --data: assume |logits| <= R (default: none, "
                        "||J|| <= 1/2)")
    p.add_argument("--seq-len", type=int_in(1), help="offsets measured (default: 256 for "
                                                     "tokens, the sequences' length for npy)")
    p.add_argument("--sample-tokens", type=int_in(1000),
                   help=f"tokens (or vector positions) sampled (default: 1,000,000 tokens, "
                        f"{VECTOR_SAMPLE:,} vector positions; with --checkpoint, 32,768 tokens "
                        "in windows of the model's length)")
    p.add_argument("--seed", type=int_in(0), default=0,
                   help="where the sample is drawn (and the pilot's seed)")
    pilot = p.add_argument_group("pilot (token data; docs/theory.md §9.2)")
    pilot.add_argument("--pilot-steps", type=int_in(1, MAX_PILOT_STEPS),
                       help=f"train the uniform baseline this many steps and measure the "
                            f"allocator's inputs as it sees them (default: "
                            f"{PilotRequest.steps} for token data)")
    pilot.add_argument("--no-pilot", action="store_true",
                       help="only the data statistics (mutual information, PMI rank)")
    pilot.add_argument("--budget", type=int_in(1, MAX_PILOT_WIDTH),
                       help=f"the pilot's width D (use your search's; default "
                            f"{PilotRequest.budget})")
    pilot.add_argument("--layers", type=int_in(1, MAX_DEPTH),
                       help=f"the pilot's depth (use your search's; default "
                            f"{PilotRequest.layers})")
    pilot.add_argument("--mlp-ratio", type=number(0),
                       help=f"the pilot's MLP ratio (default {PilotRequest.mlp_ratio:g})")
    p.add_argument("--out", type=Path, help="write the profile YAML (and its kernel and "
                                            "spectrum files beside it)")
    p.add_argument("--plot", type=Path, help="write the kernel and spectrum plot (PNG)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress on stderr (the pilot's or the checkpoint's measurement: a "
                        "bar on a terminal, else a line per milestone); errors, warnings and "
                        "the result still print")
    add_format(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        for flag, path in (("--out", args.out), ("--plot", args.plot)):
            if path is not None:
                check_writable(flag, path)
        if args.checkpoint is not None:
            return _main_checkpoint(args)
        _check_data_flags(args)
        spec = data_spec(args)
        assert spec is not None  # _check_data_flags
        profile = profile_data(spec, args.seq_len, args.sample_tokens, args.seed,
                               pilot_request(args, spec), announce)
    except TransformerAllocError as err:
        return fail(PROG, str(err))
    data, written = write_profile(profile, args.out) if args.out else (to_dict(profile), [])
    if args.plot is not None:
        plot(profile, args.plot)
        written.append(args.plot)
    wrote(PROG, *written)
    print(render(data) if args.format == "table" else dump(data, args.format))
    return 0


def announce(pilot: PilotRequest) -> None:
    """The pilot takes seconds to minutes: say what is running (stderr; its own progress
    follows), unless ``--quiet``."""
    say(f"{PROG}: pilot: training the baseline at D = {pilot.budget}, {pilot.layers} "
        f"layer(s), {pilot.steps} steps (--no-pilot skips it)", quiet=pilot.quiet)


def pilot_request(args: argparse.Namespace, spec: DataSpec) -> PilotRequest | None:
    """The pilot the flags ask for: on by default for token data, refused for vectors."""
    if args.no_pilot:
        if args.pilot_steps is not None:
            raise UsageError("--pilot-steps and --no-pilot: give one")
        return None
    if spec.resolved().format == "npy":
        if args.pilot_steps is not None:
            raise UsageError(f"--pilot-steps {args.pilot_steps}: the pilot trains a language "
                             "model on token data; vector sequences (.npy) are profiled by "
                             "regression")
        return None
    d = PilotRequest
    mlp_ratio = d.mlp_ratio if args.mlp_ratio is None else args.mlp_ratio
    if mlp_ratio > MAX_PILOT_MLP_RATIO:
        raise UsageError(f"--mlp-ratio {mlp_ratio:g}: must be <= {MAX_PILOT_MLP_RATIO} for "
                         "the pilot")
    return PilotRequest(spec, budget=args.budget or d.budget, layers=args.layers or d.layers,
                        mlp_ratio=mlp_ratio, steps=args.pilot_steps or d.steps,
                        quiet=args.quiet)


PILOT_FLAGS = ("--pilot-steps", "--no-pilot", "--budget", "--layers", "--mlp-ratio")


def _pilot_flags_given(args: argparse.Namespace) -> list[str]:
    values = (args.pilot_steps, args.no_pilot or None, args.budget, args.layers, args.mlp_ratio)
    return [flag for flag, value in zip(PILOT_FLAGS, values) if value is not None]


def _check_data_flags(args: argparse.Namespace) -> None:
    checkpoint_only = [flag for flag, given in (("--task", args.task),
                                                ("--task-param", args.task_param),
                                                ("--smoke-test", args.smoke_test),
                                                ("--rule", args.rule),
                                                ("--tolerance", args.tolerance is not None),
                                                ("--kv-cache", args.kv_cache)) if given]
    if checkpoint_only:
        raise UsageError(f"{checkpoint_only[0]}: only with --checkpoint (a data profile "
                         "measures --data)")
    if args.data is None:
        raise UsageError("--data or --checkpoint: one is required")


def _main_checkpoint(args: argparse.Namespace) -> int:
    """``--checkpoint``: measure the model (torch side), plan, write and show the plan."""
    if args.data is not None and args.task is not None:
        raise UsageError("--data and --task: give one sample source")
    if args.rule in ("measured", "loss") and args.data is None and args.task is None:
        raise UsageError(f"--rule {args.rule}: measures on a sample; give --data or --task")
    if args.kv_cache is not None and args.tolerance is not None:
        raise UsageError(f"--kv-cache {args.kv_cache:g} and --tolerance {args.tolerance:g}: the "
                         "plan meets one of them; give one")
    given = _pilot_flags_given(args)
    if given:
        raise UsageError(f"{given[0]}: the pilot profiles data (--data without --checkpoint); "
                         "a --checkpoint profile measures the trained model itself")
    request = MeasureRequest(args.checkpoint, args.align, data=data_spec(args), task=args.task,
                             task_params=parse_task_params(args.task_param),
                             smoke_test=args.smoke_test, seq_len=args.seq_len,
                             sample_tokens=args.sample_tokens, seed=args.seed,
                             loss_sensitivity=args.rule == "loss", quiet=args.quiet)
    tolerance = DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance
    plan = plan_compression(load_measurer()(request), tolerance, args.rule, args.logit_bound)
    if args.kv_cache is not None:
        plan = plan_for_kv_cache(plan, args.kv_cache)
    if not plan.measured and not plan.reduces:
        print(f"{PROG}: no reduction can be planned without data: the bound alone allows none "
              "at these norms; give --task or --data to measure the logits (or --logit-bound "
              "R to assume them)", file=sys.stderr)
    if args.out is not None:
        write_atomic(args.out, plan.to_yaml())
        wrote(PROG, args.out)
    if args.plot is not None:
        plot_plan(plan, args.plot)
        wrote(PROG, args.plot)
    print(render_plan(plan) if args.format == "table" else dump(plan.to_dict(), args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
