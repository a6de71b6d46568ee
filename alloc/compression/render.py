"""Showing a ``CompressionPlan``: ``render_plan`` (the table a command prints) and ``plot_plan``
(``heads.png``: spectra, chosen ``qk_dim`` per group, the error of every candidate)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from alloc.compression.schema import CompressionPlan, GroupPlan
from common.cli import render_table
from common.plots import new_figure, write_figure


def render_plan(plan: CompressionPlan) -> str:
    """The plan as a table: per layer what was measured and each group's decision."""
    rows, form = [], plan.form
    for layer in plan.layers:
        decisions = "  ".join(
            f"{g.count}x{g.qk_dim}->{g.reduced_qk_dim} (bound {g.error_bound:.3g}"
            + (f", measured {g.measured_error:.3g}" if g.measured_error is not None else "")
            + (f", loss {g.loss_increase:+.3g}" if g.loss_increase is not None else "")
            + ")" + _values(g) for g in layer.groups) or "-"
        decisions = form.describe(layer) or decisions
        ranks = ",".join(str(s.effective_rank) for s in layer.spectra) or "-"
        rows.append([layer.index, layer.attention, layer.heads, _fmt(layer.logit_bound),
                     _fmt(layer.token_norm), _fmt(layer.entropy), ranks, decisions])
    target = ("tolerance" if plan.kv_cache is None else
              f"KV cache {plan.kv_cache:g} of the teacher's, worst")
    head = (f"checkpoint profile: N = {plan.seq_len}, {target} {plan.tolerance:.3g} on the "
            f"{plan.rule} error, sample: "
            + (plan.sample or "none (||J|| <= 1/2, norms bounded from the norm layers)"))
    table = render_table(["layer", "attention", "heads", "R", "max |x|", "entropy/ln N",
                          "effective ranks", "qk_dim plan (errors)"], rows,
                         right=[True, False, False, True, True, True, False, False])
    return f"{head}\n{table}"


def _values(g: GroupPlan) -> str:
    """A group's value decision, where the values were planned."""
    if g.value_loss is None:
        return ""
    return f" v {g.v_dim}->{g.student_v_dim} (loss {g.value_loss:+.3g})"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


# What each rule's error is, on the plot's axis.
RULE_AXES = {"bound": "attention weight change (bound)",
             "measured": "attention weight change\n(solid: measured, dotted: bound)",
             "loss": "sample loss increase (nats per token)"}


def plot_plan(plan: CompressionPlan, path: Path) -> None:
    """``heads.png``: every head's query-key spectrum; per layer the chosen ``qk_dim`` against
    the teacher's (a latent plan: the units each layer caches per token); and the error of
    each candidate ``qk_dim`` (a latent plan: the loss of each latent width) against the
    tolerance, the chosen one marked (solid: measured on the sample, dotted: the bound).
    Layers are told apart by one colour scale with its bar beside the panels, not by legends,
    so that a 30-layer plan reads as well as a 3-layer one."""
    fig, axes = new_figure(3, (17, 4.8))
    colors = _layer_colors(fig, axes, len(plan.layers))
    _plot_spectra(axes[0], plan, colors)
    if plan.form.latent:
        _plot_units(axes[1], plan, colors)
        _plot_latent_losses(axes[2], plan, colors)
    else:
        _plot_dims(axes[1], plan, colors)
        _plot_errors(axes[2], plan, colors)
    write_figure(fig, path)


Colors = list[Any]

FEW_LAYERS = 12  # up to this many, every layer is labelled on the axes; beyond, every 5th


def _layer_colors(fig: Any, axes: Any, n: int) -> Colors:
    """One colour per layer from a sequential scale, and its colour bar beside the panels."""
    import matplotlib as mpl

    cmap = mpl.colormaps["viridis"]
    norm = mpl.colors.Normalize(-0.5, n - 0.5)
    bar = fig.colorbar(mpl.cm.ScalarMappable(norm=norm, cmap=cmap), ax=list(axes),
                       pad=0.01, fraction=0.02, label="layer")
    bar.set_ticks(_layer_ticks(n))
    return [cmap(norm(i)) for i in range(n)]


def _layer_ticks(n: int) -> list[int]:
    return list(range(n)) if n <= FEW_LAYERS else list(range(0, n, 5))


def _plot_spectra(ax: Any, plan: CompressionPlan, colors: Colors) -> None:
    for k, layer in enumerate(plan.layers):
        for spectrum in layer.spectra:
            sigma = np.maximum(np.asarray(spectrum.sigma), 1e-12)
            ax.semilogy(np.arange(1, len(sigma) + 1), sigma, color=colors[k], alpha=0.6,
                        lw=0.8)
    ax.set_xlabel("singular value index i")
    ax.set_ylabel("sigma_i of W_Q,h W_K,h^T / sqrt(d_qk) (floor 1e-12)")
    ax.set_title("query-key spectrum of every head\n(colour: layer)")


