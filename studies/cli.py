"""python -m studies list|best|top|pareto|layers|theory|export|errors|seeds [--storage URL]
[--study NAME]

Query the study database long after a search ended: the best per-layer allocations, the Pareto
front of value vs trainable parameters (or vs KV cache per token, ``--x kv_cache``), which
attention kind / head count / qk_dim wins at each depth, the allocator's predicted error vs
measured values, any trial exported as an ``ArchConfig`` YAML for ``python -m workers.train
--arch``, the failed trials with their errors, and each architecture over its seeds paired
against one (``seeds``: which differences the seeds can tell apart). ``--storage`` falls back
to ``$OPTUNA_STORAGE`` then ``sqlite:///studies.db``; a URL's password is never printed (it
shows as ``***``, and a ``***`` given back reads ``$PGPASSWORD`` or ``~/.pgpass``).
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from common.cli import (
    Parser,
    add_force,
    add_format,
    check_writable,
    dump,
    fail,
    fault,
    int_in,
    number,
    render_table,
    wrote,
)
from common.errors import Problem, TransformerAllocError, UsageError, printable, shell_word
from common.files import dump_yaml, load_yaml, write_atomic
from common.plots import new_figure, write_figure
from studies import query
from studies.errors import StorageFaultError
from studies.seeds import SeedComparison
from studies.storage import engine, open_storage
from studies.tables import allocation_table, training
from studies.trials import Direction, TrialRecord
from studies.urls import command_note, redact, resolve_url, unmask

PROG = "studies"
# Seconds a query waits out a fault that passes while it opens the database (a server with no
# free connection, a connection dropped at that moment), then says so (exit 1).
PATIENCE_S = 30


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=f"python -m {PROG}", description=__doc__.split("\n\n")[1])
    common = Parser(add_help=False)
    common.add_argument("--storage", help="SQLAlchemy URL (default: $OPTUNA_STORAGE, then "
                                          "sqlite:///studies.db)")
    add_format(common)
    common.add_argument("--storage-patience", type=int_in(0, 3600), default=PATIENCE_S,
                        help="seconds a database server with no free connection (or one "
                             "restarting) is waited out before the command stops (exit 1)")
    with_study = Parser(add_help=False, parents=[common])
    with_study.add_argument("--study", help="study name (default: the only study)")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    sub.add_parser("list", parents=[common], help="studies, trial counts by state, best value")
    best = sub.add_parser("best", parents=[with_study], help="the best fully trained allocation")
    top = sub.add_parser("top", parents=[with_study], help="the k best allocations")
    top.add_argument("-k", type=int_in(1), default=5)
    for ranked in (best, top):
        ranked.add_argument("--kv-cache", type=number(0, strict=True), metavar="F",
                       help="a student search's study: only students caching at most F of "
                            "the teacher's KV cache per token")
    pareto = sub.add_parser("pareto", parents=[with_study],
                            help="value vs trainable params (or KV cache) front")
    pareto.add_argument("--x", choices=query.PARETO_AXES, default="params",
                        help="what the value is traded against: trainable parameters, or the "
                             "bytes of keys and values a decoder caches per token")
    pareto.add_argument("--plot", type=Path, help="write the front as a PNG")
    layers = sub.add_parser("layers", parents=[with_study], help="per-depth winners, top k")
    layers.add_argument("-k", type=int_in(1), default=10)
    sub.add_parser("theory", parents=[with_study], help="predicted error vs measured value")
    export = sub.add_parser("export", parents=[with_study],
                            help="a trial as an ArchConfig YAML (a student search's: its "
                                 "compression plan, for workers.compress --plan)")
    export.add_argument("--trial", type=int_in(0), help="trial number (default: the best)")
    export.add_argument("--out", type=Path, help="write the YAML here instead of stdout")
    add_force(export)
    windows = sub.add_parser("windows", parents=[with_study],
                             help="a student search's trials against one, paired by held-out "
                                  "window")
    windows.add_argument("--against", type=int_in(0), metavar="TRIAL",
                         help="the reference trial (default: the allocator's plan)")
    sub.add_parser("errors", parents=[with_study],
                   help="the failed trials and their errors")
    compared = sub.add_parser("seeds", parents=[with_study],
                              help="each architecture over its seeds, paired against one")
    compared.add_argument("--against", type=int_in(0), metavar="TRIAL",
                          help="the reference: the architecture of this trial (default: the "
                               "best mean)")
    compared.add_argument("--with", dest="pooled", action="append", default=[],
                          metavar="STUDY", help="another study of the same task and metric "
                          "whose trials join the points (an arm trained later, in a study "
                          "of its own); its trials show as STUDY#N (repeatable)")
    return p


def _study_name(args: argparse.Namespace, summaries: list[query.StudySummary]) -> str:
    if args.study:
        return str(args.study)
    if len(summaries) == 1:
        return summaries[0].name
    names = ", ".join(printable(s.name) for s in summaries) or "(none)"
    raise UsageError(f"--study: required when the storage holds {len(summaries)} studies; "
                     f"studies: {names}")


def _trial_dict(t: TrialRecord) -> dict[str, Any]:
    return {"number": t.number, "value": t.value, "params_trainable": t.params_trainable,
            "kv_cache": t.kv_cache, "kv_cache_dtype": t.kv_cache_dtype,
            "steps_reached": t.steps_reached, "arch_id": t.arch_id,
            "train": t.train, "arch": t.arch.to_dict() if t.arch else None}


def _list(args: argparse.Namespace, summaries: list[query.StudySummary]) -> str | Any:
    data: list[dict[str, Any]] = [
        {"study": s.name, "direction": s.direction, "trials": s.counts, "best": s.best,
         "task": s.attrs.get("task"), "created": str(s.created) if s.created else None,
         "updated": str(s.updated) if s.updated else None} for s in summaries]
    if args.format != "table":
        return data
    rows = [[printable(d["study"]), d["task"] or "-", d["direction"].lower(),
             " ".join(f"{k.lower()}={v}" for k, v in sorted(d["trials"].items())) or "-",
             f"{d['best']:.6g}" if d["best"] is not None else "-",
             (d["created"] or "-")[:19], (d["updated"] or "-")[:19]] for d in data]
    return render_table(["study", "task", "direction", "trials", "best", "created", "updated"],
                        rows, right=[False] * 7)


@dataclass(frozen=True)
class _Query:
    """What a command on one study works from."""

    args: argparse.Namespace
    eng: sa.Engine
    url: str  # the storage, usable (secrets in it); printed only through ``redact``
    study: str
    metric: str  # the study's task metric, the name of its value


def run(args: argparse.Namespace) -> str | Any:
    """The command's result: text for ``--format table``, data otherwise."""
    url = unmask(resolve_url(args.storage))  # a *** printed by a search or by `top`
    eng = engine(open_storage(url, read_only=True, patience=args.storage_patience))
    summaries = query.list_studies(eng)
    if args.command == "list":
        return _list(args, summaries)
    study = _study_name(args, summaries)
    summary = next((s for s in summaries if s.name == study), None)
    warning = query.record_warning(summary) if summary is not None else None
    if warning:
        print(warning, file=sys.stderr)
    metric = str((summary.attrs if summary is not None else {}).get("metric") or "value")
    return _COMMANDS[args.command](_Query(args, eng, url, study, metric))


