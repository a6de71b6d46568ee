"""python -m workers.experiments.corpora [--smoke-test] [--out results/corpora] [--corpus NAME]

Is the allocator's plan right on real text? Three corpora present wherever Python is: the
standard library's **code**, its **documentation** text (``pydoc_data`` topics, English prose),
and **records**, the Unicode Character Database as semicolon-separated rows regenerated from the
interpreter's ``unicodedata`` (tabular data: fixed fields, a counter, long exact repeats; neither
prose nor code). On each, a **full grid** over the two layers' head counts (1, 2, 4, 8 or 16
heads each, head dim = D / heads; D = 128, 2 layers, MLP 2x, windows of 64 bytes, 900 steps of
16 windows), two training seeds per point, FIFO so every point trains fully; the points are
ranked by their mean validation loss over the seeds, and the seeds' agreement is reported
(Spearman over the points). The plan is then made twice from the same
corpus: **before** (``alloc.profile --no-pilot`` statistics and the attention-only rule) and
**after** (the pilot profile and the MLP-aware rule, docs/theory.md §9.2 and §2.1), each moved into
the grid (the allocator's best layer of equal heads, ``--uniform``: the grid's layers are
uniform), and its rank read off the grid, with its layer-0 head count's rank among the five
(mean over layer 1: the extraction layer is what the bound decides). The studies are resumed on a
re-run, so only the profiles and plans are redone. Writes ``corpora.csv`` (one row per point and
corpus), ``corpora_plans.csv``, ``corpora.png`` and each corpus's profiles.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from alloc.datastats import Profile
from alloc.pilot import PilotRequest
from alloc.plan import make_plan
from alloc.profilefile import read_allocator_inputs, write_profile
from alloc.settings import PlanSettings
from common.cli import render_table
from common.errors import UsageError
from common.files import write_csv
from common.plots import new_figure, write_figure
from search_spaces import SearchSpace, parse_space
from userdata import DataSpec
from workers.experiments import harness
from workers.profile import profile_data
from workers.search.options import training_budget
from workers.search.seeding import plan_settings
from workers.tasks import Task, make_data_task

NAME = "corpora"
CORPORA = ("code", "docs", "records")
MLP_RATIO = 2  # the space hashes [2], as the grids were run


@dataclass(frozen=True)
class Sizes:
    budget: int
    depth: int
    length: int  # training window, and the offsets profiled
    megabytes: float  # of each corpus (docs is all of pydoc_data's topics when smaller)
    heads: tuple[int, ...]  # layer 0's choices (the extraction layer the theory solves)
    later_heads: tuple[int, ...]  # every later layer's
    seeds: tuple[int, ...]
    steps: int
    batch_size: int
    pilot_steps: int


SMOKE = Sizes(budget=16, depth=2, length=16, megabytes=0.05, heads=(1, 2), later_heads=(1,),
              seeds=(0, 1), steps=4, batch_size=4, pilot_steps=8)
FULL = Sizes(budget=128, depth=2, length=64, megabytes=2.0, heads=(1, 2, 4, 8, 16),
             later_heads=(1, 2, 4, 8, 16), seeds=(0, 1), steps=900, batch_size=16,
             pilot_steps=300)


# --- the corpora -------------------------------------------------------------------------------


def write_docs(folder: Path, megabytes: float) -> Path:
    """The interpreter's documentation topics (``pydoc_data``), English prose, up to
    ``megabytes``."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    return _write_one(folder, "topics.txt", text, megabytes)


def unicode_records() -> str:
    """One row per named code point: ``code;name;category;bidi;decomposition``. Names the
    database derives by rule (``CJK UNIFIED IDEOGRAPH-4E00``, the 11,172 ``HANGUL SYLLABLE``
    names) are left out: they are a formula, not data."""
    rows = []
    for cp in range(sys.maxunicode + 1):
        name = unicodedata.name(chr(cp), "")
        if not name or name.endswith(f"-{cp:04X}") or name.startswith("HANGUL SYLLABLE "):
            continue
        ch = chr(cp)
        rows.append(f"{cp:04X};{name};{unicodedata.category(ch)};"
                    f"{unicodedata.bidirectional(ch)};{unicodedata.decomposition(ch)}\n")
    return "".join(rows)


def write_records(folder: Path, megabytes: float) -> Path:
    return _write_one(folder, "unicode.txt", unicode_records(), megabytes)


