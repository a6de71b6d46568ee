"""What the corpora experiment writes (``experiments.corpora``): its CSV tables, its plot
and its text table, each over whatever plans a result holds (``result["plans"]``, its labels)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from common.cli import render_table
from common.files import write_csv
from common.plots import new_figure, write_figure

MARKERS = ("s", "o", "D", "^", "v", "P")


def write_tables(results: list[dict[str, Any]], out: Path) -> None:
    """``corpora.csv`` (the grid), ``corpora_finalists.csv`` and ``corpora_plans.csv``."""
    write_csv(out / "corpora.csv",
              [{"corpus": r["corpus"], **row} for r in results for row in r["rows"]])
    write_csv(out / "corpora_finalists.csv", [
        {"corpus": r["corpus"], **row, "seed_sd": r["finalists"]["noise"]["seed_sd"],
         "eval_se": r["finalists"]["noise"]["eval_se"]}
        for r in results for row in r["finalists"]["rows"]])
    write_csv(out / "corpora_plans.csv", [plan_row(r, label) for r in results
                                          for label in r["plans"]])


def plan_row(r: dict[str, Any], label: str) -> dict[str, Any]:
    """One plan on one corpus: where it is in the grid, and its verdict on the finalists."""
    plan, final, finalists = r[label], r[label]["final"], r["finalists"]
    noise = finalists["noise"]
    return {"corpus": r["corpus"], "when": label, "plan": plan["plan"],
            "heads_L0": plan["grid_point"][0], "heads_L1": plan["grid_point"][1],
            "rank": plan["rank"], "of": r["points"], "layer0_rank": plan["layer0_rank"],
            "layer0_of": len(r["layer0"]), "inputs": plan["inputs"],
            "seed_spearman": r["seed_spearman"], "pilot_seconds": plan["pilot_seconds"],
            "final_loss": final["loss"], "final_low": final["low"], "final_high": final["high"],
            "final_seeds": final["seeds"], "final_steps": finalists["steps"],
            "reference_heads": " | ".join(map(str, finalists["reference"]["grid_point"])),
            "reference_rank": finalists["reference"]["grid_rank"], "p_worse": final["p_worse"],
            "top_quartile": final["top_quartile"], "seed_sd": noise["seed_sd"],
            "eval_se": noise["eval_se"], "eval_to_seed": noise["ratio"]}


def plot(results: list[dict[str, Any]], heads0: tuple[int, ...], heads1: tuple[int, ...],
         path: Path) -> None:
    """Per corpus: the grid's mean loss as a heat map with the plans marked, and below it the
    finalists' means with their 95% intervals over seeds."""
    fig, axes = new_figure(len(results), (4.8 * len(results), 8.4), rows=2)
    axes = np.array(axes).reshape(2, len(results))
    for k, r in enumerate(results):
        heat_map(fig, axes[0, k], r, list(heads0), list(heads1))
        finalists_panel(axes[1, k], r)
    write_figure(fig, path)


def heat_map(fig: Any, ax: Any, r: dict[str, Any], heads0: list[int], heads1: list[int]
             ) -> None:
    grid = np.full((len(heads1), len(heads0)), np.nan)
    for row in r["rows"]:
        grid[heads1.index(row["heads_L1"]), heads0.index(row["heads_L0"])] = row["loss"]
    image = ax.imshow(grid, origin="lower", cmap="viridis_r")
    fig.colorbar(image, ax=ax, fraction=0.046, label="mean validation loss (nats/byte)")
    for row in r["rows"]:
        ax.text(heads0.index(row["heads_L0"]), heads1.index(row["heads_L1"]),
                str(row["rank"]), ha="center", va="center", fontsize=7, color="w")
    for i, label in enumerate(r["plans"]):
        marker, colour = MARKERS[i % len(MARKERS)], f"C{(i + 1) % 10}"
        h0, h1 = r[label]["grid_point"]
        if h0 in heads0 and h1 in heads1:
            ax.scatter(heads0.index(h0), heads1.index(h1), s=260, facecolors="none",
                       edgecolors=colour, marker=marker, linewidths=2,
                       label=f"plan {label}: rank {r[label]['rank']}")
        else:  # e.g. 32 heads of 4: the plan asks for more heads than the grid holds
            ax.scatter([], [], facecolors="none", edgecolors=colour, marker=marker,
                       label=f"plan {label}: {h0} | {h1}, beyond the grid")
    ax.set_xticks(range(len(heads0)), [str(h) for h in heads0])
    ax.set_yticks(range(len(heads1)), [str(h) for h in heads1])
    ax.set_xlabel("layer-0 heads (head dim = D / heads)")
    ax.set_ylabel("layer-1 heads")
    spearman = r["seed_spearman"]
    ax.set_title(f"{r['corpus']} ({r['megabytes']:.1f} MB); seeds' Spearman "
                 f"{'-' if spearman is None else f'{spearman:.2f}'}", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2,
              markerscale=0.5)