def _top(q: _Query) -> str | Any:
    _, winners = query.top(q.eng, q.study, 1 if q.args.command == "best" else q.args.k,
                           kv_cache=q.args.kv_cache)
    if q.args.format != "table":
        return [_trial_dict(t) for t in winners]
    text = "\n\n".join(allocation_table(t, q.metric) for t in winners)
    return (f"{text}\n\nexport: python -m studies export --storage "
            f"{shell_word(redact(q.url))} --study {shell_word(q.study)} --trial "
            f"{winners[0].number}{command_note(q.url)}")


def _pareto(q: _Query) -> str | Any:
    args = q.args
    direction, front = query.pareto(q.eng, q.study, args.x)
    if args.plot is not None:
        _plot_front(front, direction, q.study, args.plot, args.x, q.metric)
        wrote(PROG, args.plot)
    if args.format != "table":
        return [_trial_dict(t) for t in front]
    axis = "trainable params" if args.x == "params" else _axis_name(front, args.x)
    return render_table(["trial", q.metric, axis, "heads per layer"],
                        [[t.number, f"{t.value:.6g}", f"{_axis_value(t, args.x):,}",
                          " ".join(x.heads_str for x in t.arch.layers) if t.arch else "-"]
                         for t in front], right=[True, True, True, False])


def _layers(q: _Query) -> str | Any:
    _, winners = query.top(q.eng, q.study, q.args.k)
    rows = query.layer_summary(winners)
    if q.args.format != "table":
        return rows
    return f"winners per layer across the top {len(winners)} trials\n" + render_table(
        ["layer", "attention", "heads", "n_heads", "qk_dim", "mlp_ratio"],
        [[r["layer"]] + [f"{r[k]} ({r[k + '_share']:.0%})" for k in
                         ("attention", "heads", "n_heads", "qk_dim", "mlp_ratio")]
         for r in rows], right=[True] + [False] * 5)


