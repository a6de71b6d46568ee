"""python -m bench.distil --teacher PATH --plan plan.yaml --data TOKENS --eval DIR [DIR ...]

What recovers a cut student most per CPU-minute of fine-tuning: the student ``workers.compress``
builds from ``--plan`` is fine-tuned on ``--data`` the ways ``workers.compress --finetune-*``
fine-tunes (``workers.compression.distil``; ``--runs``: ``kl-new``, ``ce-new``, ``kl-all``,
``ce-all``, the ``--finetune-loss`` and ``--finetune-params``, with ``teacher`` and ``cut``
scored as they are), each from the same cut, for ``--steps`` of ``--batch-size`` windows of
``--seq-len``, and scored on held-out token folders (``bench.heldout``'s windows). One process,
one teacher read (the command evaluates on ``--data`` too, each run). Prints per run the
perplexities, the CPU seconds of its fine-tune (this process's CPU time, every thread) and the
load average.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.heldout import perplexity, windows
from common.cli import Parser, add_format, dump, int_in, number, render_table

RUNS = ("teacher", "cut", "kl-new", "ce-new", "kl-all", "ce-all")


def setup(args: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
    """The teacher, the plan, its fits, the training task and the held-out windows."""
    import numpy as np

    from userdata import DataSpec, TaskSpec, open_tokens
    from workers.checkpoints import load
    from workers.compression import read_fits, read_plan
    from workers.taskargs import resolve_task

    loaded = load(args.teacher)
    plan = read_plan(args.plan, loaded.arch)
    fits = read_fits(plan, args.plan.parent)
    task = resolve_task(TaskSpec(data=DataSpec(str(args.data)), seed=args.seed), loaded.arch,
                        args.seq_len)
    held = {}
    for path in args.eval:
        split = open_tokens(DataSpec(str(path)), args.eval_seq_len + 1)
        held[path.name] = windows(np.concatenate([split.train, split.val]),
                                  args.eval_seq_len, args.eval_tokens)
    return loaded.model, plan, fits, task, held


def scored(model: Any, held: dict[str, Any]) -> dict[str, float]:
    return {source: perplexity(model, ids) for source, ids in held.items()}


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m bench.distil", description=__doc__.split("\n\n")[1])
    p.add_argument("--teacher", type=Path, required=True)
    p.add_argument("--plan", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--eval", nargs="+", type=Path, required=True)
    p.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    p.add_argument("--steps", type=int_in(1), default=20)
    p.add_argument("--seq-len", type=int_in(2), default=256)
    p.add_argument("--batch-size", type=int_in(1), default=2)
    p.add_argument("--lr", type=number(0, strict=True), default=3e-4)
    p.add_argument("--eval-seq-len", type=int_in(2), default=512)
    p.add_argument("--eval-tokens", type=int_in(1), default=4096)
    p.add_argument("--seed", type=int_in(0), default=0)
    p.add_argument("--log", type=Path, help="append each row as a JSON line here")
    add_format(p)
    args = p.parse_args(argv)
    from workers.compression import Distiller, DistilSettings, build_student, pair_orders

    teacher, plan, fits, task, held = setup(args)
    rows: list[dict[str, Any]] = []

    def row(name: str, model: Any, **extra: Any) -> None:
        cpu = time.process_time()
        entry = {"run": name, **scored(model, held), **extra,
                 "eval_cpu_s": time.process_time() - cpu, "load": os.getloadavg()[0]}
        rows.append(entry)
        print(f"distil: {json.dumps(entry)}", file=sys.stderr, flush=True)
        if args.log is not None:
            with args.log.open("a") as handle:
                handle.write(json.dumps(entry) + "\n")

    def cut() -> Any:
        return build_student(teacher, plan.student, pair_orders(plan), plan.input_scales(),
                             fits)

    for name in args.runs:
        if name in ("teacher", "cut"):
            row(name, teacher if name == "teacher" else cut())
            continue
        loss, params = name.split("-")
        settings = DistilSettings(args.steps, args.lr, args.batch_size, loss, params,
                                  seed=args.seed)
        student = cut()
        load_before = os.getloadavg()[0]
        report = Distiller(teacher, student, task, settings).run()
        row(name, student, steps=report.steps, trained_params=report.trained_params,
            tail_loss=report.tail_loss, finetune_cpu_s=report.cpu_s,
            finetune_wall_s=report.wall_s, load_before=load_before)
    if args.format != "table":
        print(dump(rows, args.format))
        return 0
    sources = list(held)
    print(render_table(["run", *sources, "fine-tune CPU-min", "load"],
                       [[r["run"], *(f"{r[s]:.2f}" for s in sources),
                         f"{r.get('finetune_cpu_s', 0) / 60:.1f}", f"{r['load']:.1f}"]
                        for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