def _write_one(folder: Path, name: str, text: str, megabytes: float) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = text.encode("utf-8")[:int(megabytes * 1e6)]
    target = folder / name
    if not target.exists() or target.read_bytes() != data:
        target.write_bytes(data)
    return folder


def write(corpus: str, folder: Path, megabytes: float) -> Path:
    """Corpus ``corpus`` written to ``folder`` (same bytes on every machine of a Python)."""
    writers = {"code": harness.write_corpus, "docs": write_docs, "records": write_records}
    return writers[corpus](folder, megabytes)


# --- the grid ----------------------------------------------------------------------------------


def space(sizes: Sizes, corpus: str) -> SearchSpace:
    """Every (layer-0, later-layer) head count, each with every seed; all else fixed."""
    name = f"{NAME}-{corpus}"
    data = {"name": name, "budget": sizes.budget, "depth": sizes.depth,
            "sampler": "grid", "model": {"positional": "learned"},
            "layers": [{"layers": i, "heads": list(sizes.heads if i == 0 else sizes.later_heads),
                        "mlp_ratio": [MLP_RATIO]} for i in range(sizes.depth)],
            "train": {"steps": sizes.steps, "eval_every": sizes.steps, "eval_batches": 32,
                      "batch_size": sizes.batch_size, "lr": 3.0e-3, "weight_decay": 0.1,
                      "seed": list(sizes.seeds)}}
    return training_budget(parse_space(data, name))


def task_for(folder: Path, sizes: Sizes) -> Task:
    return make_data_task(DataSpec(str(folder)), length=sizes.length)


def train_grid(args: argparse.Namespace, sizes: Sizes, corpus: str, folder: Path,
               profile: Path) -> str:
    """The corpus's grid study, trained (or resumed); returns its name. ``profile``: the
    corpus's profile (the grid sampler needs no plan; the search would otherwise make one)."""
    grid = space(sizes, corpus)
    study = f"{NAME}-{corpus}"
    harness.search(grid, task_for(folder, sizes), grid.size(10_000),
                   harness.storage_url(args, NAME), study, args.out / "ray_results",
                   profile=profile, quiet=args.quiet)
    return study


def sizes_of(args: argparse.Namespace) -> Sizes:
    return SMOKE if args.smoke_test else FULL


def corpora_of(args: argparse.Namespace) -> tuple[str, ...]:
    chosen = tuple(args.corpus or CORPORA)
    unknown = [c for c in chosen if c not in CORPORA]
    if unknown:
        raise UsageError(f"--corpus {unknown[0]!r}: must be one of {', '.join(CORPORA)}")
    return chosen


def grid_losses(url: str, study: str) -> dict[tuple[int, int], dict[int, float]]:
    """Per (layer-0 heads, layer-1 heads): the validation loss of each seed."""
    import optuna

    from studies.storage import open_storage

    out: dict[tuple[int, int], dict[int, float]] = {}
    for t in optuna.load_study(study_name=study, storage=open_storage(url)).trials:
        if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None:
            point = (int(t.params["L0.g0.count"]), int(t.params["L1.g0.count"]))
            out.setdefault(point, {})[int(t.params["train.seed"])] = float(t.value)
    return out


# --- the plans ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanPoint:
    """One way of planning: its profile, the allocator's plan, and the plan in the grid (the
    allocator's best layer of equal heads, ``--uniform``, which is what the grid holds)."""

    label: str
    profile: Profile
    settings: PlanSettings
    plan: str  # the exact plan, per layer
    point: tuple[int, int]  # heads of layer 0 and 1 of the uniform plan


def plan_point(label: str, profile: Profile, path: Path, sizes: Sizes, task: Task,
               product_order: int | None) -> PlanPoint:
    """``profile`` written to ``path``, read back as ``alloc.solve --profile`` would, planned
    at the grid's width and depth with an MLP of 2x (``product_order`` 1: today's rule)."""
    write_profile(profile, path)
    settings = dataclasses.replace(
        plan_settings(sizes.budget, sizes.depth, task, read_allocator_inputs(path), MLP_RATIO),
        product_order=product_order)
    uniform = make_plan(dataclasses.replace(settings, uniform=True)).arch
    counts = [layer.n_heads for layer in uniform.layers]
    return PlanPoint(label, profile, settings, make_plan(settings).arch.describe(),
                     (counts[0], counts[1]))


