"""python -m bench.sweep --task ngram --budget 256 --heads 1,2,4,8,16,32 [--kinds mhsa,mixit]

Train a grid of uniform architectures (attention kind x head count at a fixed width budget ``D``,
head dim ``D/H``) on one task with the standalone trainer, over learning rates and seeds, and report
the best run per point (Yu et al., 2025, §6.1, report best-of over lrs and seeds). Results are
printed as a table, or as JSON/YAML with every run.
"""

from __future__ import annotations

import sys
from typing import Any

from common.cli import Parser, add_format, dump, render_table
from search_spaces import ArchConfig, AttentionKind, HeadGroup, LayerSpec, Positional
from workers.tasks import make_task
from workers.tasks.cli import parse_task_params
from workers.train import TrainConfig, train


def _list(cast: type) -> Any:
    return lambda text: [cast(v) for v in text.split(",") if v]


def uniform_arch(kind: AttentionKind, budget: int, heads: int, layers: int, mlp_ratio: float,
                 positional: Positional) -> ArchConfig:
    """A uniform architecture (the trainer wires its input/output and length to the task)."""
    layer = LayerSpec(kind, (HeadGroup(heads, budget // heads),), mlp_ratio=mlp_ratio)
    return ArchConfig(d_model=budget, layers=(layer,) * layers, max_seq_len=1, input_dim=1,
                      positional=positional)


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="bench.sweep", description=__doc__.split("\n\n")[1])
    p.add_argument("--task", required=True)
    p.add_argument("--size", default="paper", choices=("smoke", "paper"))
    p.add_argument("--task-param", action="append", default=[], metavar="KEY=VALUE",
                   help="override a task parameter, e.g. p=97 (repeatable)")
    p.add_argument("--budget", type=int, default=256)
    p.add_argument("--heads", type=_list(int), default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--kinds", type=_list(str), default=["mhsa"])
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--mlp-ratio", type=float, default=0.0)
    p.add_argument("--positional", default="sinusoidal")
    p.add_argument("--lrs", type=_list(float), default=[1e-3])
    p.add_argument("--seeds", type=_list(int), default=[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--weight-decay", type=float, default=0.1)
    add_format(p)
    args = p.parse_args(argv)
    task_params = parse_task_params(args.task_param)
    task_runs: list[dict[str, Any]] = []
    for kind in args.kinds:
        for heads in args.heads:
            arch = uniform_arch(kind, args.budget, heads, args.layers, args.mlp_ratio,
                                args.positional)
            for lr in args.lrs:
                for seed in args.seeds:
                    config = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=lr,
                                         seed=seed, weight_decay=args.weight_decay,
                                         eval_every=max(1, args.steps // 4))
                    task = make_task(args.task, args.size, seed, **task_params)
                    result = train(arch, task, config)
                    run = {"kind": kind, "heads": heads, "dim": args.budget // heads, "lr": lr,
                           "seed": seed, "status": result.status, "metric": result.metric,
                           "val_loss": result.val_loss, "params": result.trainable_params,
                           "tokens_per_s": result.tokens_per_s, **result.extra}
                    task_runs.append(run)
                    print(f"{kind} H={heads} lr={lr:g} seed={seed}: {result.status} "
                          f"{result.metric_name}={result.metric}", file=sys.stderr, flush=True)
    higher = make_task(args.task, args.size, **task_params).higher_is_better
    best: dict[tuple[str, int], dict[str, Any]] = {}
    for run in task_runs:
        key = (run["kind"], run["heads"])
        if run["metric"] is None:
            continue
        if key not in best or (run["metric"] > best[key]["metric"]) == higher:
            best[key] = run
    if args.format != "table":
        print(dump({"best": list(best.values()), "runs": task_runs}, args.format))
        return 0
    rows = [[r["kind"], r["heads"], r["dim"], f"{r['metric']:.5g}", f"{r['lr']:g}", r["seed"],
             f"{r['params']:,}", f"{r['tokens_per_s']:,.0f}"] for r in best.values()]
    metric = make_task(args.task, args.size, **task_params).metric
    print(render_table(["kind", "heads", "dim", f"best {metric}", "lr", "seed", "params",
                        "tokens/s"], rows, right=[False] + [True] * 7))
    return 0


if __name__ == "__main__":
    sys.exit(main())
