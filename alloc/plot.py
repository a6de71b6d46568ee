"""Plots of an allocation plan (matplotlib, imported only when a plot is asked for)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.axes import Axes

from alloc.extract import uniform_options
from alloc.plan import Plan, saturation_curve
from common.plots import new_figure, write_figure


def plot_plan(plan: Plan, path: Path) -> None:
    """Trade-off curve of the extraction layer, ``qk_dim`` per layer, and saturation vs N."""
    fig, axes = new_figure(3, (15, 4.4))
    _tradeoff(plan, axes[0])
    _qk_dims(plan, axes[1])
    _saturation(plan, axes[2])
    write_figure(fig, path)


def _tradeoff(plan: Plan, ax: Axes) -> None:
    s = plan.settings
    options = uniform_options(plan.problem)
    heads = [o.count for o in options]
    ax.plot(heads, [o.objective for o in options], "o-", label="uniform layer: H heads of D/H")
    best = plan.uniform
    ax.plot([best.count], [best.objective], "o", ms=12, mfc="none", mew=2, color="C3",
            label=f"best uniform: {best.count}x{best.dim}")
    ax.plot([plan.exact.heads], [plan.exact.objective], "*", ms=14, color="C2",
            label=f"exact grouped: {plan.exact.heads} heads in {len(plan.exact.groups)} groups")
    ax.axhline(plan.continuous.objective, ls="--", color="grey",
               label="continuous relaxation's optimum (head counts not whole)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("heads H in the extraction layer (head dim D/H)")
    ax.set_ylabel("predicted error bound E (units of token norm)")
    ax.set_title(f"heads vs head dim at D={s.budget}, d_in={s.input_dim}, kernel {s.kernel}")
    ax.legend(fontsize=8)


def _qk_dims(plan: Plan, ax: Axes) -> None:
    layers = plan.arch.layers
    index = list(range(len(layers)))
    qk = [max(g.qk_dim for g in layer.heads) for layer in layers]
    v = [max(g.v_dim for g in layer.heads) for layer in layers]
    ax.bar([i - 0.2 for i in index], qk, width=0.4, label="qk_dim (largest group)")
    ax.bar([i + 0.2 for i in index], v, width=0.4, label="v_dim (largest group)")
    ax.set_xticks(index, [f"{i}\n{layer.role}" for i, layer in zip(index, layers)])
    ax.set_xlabel("layer")
    ax.set_ylabel("head dimension")
    ax.set_title(f"chosen dims per layer (tolerance {plan.settings.tolerance:g})")
    ax.legend(fontsize=8)


def _saturation(plan: Plan, ax: Axes) -> None:
    teacher = max(g.qk_dim for g in plan.arch.layers[0].heads)
    curve = saturation_curve(plan.settings, teacher)
    n = [c["seq_len"] for c in curve]
    ax.plot(n, [c["qk_dim"] for c in curve], "o-", label="required qk_dim")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("qk_dim meeting the tolerance")
    twin = ax.twinx()
    twin.plot(n, [c["jacobian_bound"] for c in curve], "s--", color="C1",
              label=r"softmax Jacobian bound $2e^{2R}/N$")
    twin.set_yscale("log")
    twin.set_ylabel("||J||_2 bound")
    ax.set_title(f"saturation: a {teacher}-dim head shrinks as N grows")
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8)


def plot_calibration(rep: dict[str, Any], path: Path) -> None:
    """Measured loss per architecture next to the raw and the calibrated prediction."""
    rows = rep["observations"]
    x = list(range(len(rows)))
    fig, ax = new_figure(1, (max(6.0, 0.9 * len(rows)), 4.4))
    ax.plot(x, [r["loss"] for r in rows], "o-", color="k", label="measured (best of trials)")
    for key, style in (("raw", "s--"), ("calibrated", "^-")):
        f = rep[key]
        ax.plot(x, [r[key] for r in rows], style,
                label=f"{key} bound x scale (c_proj {f['c_proj']:.3g}, c_head {f['c_head']:.3g},"
                      f" n {f['order']:.2g}, m {f['width_order']:.2g}; R² {f['r2']:.2f})")
    ax.set_xticks(x, [r["architecture"] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("architecture (heads x head dim per layer)")
    ax.set_ylabel("validation loss (task metric)")
    ax.set_title(f"calibration on study {rep['study']}")
    ax.legend(fontsize=8)
    write_figure(fig, path)
