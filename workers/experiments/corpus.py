"""python -m workers.experiments.corpus [--smoke-test] [--out results/corpus] [--trials 16]

The product on a real corpus, offline: Python's own standard library sources as a text corpus
(byte-level tokens). The data is profiled (``alloc.profile``: memory kernel, input dimension,
spectrum; docs/theory.md §9), the allocator plans from the profile (``alloc.solve --profile``),
and a search seeded with that plan trains candidate per-layer head counts on the same corpus
(``workers.search --data``, FIFO so every trial trains fully). Reports where the allocator's own
plan ranks among the trials (the goal: top quartile) and the measured best head count next to
the predicted one. Writes ``corpus.csv`` (one row per trial), ``corpus.png`` and the profile.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alloc.profile import plot as plot_profile
from alloc.profile import profile_data, write_profile
from common.cli import int_in, render_table
from common.files import write_csv
from common.plots import new_figure, write_figure
from search_spaces import FixedSuggester, parse_space
from studies import query
from studies.storage import open_storage
from userdata import DataSpec
from workers.experiments import harness
from workers.search import tune
from workers.search.driver import training_budget
from workers.search.seeding import measured_inputs, plan_settings, seeds
from workers.tasks import make_data_task

NAME = "corpus"
STUDY = "corpus-heads"


@dataclass(frozen=True)
class Sizes:
    budget: int
    depth: int
    length: int  # window of the LM and offsets profiled
    megabytes: float  # of stdlib sources in the corpus
    steps: int
    trials: int


SMOKE = Sizes(budget=32, depth=2, length=32, megabytes=0.3, steps=30, trials=4)
FULL = Sizes(budget=128, depth=2, length=128, megabytes=8.0, steps=800, trials=16)


def space(sizes: Sizes) -> dict[str, Any]:
    """Head count per layer (head dim = D / heads), everything else fixed."""
    heads = [h for h in (1, 2, 4, 8, 16) if h <= sizes.budget // 2]
    return {"name": NAME, "budget": sizes.budget, "depth": sizes.depth, "sampler": "tpe",
            "model": {"positional": "learned"},
            "layers": [{"layers": "all", "heads": heads, "mlp_ratio": [2]}],
            "train": {"steps": sizes.steps, "eval_every": max(1, sizes.steps // 8),
                      "batch_size": 32, "lr": 3.0e-3, "weight_decay": 0.1}}


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = SMOKE if args.smoke_test else FULL
    harness.prepare(args)
    corpus = harness.write_corpus(args.out / "corpus", sizes.megabytes)
    profile = profile_data(DataSpec(str(corpus)), seq_len=sizes.length)
    write_profile(profile, args.out / "profile.yaml")
    plot_profile(profile, args.out / "profile.png")
    task = make_data_task(DataSpec(str(corpus)), length=sizes.length)
    settings = plan_settings(sizes.budget, sizes.depth, task,
                             measured_inputs(args.out / "profile.yaml"))
    url = harness.storage_url(args, NAME)
    searched = training_budget(parse_space(space(sizes), NAME))
    # The plan as the search enqueues it: the allocator's layers moved into the space's rules.
    start = next(s for s in seeds(searched, settings) if s.label == "allocator")
    plan = searched.sample(FixedSuggester(start.params), task.io)[0]
    with tune.session():
        summary = harness.search(searched, task, args.trials or sizes.trials, url, STUDY,
                                 args.out / "ray_results",
                                 profile=args.out / "profile.yaml")
    rows = trial_rows(url, plan.arch_id)
    write_csv(args.out / "corpus.csv", rows)
    plot(rows, args.out / "corpus.png")
    if not rows:
        raise RuntimeError(f"study {STUDY}: no trial trained fully; see the search's log")
    mine = next((r for r in rows if r["allocator"]), None)
    best = rows[0]
    return {"corpus_mb": sum(p.stat().st_size for p in corpus.iterdir()) / 1e6,
            "profile": {"kernel": profile.best.spec, "r2": profile.best.r2,
                        "input_dim": profile.input_dim, "rank_90": profile.rank_90,
                        "wall_s": profile.wall_s},
            "plan": plan.describe(), "trials": len(rows), "rows": rows,
            "allocator_rank": None if mine is None else mine["rank"],
            "predicted_heads": plan.layers[0].n_heads, "measured_best_heads": best["heads_L0"],
            "study": summary.study, "out": str(args.out)}


def trial_rows(url: str, plan_id: str) -> list[dict[str, Any]]:
    """Every fully trained trial, best first, with its rank and whether it is the plan."""
    engine = open_storage(url).engine
    _, trials = query.load_trials(engine, STUDY)
    done = query.attach_archs(engine, query.eligible(trials))
    done.sort(key=lambda t: (t.value, t.number))
    rows = []
    for rank, t in enumerate(done, start=1):
        assert t.arch is not None
        rows.append({"rank": rank, "trial": t.number, "val_loss": t.value,
                     "arch": t.arch.describe(), "allocator": t.arch.arch_id == plan_id,
                     **{f"heads_L{i}": x.n_heads for i, x in enumerate(t.arch.layers)},
                     "params_trainable": t.params_trainable})
    return rows


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    fig, ax = new_figure(1, (6.4, 4.4))
    for r in rows:
        ax.scatter(r["heads_L0"], r["val_loss"], s=60 if r["allocator"] else 25,
                   c="C3" if r["allocator"] else "C0", marker="*" if r["allocator"] else "o",
                   zorder=3 if r["allocator"] else 2)
        ax.annotate(f"L1 {r['heads_L1']}", (r["heads_L0"], r["val_loss"]), fontsize=7)
    ax.scatter([], [], c="C3", marker="*", s=60, label="the allocator's plan (from the profile)")
    ax.scatter([], [], c="C0", s=25, label="other trials (annotated: layer-1 heads)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("layer-0 heads (head dim = D / heads)")
    ax.set_ylabel("validation loss (nats per byte)")
    ax.set_title("seeded search on the stdlib corpus")
    ax.legend(fontsize=8)
    write_figure(fig, path)


def render(result: dict[str, Any]) -> str:
    p = result["profile"]
    table = render_table(["rank", "trial", "val loss", "architecture", "plan"],
                         [[r["rank"], r["trial"], f"{r['val_loss']:.4f}", r["arch"],
                           "<- allocator" if r["allocator"] else ""] for r in result["rows"]],
                         right=[True, True, True, False, False])
    rank = result["allocator_rank"]
    return "\n".join([
        f"corpus: {result['corpus_mb']:.1f} MB of stdlib sources; profile: kernel {p['kernel']} "
        f"(R² {p['r2']:.2f}), d_in {p['input_dim']} (rank at 90% energy {p['rank_90']}), "
        f"{p['wall_s']:.1f} s",
        f"plan: {result['plan']}", table,
        f"the allocator's plan ranks {rank} of {result['trials']}" if rank else
        "the allocator's plan did not finish",
        f"best layer-0 head count: measured {result['measured_best_heads']}, predicted "
        f"{result['predicted_heads']}",
        f"wrote {result['out']}/corpus.csv, corpus.png, profile.yaml, profile.png"])


def main(argv: list[str] | None = None) -> int:
    parser = harness.build_parser(NAME, __doc__, studies=True)
    parser.add_argument("--trials", type=int_in(1), help="trials of the search (default: 16; "
                                                         "4 with --smoke-test)")
    return harness.main(parser, argv, run, render)


if __name__ == "__main__":
    sys.exit(main())