def plans(sizes: Sizes, folder: Path, out: Path, quiet: bool = False
          ) -> tuple[PlanPoint, PlanPoint]:
    """Before (data statistics, the attention-only rule) and after (the pilot, the MLP rule)."""
    spec, task = DataSpec(str(folder)), task_for(folder, sizes)
    before = profile_data(spec, seq_len=sizes.length)
    pilot = PilotRequest(spec, budget=sizes.budget, layers=sizes.depth, mlp_ratio=MLP_RATIO,
                         steps=sizes.pilot_steps, quiet=quiet)
    after = profile_data(spec, seq_len=sizes.length, pilot=pilot)
    return (plan_point("before", before, out / "profile-before.yaml", sizes, task, 1),
            plan_point("after", after, out / "profile-after.yaml", sizes, task, None))


# --- the table ---------------------------------------------------------------------------------


def ranked(losses: dict[tuple[int, int], dict[int, float]], seeds: tuple[int, ...]
           ) -> list[dict[str, Any]]:
    """One row per point with every seed: its losses, their mean and its rank (1 = best)."""
    rows = [{"heads_L0": h0, "heads_L1": h1, **{f"loss_seed{s}": by[s] for s in seeds},
             "loss": float(np.mean([by[s] for s in seeds]))}
            for (h0, h1), by in sorted(losses.items()) if all(s in by for s in seeds)]
    for rank, row in enumerate(sorted(rows, key=lambda r: r["loss"]), start=1):
        row["rank"] = rank
    return sorted(rows, key=lambda r: r["rank"])


def layer0_ranks(rows: list[dict[str, Any]]) -> dict[int, tuple[int, float]]:
    """Per layer-0 head count: its rank (1 = best) and mean loss over the layer-1 choices (what
    the extraction layer's choice is worth, the later layer averaged out)."""
    means = {h: float(np.mean([r["loss"] for r in rows if r["heads_L0"] == h]))
             for h in sorted({r["heads_L0"] for r in rows})}
    order = sorted(means, key=means.__getitem__)
    return {h: (order.index(h) + 1, means[h]) for h in means}


def seed_agreement(rows: list[dict[str, Any]], seeds: tuple[int, ...]) -> float | None:
    """Spearman correlation of the points' losses between the first two seeds."""
    if len(seeds) < 2 or len(rows) < 3:
        return None
    from scipy.stats import spearmanr

    rho = spearmanr([r[f"loss_seed{seeds[0]}"] for r in rows],
                    [r[f"loss_seed{seeds[1]}"] for r in rows]).statistic
    return float(rho)