def finalists_panel(ax: Any, r: dict[str, Any]) -> None:
    """The finalists by grid rank: mean and 95% interval over the finalists' seeds, the
    reference's interval shaded, points significantly worse than it in grey."""
    finalists = r["finalists"]
    rows = sorted(finalists["rows"], key=lambda row: row["grid_rank"])
    for x, row in enumerate(rows):
        low, high = row["low"], row["high"]
        err = [[0.0], [0.0]] if math.isnan(low) else [[row["loss"] - low], [high - row["loss"]]]
        colour = "C3" if row["reference"] else ("C0" if row["not_worse"] else "0.6")
        ax.errorbar([x], [row["loss"]], yerr=err, fmt="o", color=colour, capsize=3)
        if row["reference"] and not math.isnan(low):
            ax.axhspan(low, high, color="C3", alpha=0.12)
    ax.set_xticks(range(len(rows)), [f"{row['heads_L0']}|{row['heads_L1']}"
                                     + "".join(f"\n{p}" for p in row["plans"].split())
                                     for row in rows], fontsize=7)
    ax.set_ylabel("validation loss (nats/byte)")
    ax.set_title(f"finalists: {finalists['seeds']} seeds, {finalists['steps']} steps; "
                 f"{finalists['noise']['text']}", fontsize=8)


def render(result: dict[str, Any]) -> str:
    """Per corpus: the grid's best and noise, the plans' verdicts, the finalists' table."""
    lines = []
    for r in result["corpora"]:
        best, finalists = r["best"], r["finalists"]
        spearman = "-" if r["seed_spearman"] is None else f"{r['seed_spearman']:.2f}"
        ref = finalists["reference"]
        lines.append(f"{r['corpus']} ({r['megabytes']:.2f} MB, {r['points']} points, "
                     f"{len(r['seeds'])} seeds, seeds' Spearman {spearman}; "
                     f"{r['grid_noise']['text']}): best {best['heads_L0']} | "
                     f"{best['heads_L1']} heads, loss {best['loss']:.4f}")
        lines.append(f"finalists ({len(finalists['rows'])} points, {finalists['seeds']} seeds, "
                     f"{finalists['steps']} steps, {finalists['eval_batches']} validation "
                     f"batches): {finalists['noise']['text']}; top quartile = not "
                     f"significantly worse (one-sided Welch, 5%) than the grid's "
                     f"{ordinal(ref['grid_rank'])} best, {ref['grid_point'][0]} | "
                     f"{ref['grid_point'][1]} heads")
        lines.append(render_table(
            ["plan", "inputs", "exact plan", "in the grid", "grid rank", "finalists' loss",
             "p (worse)", "top quartile", "layer-0 rank"],
            [[label, r[label]["inputs"], r[label]["plan"],
              f"{r[label]['grid_point'][0]} | {r[label]['grid_point'][1]}",
              f"{r[label]['rank'] or 'not in the grid'} of {r['points']}",
              interval_text(r[label]["final"]), p_text(r[label]["final"]["p_worse"]),
              {True: "yes", False: "no", None: "-"}[r[label]["final"]["top_quartile"]],
              "beyond the grid" if r[label]["layer0_rank"] is None
              else f"{r[label]['layer0_rank']} of {len(r['layer0'])}"]
             for label in r["plans"]]))
        lines.append(render_table(
            ["finalist", "grid rank", "grid loss", "finalists' loss (95%)", "p (worse)",
             "not worse", "plans"],
            [[f"{row['heads_L0']} | {row['heads_L1']}" + (" (ref)" if row["reference"] else ""),
              row["grid_rank"], f"{row['grid_loss']:.4f}", interval_text(row),
              p_text(row["p_worse"]), "yes" if row["not_worse"] else "no", row["plans"]]
             for row in sorted(finalists["rows"], key=lambda row: row["grid_rank"])]))
    lines.append(f"wrote {result['out']}/corpora.csv, corpora_finalists.csv, "
                 "corpora_plans.csv, corpora.png")
    return "\n".join(lines)


def interval_text(row: dict[str, Any]) -> str:
    if row["loss"] is None:
        return "not a finalist"
    if row["low"] is None or math.isnan(row["low"]):
        return f"{row['loss']:.4f} ({row['seeds']} seed)"
    return f"{row['loss']:.4f} ± {(row['high'] - row['low']) / 2:.4f}"


def p_text(p: float | None) -> str:
    return "-" if p is None else f"{p:.3f}"


def ordinal(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"