def _theory(q: _Query) -> str | Any:
    result = query.theory(q.eng, q.study)
    if q.args.format != "table":
        return result
    table = render_table(["trial", "predicted error", f"measured {q.metric}"],
                         [[p["number"], f"{p['predicted_error']:.6g}", f"{p['value']:.6g}"]
                          for p in result["trials"]], right=[True, True, True])
    if result["undefined"]:
        return f"{table}\n{result['undefined']}"
    return f"{table}\nSpearman rank correlation {result['spearman']:.3f} over {result['n']}"


def _export(q: _Query) -> str | Any:
    args = q.args
    trial = query.find_trial(q.eng, q.study, args.trial)
    assert trial.arch is not None
    folder = query.trial_attr(q.eng, q.study, trial.number, PLAN_FOLDER)
    if folder is not None:
        return _export_plan(trial, Path(folder), args.out)
    text = _trained_with(trial) + trial.arch.to_yaml()
    if args.out is not None:
        write_atomic(args.out, text)
        wrote(PROG, args.out)
        return (f"trial {trial.number} of {printable(q.study)}: {trial.arch.describe()}"
                f"{training(trial)}")
    return text if args.format == "table" else trial.arch.to_dict()


PLAN_FOLDER, PLAN = "plan_folder", "plan.yaml"  # where a student trial wrote its plan


def _export_plan(trial: TrialRecord, folder: Path, out: Path | None) -> str:
    """A student trial's compression plan (and its fitted maps, beside it as
    ``OUT-STEM.factors.safetensors``), for ``python -m workers.compress --plan OUT``: the plan
    the trial built its student from."""
    if out is None:
        raise UsageError.of([Problem("out", "", "a student's plan is written with its maps "
                                     "beside it: give {out} PLAN.yaml", shown="")])
    source = folder / PLAN
    if not source.is_file():
        raise UsageError.of([Problem("trial", trial.number, f"its plan {str(source)!r} is gone "
                                     "(the search's storage path holds it); run the search "
                                     "again with --resume to write it", shown="")])
    plan = load_yaml(source.read_text())
    factors = out.with_name(f"{out.stem}.factors.safetensors")
    if plan.get("factors"):
        shutil.copyfile(folder / str(plan["factors"]), factors)
        plan["factors"] = factors.name
    write_atomic(out, dump_yaml(plan))
    wrote(PROG, out)
    return (f"trial {trial.number}: its compression plan ({plan.get('kv_cache')} of the "
            f"teacher's KV cache); build it: python -m workers.compress --checkpoint TEACHER "
            f"--plan {shell_word(str(out))} --out STUDENT")


def _trained_with(trial: TrialRecord) -> str:
    """A YAML comment over an exported architecture: the training fields its trial sampled,
    as ``workers.train`` flags (an ``ArchConfig`` holds the model, not its training)."""
    if not trial.train:
        return ""
    flags = " ".join(f"--{name.replace('_', '-')} {value}" for name, value in
                     sorted(trial.train.items()))
    return f"# trial {trial.number} trained with {flags} (python -m workers.train ... {flags})\n"


def _errors(q: _Query) -> str | Any:
    """The study's failed trials and why each failed (its ``error`` attr)."""
    failed = query.failed_trials(q.eng, q.study)
    data = [{"number": t.number, "status": None if t.status is None else str(t.status),
             "steps_reached": t.steps_reached, "error": t.error} for t in failed]
    if q.args.format != "table":
        return data
    if not data:
        return f"study {printable(q.study)}: no failed trial"
    # One row per trial: an error's newlines (a traceback's) and control characters escaped.
    return f"{len(data)} failed trial(s) of study {printable(q.study)}\n" + render_table(
        ["trial", "status", "steps", "error"],
        [[d["number"], d["status"] or "-", "-" if d["steps_reached"] is None
          else d["steps_reached"], printable(str(d["error"] or "-"))] for d in data],
        right=[True, False, True, False])


def _seeds(q: _Query) -> str | Any:
    compared = query.compare_seeds(q.eng, q.study, q.args.against, q.args.pooled)
    if q.args.format != "table":
        return [_seed_dict(c) for c in compared]
    rows = []
    for c in compared:
        point, first = c.point, c.point.first
        diff = "-" if c.against is None else (
            f"{c.against.difference.mean:+.4f} [{c.against.difference.low:+.4f}, "
            f"{c.against.difference.high:+.4f}]")
        p_worse = "-" if c.against is None or c.against.p_worse is None else \
            f"{c.against.p_worse:.3g}"
        rate = point.tokens_per_s
        rows.append([",".join(point.trial_names),
                     " ".join(x.heads_str for x in first.arch.layers) if first.arch else "-",
                     len(point.values), point.value.describe(), diff, p_worse, c.verdict,
                     f"{first.params_trainable:,}" if first.params_trainable else "-",
                     f"{first.kv_bytes:,}" if first.kv_bytes else "-",
                     f"{rate:,.0f}" if rate else "-"])
    return render_table(["trials", "heads per layer", "seeds", f"{q.metric} (95% CI)",
                         "vs reference, paired", "p worse", "verdict", "trainable params",
                         "KV bytes/token", "tokens/s"], rows,
                        right=[False, False, True, False, False, True, False, True, True,
                               True])