def corpus_result(args: argparse.Namespace, sizes: Sizes, corpus: str) -> dict[str, Any]:
    """The corpus written, profiled and planned both ways, its grid trained (or resumed), and
    the plans ranked in it."""
    out = args.out / corpus
    folder = write(corpus, out / "text", sizes.megabytes)
    points = plans(sizes, folder, out, args.quiet)
    train_grid(args, sizes, corpus, folder, out / "profile-before.yaml")
    rows = ranked(grid_losses(harness.storage_url(args, NAME), f"{NAME}-{corpus}"), sizes.seeds)
    if not rows:
        raise RuntimeError(f"study {NAME}-{corpus}: no point trained with every seed")
    by_point = {(r["heads_L0"], r["heads_L1"]): r for r in rows}
    marginal = layer0_ranks(rows)
    result: dict[str, Any] = {
        "corpus": corpus, "megabytes": sum(p.stat().st_size for p in folder.iterdir()) / 1e6,
        "points": len(rows), "top_quartile": max(1, len(rows) // 4),
        "seed_spearman": seed_agreement(rows, sizes.seeds),
        "best": rows[0], "rows": rows,
        "layer0": {str(h): {"rank": rank, "loss": loss} for h, (rank, loss) in marginal.items()}}
    for p in points:
        row = by_point.get(p.point)
        result[p.label] = {
            "plan": p.plan, "grid_point": list(p.point), "rank": row and row["rank"],
            "loss": row and row["loss"], "inputs": describe_inputs(p.settings),
            "layer0_rank": marginal.get(p.point[0], (None, None))[0],
            "sources": p.profile.inputs.sources,
            "pilot_seconds": p.profile.pilot.seconds if p.profile.pilot else None}
        for r in rows:
            r[p.label] = (r["heads_L0"], r["heads_L1"]) == p.point
    return result


def describe_inputs(s: PlanSettings) -> str:
    spectrum = "measured input spectrum" if s.input_spectrum else f"d_in {s.input_dim}"
    return (f"kernel {s.kernel}, {spectrum}, compression order "
            f"{s.order_for(s.mlp_ratio)}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from workers.search import tune  # Ray: only when the experiment runs, not for --help

    sizes, chosen = sizes_of(args), corpora_of(args)  # bad --corpus: before any work
    harness.prepare(args)
    results = []
    with tune.session(), harness.runs(args, NAME, len(chosen), "corpora") as bar:
        for k, corpus in enumerate(chosen, start=1):
            bar.write(f"{NAME}: corpus {k}/{len(chosen)}: {corpus}: profile, plan and its "
                      "grid's search")
            results.append(corpus_result(args, sizes, corpus))
            bar.update(1)
            bar.event(f"{corpus} done")
    write_csv(args.out / "corpora.csv",
              [{"corpus": r["corpus"], **row} for r in results for row in r["rows"]])
    write_csv(args.out / "corpora_plans.csv", [
        {"corpus": r["corpus"], "when": label, "plan": r[label]["plan"],
         "heads_L0": r[label]["grid_point"][0], "heads_L1": r[label]["grid_point"][1],
         "rank": r[label]["rank"], "of": r["points"], "layer0_rank": r[label]["layer0_rank"],
         "layer0_of": len(r["layer0"]), "inputs": r[label]["inputs"],
         "seed_spearman": r["seed_spearman"], "pilot_seconds": r[label]["pilot_seconds"]}
        for r in results for label in ("before", "after")])
    plot(results, sizes, args.out / "corpora.png")
    return {"sizes": dataclasses.asdict(sizes), "corpora": results, "out": str(args.out)}


def plot(results: list[dict[str, Any]], sizes: Sizes, path: Path) -> None:
    """Per corpus: the grid's mean loss as a heat map, the plans before and after marked."""
    fig, axes = new_figure(len(results), (4.8 * len(results), 4.8))
    axes = np.atleast_1d(axes)
    heads0, heads1 = list(sizes.heads), list(sizes.later_heads)
    for ax, r in zip(axes, results):
        grid = np.full((len(heads1), len(heads0)), np.nan)
        for row in r["rows"]:
            grid[heads1.index(row["heads_L1"]), heads0.index(row["heads_L0"])] = row["loss"]
        image = ax.imshow(grid, origin="lower", cmap="viridis_r")
        fig.colorbar(image, ax=ax, fraction=0.046, label="mean validation loss (nats/byte)")
        for row in r["rows"]:
            ax.text(heads0.index(row["heads_L0"]), heads1.index(row["heads_L1"]),
                    str(row["rank"]), ha="center", va="center", fontsize=7, color="w")
        for label, marker, colour in (("before", "s", "C1"), ("after", "o", "C3")):
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
    write_figure(fig, path)


def render(result: dict[str, Any]) -> str:
    lines = []
    for r in result["corpora"]:
        best = r["best"]
        spearman = "-" if r["seed_spearman"] is None else f"{r['seed_spearman']:.2f}"
        lines.append(f"{r['corpus']} ({r['megabytes']:.2f} MB, {r['points']} points, seeds' "
                     f"Spearman {spearman}): best {best['heads_L0']} | "
                     f"{best['heads_L1']} heads, loss {best['loss']:.4f}")
        lines.append(render_table(
            ["plan", "inputs", "exact plan", "in the grid", "rank", "top quartile",
             "layer-0 rank"],
            [[label, r[label]["inputs"], r[label]["plan"],
              f"{r[label]['grid_point'][0]} | {r[label]['grid_point'][1]}",
              f"{r[label]['rank'] or 'not in the grid'} of {r['points']}",
              "yes" if r[label]["rank"] and r[label]["rank"] <= r["top_quartile"] else "no",
              f"{r[label]['layer0_rank']} of {len(r['layer0'])}"]
             for label in ("before", "after")]))
    lines.append(f"wrote {result['out']}/corpora.csv, corpora_plans.csv, corpora.png")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = harness.build_parser(NAME, __doc__, studies=True)
    parser.add_argument("--corpus", action="append", metavar="NAME",
                        help=f"only this corpus (repeatable; default: {', '.join(CORPORA)})")
    return parser


def main(argv: list[str] | None = None) -> int:
    return harness.main(build_parser(), argv, run, render)


if __name__ == "__main__":
    sys.exit(main())
