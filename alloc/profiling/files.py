"""The profile file: what ``alloc.profile`` and ``workers.profile`` write with ``--out``, and
``alloc.solve --profile`` reads.

``write_profile`` writes the profile as YAML, with the per-offset kernel and the spectrum (and
with a pilot, the first layer's input variances) as one-value-per-line files beside it that
``alloc.solve --kernel file:``, ``--spectrum file:`` and ``--input-spectrum file:`` accept; its
``allocator`` section is all of it at once, read back as ``AllocatorInputs`` by
``read_allocator_inputs`` (``section_inputs`` for the section just written). ``render``
shows a profile as the commands' table, ``plot`` as a PNG.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from alloc.errors import ProfileError
from alloc.profiling.datastats import Profile, fit_kernel
from alloc.profiling.pilot import PilotMeasurement
from alloc.profiling.spectra import ENERGY
from alloc.settings import AllocatorInputs
from arch import MAX_DEPTH, kernel_shape
from arch.checks import is_int
from common.cli import render_table
from common.errors import Problem
from common.files import dump_yaml, read_yaml, write_atomic

# Beside the four every profile has.
OPTIONAL_INPUTS = {"input_spectrum", "logit_bounds", "patterns", "sources"}


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
    if chosen.patterns:
        inputs["patterns"] = [round(p, 3) for p in chosen.patterns]
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
            "patterns": list(pilot.patterns), "pattern_heads": pilot.pattern_heads,
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


def _bad(path: Path, rule: str) -> ProfileError:
    """The error for the profile file ``path`` breaking ``rule``: a problem of the field
    ``profile`` (what ``alloc.solve`` and ``workers.search`` call the file they plan with)."""
    return ProfileError.of([Problem("profile", repr(str(path)), rule)])


def read_allocator_inputs(path: Path) -> AllocatorInputs:
    """The ``allocator`` section of a profile file (``ProfileError`` if unreadable)."""
    try:
        data = read_yaml(path)
    except (OSError, yaml.YAMLError) as err:
        raise _bad(path, f"cannot read ({err})".splitlines()[0]) from None
    return section_inputs(data.get("allocator") if isinstance(data, dict) else None, path)


def section_inputs(section: Any, path: Path) -> AllocatorInputs:
    """A profile's ``allocator`` section (``to_dict``'s) as the record, its file names made
    paths beside the profile file ``path`` (``ProfileError`` naming it if malformed)."""
    keys = {"kernel", "input_dim", "seq_len", "spectrum"}
    if not isinstance(section, dict) or not keys <= set(section) \
            or not set(section) <= keys | OPTIONAL_INPUTS:
        raise _bad(path, f"needs an allocator section with {', '.join(sorted(keys))} (python "
                         "-m workers.profile --out writes it)")
    inputs = {k: v for k, v in section.items() if k != "sources"}
    for key in ("kernel", "spectrum", "input_spectrum"):
        if key in inputs and not isinstance(inputs[key], str):
            raise _bad(path, f"allocator.{key} = {inputs[key]!r}: must be text (a spec or "
                             "file:NAME)")
        if str(inputs.get(key)).startswith("file:"):
            inputs[key] = f"file:{path.parent / str(inputs[key])[5:]}"
    for key in ("input_dim", "seq_len"):
        if not (is_int(inputs[key]) and inputs[key] >= 1):
            raise _bad(path, f"allocator.{key} = {inputs[key]!r}: must be a positive integer")
    for key in ("logit_bounds", "patterns"):
        if key in inputs:
            inputs[key] = _per_layer(path, key, inputs[key])
    return AllocatorInputs(**inputs)


def _per_layer(path: Path, key: str, value: Any) -> tuple[float, ...]:
    """A per-later-layer list of positive numbers (``ProfileError`` naming it otherwise)."""
    ok = isinstance(value, list) and 0 < len(value) <= MAX_DEPTH and all(
        isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < math.inf
        for v in value)
    if not ok:
        raise _bad(path, f"allocator.{key} = {value!r}: must be a list of 1 to {MAX_DEPTH} "
                         "positive numbers")
    return tuple(float(v) for v in value)


def render(data: dict[str, Any], prog: str) -> str:
    """The profile's data (``to_dict``) as the table ``prog`` shows."""
    fits = render_table(["kernel form", "parameter", "R²"],
                        [[form, f"{f['param']:.4g}", f"{f['r2']:.3f}"]
                         for form, f in data["kernel"]["fits"].items()],
                        right=[False, True, True])
    rho = data["kernel"]["values"]
    shown = ", ".join(f"{v:.3f}" for v in rho[:8]) + (", ..." if len(rho) > 8 else "")
    lines = [f"{prog}: {data['source']} ({data['format']}), {data['sample']:,} sampled, "
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
        bounds = "".join(f" --{key.replace('_', '-')} {','.join(f'{b:g}' for b in a[key])}"
                         for key in ("logit_bounds", "patterns") if key in a)
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
