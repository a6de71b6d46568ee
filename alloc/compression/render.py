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
    the teacher's; and the error of each candidate ``qk_dim`` against the tolerance, the chosen
    one marked (solid: measured on the sample, dotted: the bound)."""
    fig, axes = new_figure(3, (16, 4.4))
    _plot_spectra(axes[0], plan)
    _plot_dims(axes[1], plan)
    _plot_errors(axes[2], plan)
    write_figure(fig, path)


def _plot_spectra(ax: Any, plan: CompressionPlan) -> None:
    for layer in plan.layers:
        for k, spectrum in enumerate(layer.spectra):
            sigma = np.maximum(np.asarray(spectrum.sigma), 1e-12)
            ax.semilogy(np.arange(1, len(sigma) + 1), sigma, color=f"C{layer.index % 10}",
                        alpha=0.6, label=f"layer {layer.index}" if k == 0 else None)
    ax.set_xlabel("singular value index i")
    ax.set_ylabel("sigma_i of W_Q,h W_K,h^T / sqrt(d_qk) (floor 1e-12)")
    ax.set_title("query-key spectrum of every head")
    if any(layer.spectra for layer in plan.layers):  # a legend needs a line
        ax.legend(fontsize=8)


def _plot_dims(ax: Any, plan: CompressionPlan) -> None:
    """Bars per head group: the teacher's ``qk_dim`` (outline) and the chosen one (filled)."""
    for layer in plan.layers:
        width = 0.8 / max(1, len(layer.groups))
        for j, group in enumerate(layer.groups):
            x = layer.index - 0.4 + width * (j + 0.5)
            ax.bar(x, group.qk_dim, width * 0.9, fill=False, edgecolor="0.4",
                   label="teacher" if (layer.index, j) == (0, 0) else None)
            ax.bar(x, group.reduced_qk_dim, width * 0.9, color=f"C{layer.index % 10}",
                   alpha=0.8)
            ax.annotate(f"{group.count}x{group.reduced_qk_dim}", (x, group.reduced_qk_dim),
                        ha="center", va="bottom", fontsize=7)
    ax.set_xticks([layer.index for layer in plan.layers])
    ax.set_xlabel("layer")
    ax.set_ylabel("qk_dim per head (outline: teacher, filled: chosen)")
    cut = sum(layer.teacher_kv_units - layer.student_kv_units for layer in plan.layers)
    kept = plan.student.kv_width  # units per token, whatever their dtype
    ax.set_title(f"qk_dim per head group\n(the student caches {kept / (kept + cut):.0%} "
                 "of the teacher's keys and values)")


def _plot_errors(ax: Any, plan: CompressionPlan) -> None:
    """Each candidate ``qk_dim``'s error under the plan's rule (dotted: the bound, where the rule
    measured something else), the chosen one marked, and the tolerance on the rule's axis."""
    shown = [(layer.index, j, group, group.errors(plan.rule)) for layer in plan.layers
             for j, group in enumerate(layer.groups)]
    positive = [e for *_, errors in shown for e in errors.values() if e > 0]
    floor = min(positive) / 10 if positive else 1e-12  # an exact candidate (0) sits on it
    for index, j, group, errors in shown:
        color = f"C{index % 10}"
        dims = sorted(group.error_bounds)
        if plan.rule == "measured":
            ax.plot(dims, [max(group.error_bounds[r], floor) for r in dims], ":", color=color)
        label = f"layer {index}" + (f" g{j}" if j or len(shown) > len(plan.layers) else "")
        ax.plot(dims, [max(errors[r], floor) for r in dims], "-", color=color, label=label)
        ax.plot([group.reduced_qk_dim], [max(errors[group.reduced_qk_dim], floor)], "o",
                color=color, markersize=9)
    if plan.kv_cache is None:
        ax.axhline(plan.tolerance, color="k", linestyle="--",
                   label=f"tolerance {plan.tolerance:g}")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_yscale("log")
    ax.set_xlabel("candidate qk_dim")
    ax.set_ylabel(RULE_AXES[plan.rule])
    ax.set_title("error of each candidate qk_dim (o: chosen)")
    ax.legend(fontsize=7)
