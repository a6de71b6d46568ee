"""python -m experiments.mixit [--smoke-test] [--out results/mixit]

Attention Retrieves, MLP Memorizes (Dong et al., 2025: Table 1, Fig. 2) with the product, one
study per task read back from the study database:
- ``modadd`` over ``attention_kinds.yaml`` (one attention kind in every layer: mhsa, frozen_qk,
  mixit, mssa; same width, MLPs and optimiser): every kind should reach ~100% accuracy;
- ``retrieval`` over ``retrieval_kinds.yaml`` at m_max 5, 10 and 20, under a recipe in which
  standard attention solves it (one wide head per layer, no MLP, several queries per training
  sequence, a curriculum over m_max at 20): input-dependent attention is needed to find the
  queried key, so MixiT (static random attention) should fail where standard attention does not;
- ``memorize``: n^2 random key/value pairs, standard attention and MixiT at d_model 8 to 64;
  bits per parameter = n^2 log2(n) acc / trainable params, against model size (capacity).
Writes ``mixit.csv`` and ``mixit.png``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.cli import render_table
from common.files import write_csv
from common.plots import new_figure, write_figure
from experiments import harness
from search_spaces import load_space, parse_space
from studies import engine, open_storage, query
from workers.search import training_budget
from workers.tasks import bits_per_param, make_task

NAME = "mixit"
SPACE = "attention_kinds.yaml"
RETRIEVAL = "retrieval_kinds.yaml"
KINDS = ("mhsa", "frozen_qk", "mixit", "mssa")
SMOKE_BUDGET = 32
SMOKE_RETRIEVAL = (4,)  # m_max of the smoke run's retrieval search


@dataclass(frozen=True)
class Search:
    """One study: a task (with parameters) searched over a space's attention kinds."""

    study: str
    task: str
    params: dict[str, int] = field(default_factory=dict)
    budget: int | None = None
    steps: int | None = None
    space: str | dict[str, Any] = SPACE  # a shipped space, or one derived here

    def run(self, smoke: bool, url: str, results: Path, quiet: bool = False) -> None:
        loaded = (load_space(self.space, self.budget) if isinstance(self.space, str)
                  else parse_space({**self.space, "budget": self.budget or self.space["budget"]},
                                   f"<{self.study}>"))
        space = training_budget(loaded, smoke, self.steps)
        task = make_task(self.task, "smoke" if smoke else "paper", **self.params)
        harness.search(space, task, len(space.grid()), url, self.study, results, quiet=quiet)


def memorize_space() -> dict[str, Any]:
    """attention_kinds.yaml for standard attention and MixiT, trained to memorise: a larger
    batch, no weight decay, long training."""
    shipped = dict(load_space(SPACE).data)
    rule = {**shipped["layers"][0], "attention": ["mhsa", "mixit"]}
    return {**shipped, "name": "memorize_kinds", "layers": [rule],
            "train": {**shipped["train"], "batch_size": 256, "weight_decay": 0.0,
                      "eval_every": 2000}}


def searches(smoke: bool) -> list[Search]:
    """Every search of the experiment, smoke or full size."""
    memorize = memorize_space()
    if smoke:
        # One retrieval size (the full run sweeps m_max over 5, 10, 20): each search costs Ray
        # seconds that the tiny trials do not, and a second m tests no other code.
        return ([Search("kinds-modadd", "modadd", budget=SMOKE_BUDGET)]
                + [Search(f"kinds-retrieval-m{m}", "retrieval", {"m_max": m, "queries": m},
                          SMOKE_BUDGET, space=RETRIEVAL) for m in SMOKE_RETRIEVAL]
                + [Search(f"memorize-d{d}", "memorize", budget=d, space=memorize)
                   for d in (8, 16)])
    retrieval = {5: {"queries": 10}, 10: {"queries": 10},
                 20: {"queries": 20, "ramp": 2000, "ramp_from": 5}}
    return ([Search("kinds-modadd", "modadd", {"p": 97, "train": 4704, "val": 2000},
                    steps=20000)]
            + [Search(f"kinds-retrieval-m{m}", "retrieval", {"m_max": m, **extra},
                      steps=4000 if m == 20 else None, space=RETRIEVAL)
               for m, extra in retrieval.items()]
            + [Search(f"memorize-d{d}", "memorize", {"n": 64}, budget=d, steps=20000,
                      space=memorize) for d in (8, 16, 32, 64)])