def _seed_dict(c: SeedComparison) -> dict[str, Any]:
    value = c.point.value
    data: dict[str, Any] = {
        "trials": [int(n) if n.isdigit() else n for n in c.point.trial_names],
        "seeds": list(c.point.values),
        "values": list(c.point.values.values()), "mean": value.mean,
        "interval": [value.low, value.high], "verdict": c.verdict,
        "params_trainable": c.point.first.params_trainable,
        "kv_bytes": c.point.first.kv_bytes, "tokens_per_s": c.point.tokens_per_s,
        "heads": [x.heads_str for x in c.point.first.arch.layers] if c.point.first.arch
        else None}
    if c.against is not None:
        d = c.against.difference
        data["against"] = {"seeds": list(c.seeds), "difference": d.mean,
                           "interval": [d.low, d.high], "p_worse": c.against.p_worse}
    return data


def _windows(q: _Query) -> str | Any:
    reference, compared = query.compare_windows(q.eng, q.study, q.args.against)
    if q.args.format != "table":
        return {"against": reference, "trials": [
            {"number": c.number, "label": c.label, "kv_cache": c.kv_cache, "loss": c.loss,
             "perplexity": math.exp(c.loss), "difference": c.difference,
             "interval": [c.low, c.high]} for c in compared]}
    rows = [[c.number, c.label or "-", f"{c.kv_cache:,}" if c.kv_cache else "-",
             f"{c.loss:.4f}", f"{math.exp(c.loss):.2f}",
             f"{c.difference:+.4f} [{c.low:+.4f}, {c.high:+.4f}]"] for c in compared]
    return (f"held-out loss against trial {reference}, paired by window (95% bootstrap "
            "interval; below 0: better)\n" + render_table(
                ["trial", "fixed", "KV bytes/token", q.metric, "perplexity", "vs reference"],
                rows, right=[True, False, True, True, True, False]))


_COMMANDS: dict[str, Callable[[_Query], str | Any]] = {
    "best": _top, "top": _top, "pareto": _pareto, "layers": _layers, "theory": _theory,
    "export": _export, "errors": _errors, "seeds": _seeds, "windows": _windows}


def _axis_value(t: TrialRecord, x: str) -> int:
    """The trial's x coordinate on a Pareto front along ``x``."""
    return (t.params_trainable if x == "params" else t.kv_cache) or 0


def _axis_name(front: list[TrialRecord], x: str) -> str:
    """The x axis's name, with the dtype(s) the KV cache bytes are counted in."""
    if x == "params":
        return "trainable parameters"
    dtypes = "/".join(sorted({t.kv_cache_dtype for t in front}))
    return f"KV cache per token (bytes, {dtypes})"


def _plot_front(front: list[TrialRecord], direction: str, study: str, path: Path,
                x: str = "params", metric: str = "value") -> None:
    fig, ax = new_figure(1, (6, 4.2))
    xs = [_axis_value(t, x) for t in front]
    ax.plot(xs, [t.value or 0.0 for t in front], "o-")
    for t, at in zip(front, xs):
        ax.annotate(f"#{t.number}", (at, t.value or 0), fontsize=8)
    ax.set_xlabel(_axis_name(front, x))
    better = "higher" if Direction.from_storage(direction) is Direction.MAXIMIZE else "lower"
    ax.set_ylabel(f"{metric} ({better} is better)")
    ax.set_title(f"Pareto front of {study}")
    write_figure(fig, path)


# the library's fields in this command's words (the flags sit on the subcommands; a storage
# fault's remedy is the search's --resume)
FLAGS = {"study": "--study", "trial": "--trial", "storage": "--storage", "x": "--x",
         "kv_cache": "--kv-cache", "out": "--out",
         "force": "--force", "resume": "--resume", "against": "--against", "with": "--with"}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "plot", None) is not None:
            check_writable("--plot", args.plot)
        if getattr(args, "out", None) is not None:
            check_writable("--out", args.out, force=args.force)
        result = run(args)
    except StorageFaultError as err:  # the database, not the input: exit 1
        return fault(f"python -m {PROG}", err.text(FLAGS))
    except TransformerAllocError as err:
        return fail(f"python -m {PROG}", err.text(FLAGS))
    print(result if isinstance(result, str) else dump(result, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