def _plot_dims(ax: Any, plan: CompressionPlan, colors: Colors) -> None:
    """Bars per head group: the teacher's ``qk_dim`` (outline) and the chosen one (filled)."""
    few = len(plan.layers) <= FEW_LAYERS
    for k, layer in enumerate(plan.layers):
        width = 0.8 / max(1, len(layer.groups))
        for j, group in enumerate(layer.groups):
            x = layer.index - 0.4 + width * (j + 0.5)
            ax.bar(x, group.qk_dim, width * 0.9, fill=False, edgecolor="0.4")
            ax.bar(x, group.reduced_qk_dim, width * 0.9, color=colors[k], alpha=0.8)
            if few:  # beyond, the labels would overlap: the table has them
                ax.annotate(f"{group.count}x{group.reduced_qk_dim}",
                            (x, group.reduced_qk_dim), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(_layer_ticks(len(plan.layers)))
    ax.set_xlabel("layer")
    ax.set_ylabel("qk_dim per head (outline: teacher, filled: chosen)")
    cut = sum(layer.teacher_kv_units - layer.student_kv_units for layer in plan.layers)
    kept = plan.student.kv_width  # units per token, whatever their dtype
    ax.set_title(f"qk_dim per head group\n(the student caches {kept / (kept + cut):.0%} "
                 "of the teacher's keys and values)")


def _plot_units(ax: Any, plan: CompressionPlan, colors: Colors) -> None:
    """A latent plan: per layer the units the teacher caches per token (outline) and the
    student's (filled)."""
    for k, layer in enumerate(plan.layers):
        ax.bar(layer.index, layer.teacher_kv_units, 0.8, fill=False, edgecolor="0.4")
        ax.bar(layer.index, plan.student.layers[layer.index].kv_width, 0.8, color=colors[k],
               alpha=0.8)
    ax.set_xticks(_layer_ticks(len(plan.layers)))
    ax.set_xlabel("layer")
    ax.set_ylabel("KV cache units per token (outline: teacher,\nfilled: the student's latent)")
    teacher = sum(layer.teacher_kv_units for layer in plan.layers)
    ax.set_title(f"latent width per layer\n(the student caches "
                 f"{plan.student.kv_width / max(1, teacher):.0%} of the teacher's keys and "
                 "values)")


def _plot_latent_losses(ax: Any, plan: CompressionPlan, colors: Colors) -> None:
    """A latent plan: each layer's predicted loss increase at each candidate width, the
    chosen width marked."""
    shown = [(k, layer) for k, layer in enumerate(plan.layers) if layer.latent_losses]
    positive = [v for _, layer in shown for v in (layer.latent_losses or {}).values() if v > 0]
    floor = min(positive) / 10 if positive else 1e-12  # the full rank (0) sits on it
    for k, layer in shown:
        losses = layer.latent_losses or {}
        widths = sorted(losses)
        ax.plot(widths, [max(losses[c], floor) for c in widths], "-", color=colors[k], lw=1,
                label=f"layer {layer.index}")
        if layer.latent_dim in losses:
            ax.plot([layer.latent_dim], [max(losses[layer.latent_dim], floor)], "o",
                    color=colors[k], markersize=6)
    if plan.kv_cache is None:
        ax.axhline(plan.tolerance, color="k", linestyle="--",
                   label=f"tolerance {plan.tolerance:g}")
        ax.legend(handles=ax.get_lines()[-1:], fontsize=8, loc="upper right")
    ax.set_yscale("log")
    ax.set_xlabel("candidate latent width (units per token)")
    ax.set_ylabel(RULE_AXES["loss"])
    ax.set_title("loss of each candidate latent width (o: chosen)")


def _plot_errors(ax: Any, plan: CompressionPlan, colors: Colors) -> None:
    """Each candidate ``qk_dim``'s error under the plan's rule (dotted: the bound, where the rule
    measured something else), the chosen one marked, and the tolerance on the rule's axis."""
    shown = [(k, layer.index, j, group, group.errors(plan.rule))
             for k, layer in enumerate(plan.layers) for j, group in enumerate(layer.groups)]
    positive = [e for *_, errors in shown for e in errors.values() if e > 0]
    floor = min(positive) / 10 if positive else 1e-12  # an exact candidate (0) sits on it
    for k, index, j, group, errors in shown:
        color = colors[k]
        dims = sorted(group.error_bounds)
        if plan.rule == "measured":
            ax.plot(dims, [max(group.error_bounds[r], floor) for r in dims], ":", color=color)
        label = f"layer {index}" + (f" g{j}" if j or len(shown) > len(plan.layers) else "")
        ax.plot(dims, [max(errors[r], floor) for r in dims], "-", color=color, label=label)
        ax.plot([group.reduced_qk_dim], [max(errors[group.reduced_qk_dim], floor)], "o",
                color=color, markersize=9)
    if plan.kv_cache is None:
        line = ax.axhline(plan.tolerance, color="k", linestyle="--",
                          label=f"tolerance {plan.tolerance:g}")
        ax.legend(handles=[line], fontsize=8, loc="upper right")  # the layers: the colour bar
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_yscale("log")
    ax.set_xlabel("candidate qk_dim")
    ax.set_ylabel(RULE_AXES[plan.rule])
    ax.set_title("error of each candidate qk_dim (o: chosen)")