def read_rows(url: str, search: Search, smoke: bool) -> list[dict[str, Any]]:
    """One row per attention kind, from the study (its fully trained trials)."""
    eng = engine(open_storage(url))
    _, trials = query.load_trials(eng, search.study)
    done = query.attach_archs(eng, query.eligible(trials))
    rows = []
    for t in done:
        assert t.arch is not None and t.value is not None
        row = {"study": search.study, "task": search.task,
               "m_max": search.params.get("m_max", ""), "attention": t.arch.layers[0].attention,
               "d_model": t.arch.d_model, "accuracy": t.value,
               "params_trainable": t.params_trainable, "trial": t.number,
               "bits_per_param": "", "random_value_accuracy": ""}
        if search.task == "retrieval":
            row["random_value_accuracy"] = guess_accuracy(search.params["m_max"])
        if search.task == "memorize":
            task = make_task("memorize", "smoke" if smoke else "paper", **search.params)
            row["bits_per_param"] = bits_per_param(task.n,  # type: ignore[attr-defined]
                                                   t.value, t.params_trainable or 1)
        rows.append(row)
    return sorted(rows, key=lambda r: (KINDS.index(r["attention"]), r["d_model"]))


def guess_accuracy(m_max: int) -> float:
    """Accuracy of answering a random value of the context: E[1/m], m ~ U{1..m_max}. Above it,
    the model finds the queried key; reaching it already takes attention to the values."""
    return sum(1 / m for m in range(1, m_max + 1)) / m_max


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    fig, axes = new_figure(3, (15, 4.2))
    colors = {k: f"C{i}" for i, k in enumerate(KINDS)}
    modadd = [r for r in rows if r["task"] == "modadd"]
    axes[0].bar([r["attention"] for r in modadd], [r["accuracy"] for r in modadd],
                color=[colors[r["attention"]] for r in modadd])
    axes[0].set_ylabel("validation accuracy")
    axes[0].set_xlabel("attention kind")
    axes[0].set_title("modadd")
    for kind in KINDS:
        mine = sorted((r for r in rows if r["task"] == "retrieval" and r["attention"] == kind),
                      key=lambda r: r["m_max"])
        axes[1].plot([r["m_max"] for r in mine], [r["accuracy"] for r in mine], "o-",
                     color=colors[kind], label=kind)
        sweep = sorted((r for r in rows if r["task"] == "memorize" and r["attention"] == kind),
                       key=lambda r: r["params_trainable"])
        if sweep:
            axes[2].plot([r["params_trainable"] for r in sweep],
                         [r["bits_per_param"] for r in sweep], "o-", color=colors[kind],
                         label=kind)
    m_values = sorted({int(r["m_max"]) for r in rows if r["task"] == "retrieval"})
    axes[1].plot(m_values, [guess_accuracy(m) for m in m_values], "k:",
                 label="a random value of the context")
    axes[1].set_xlabel("m_max (key/value pairs in context)")
    axes[1].set_ylabel("validation accuracy")
    axes[1].set_title("retrieval (needle in a haystack)")
    axes[1].set_ylim(0, 1.02)
    axes[1].legend(fontsize=8)
    axes[2].axhline(2.0, color="k", ls=":", label="~2 bits/param (published capacity)")
    axes[2].set_xscale("log")
    axes[2].set_xlabel("trainable parameters (d_model 8 .. 64)")
    axes[2].set_ylabel("bits per trainable parameter")
    axes[2].set_title("memorize: capacity vs model size")
    axes[2].legend(fontsize=8)
    write_figure(fig, path)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from workers.search import ray_session  # Ray: only when the experiment runs, not for --help

    harness.prepare(args)
    url = harness.storage_url(args, NAME)
    rows: list[dict[str, Any]] = []
    todo = searches(args.smoke_test)
    with ray_session(), harness.runs(args, NAME, len(todo), "searches") as bar:
        for k, search in enumerate(todo, start=1):
            bar.write(f"{NAME}: search {k}/{len(todo)}: {search.study}")
            search.run(args.smoke_test, url, args.out / "ray_results", args.quiet)
            rows += read_rows(url, search, args.smoke_test)
            bar.update(1)
            bar.event(f"{search.study} done")
    write_csv(args.out / "mixit.csv", rows)
    plot(rows, args.out / "mixit.png")
    return {"rows": rows, "out": str(args.out)}


def render(result: dict[str, Any]) -> str:
    rows = [[r["task"], r["m_max"], r["d_model"], r["attention"], f"{r['accuracy']:.3f}",
             f"{r['random_value_accuracy']:.3f}" if r["random_value_accuracy"] != "" else "-",
             f"{r['params_trainable']:,}",
             f"{r['bits_per_param']:.3f}" if r["bits_per_param"] != "" else "-"]
            for r in result["rows"]]
    return "\n".join([
        render_table(["task", "m_max", "d_model", "attention", "accuracy", "random value",
                      "trainable params", "bits/param"], rows,
                     right=[False, True, True, False, True, True, True, True]),
        f"wrote {result['out']}/mixit.csv, mixit.png"])


def main(argv: list[str] | None = None) -> int:
    parser = harness.build_parser(NAME, __doc__, studies=True)
    return harness.main(parser, argv, run, render)


if __name__ == "__main__":
    sys.exit(main())
