"""python -m workers.compress --checkpoint PATH --plan plan.yaml --task lm --out student.pt

Build the student a checkpoint profile planned (``python -m workers.profile --checkpoint --out
plan.yaml``): the same model with the planned heads' ``qk_dim`` reduced, each head's query and
key maps initialised from the truncated SVD of its ``W_Q,h W_K,h^T`` (the best rank-r map,
Eckart-Young; docs/theory.md §10) or, for RoPE heads, from the leading frequency pairs of its
key/value head (§10.2), everything else copied; then fine-tune it for ``--finetune-steps`` on
the data or task. Reports parameters, weights bytes and KV cache per token of teacher and
student, and the loss and metric of the teacher, of the student right after the cut, and after
fine-tuning. ``--out`` ending in ``.pt`` writes a ``workers.train`` checkpoint (with the
student's architecture as YAML beside it, for ``--arch`` and ``--resume``); a folder writes a
``transformers`` folder: ``--layout compact`` (default) at the student's real shapes with its
own modelling file, ``--layout stock`` in the GPT-2 or Llama teacher's padded layout.

This module reads the flags into a ``CompressRequest`` and prints the ``CompressResult``; the
work is ``workers.compression.compressor.compress``, imported once the flags are read, so that
``--help`` needs no torch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common.cli import (
    Parser,
    add_force,
    add_format,
    dump,
    fail,
    fault,
    flag_names,
    int_in,
    number,
    render_table,
    wrote,
)
from common.errors import TransformerAllocError
from common.progress import duration
from workers.compression import (
    EVAL_TOKENS,
    FINETUNE_LOSSES,
    FINETUNE_PARAMS,
    PROG,
    CompressRequest,
    CompressResult,
)
from workers.errors import FineTuneInterrupted
from workers.taskargs import TASK_FLAGS, add_task_args, task_spec


def eval_tokens(text: str) -> int:
    """argparse type of ``--eval-tokens``: an integer >= 0, or ``all`` (0: every window)."""
    return 0 if text == "all" else int_in(0)(text)


def render(result: CompressResult) -> str:
    """The report as tables: sizes, heads per layer, and the evaluations made."""
    p, kv, files = result.params, result.kv_cache, result.files
    stock = result.out_layout == "stock"
    # what the written student holds: the stock layout stores the teacher's shapes
    params, cache = ((p.teacher_total, kv.teacher) if stock else (p.student_total, kv.student))
    student = "latent student" if result.form.latent else "student"
    lines = [f"{result.checkpoint} ({result.family}) -> {result.out} ({student}, "
             f"{result.out_layout})",
             render_table(["", "parameters", "weights bytes", f"KV cache/token ({kv.dtype})"],
                          [["teacher", f"{p.teacher_total:,}", f"{files.teacher:,}",
                            f"{kv.teacher:,}"],
                           ["student", f"{params:,}", f"{files.student:,}", f"{cache:,}"],
                           ["saved", _fewer(p.teacher_total, params),
                            _fewer(files.teacher, files.student), _fewer(kv.teacher, cache)]]),
             render_table(["layer", "teacher heads", "student heads"],
                          [[x.layer, x.teacher, x.student] for x in result.heads],
                          right=[True, False, False])]
    if stock:
        lines.append(f"stock layout: loads in stock transformers, but is NOT smaller: the cut "
                     f"query-key dims are stored as zeros at the teacher's shapes; --layout "
                     f"compact writes the student at its real size ({p.student_total:,} "
                     f"parameters, {kv.student:,} bytes of KV cache per token)")
    evaluations = {name: e.to_dict() for name, e in result.evaluations.items()}
    if evaluations:
        keys = list(evaluations["teacher"])
        lines.append(render_table(["model", *keys], [[name] + [f"{values[k]:.5g}" for k in keys]
                                                     for name, values in evaluations.items()]))
        lines.append(f"scored on {result.eval_windows:,} validation window(s) of "
                     f"{result.eval_seq_len:,} tokens each (--eval-tokens)")
    tuned = result.finetune
    if tuned is not None:
        resumed = f", {tuned.resumed_from:,} of them before a resume" if tuned.resumed_from else ""
        trained = "new maps" if tuned.params == "new" else "the whole student"
        lines.append(f"fine-tune: {tuned.steps:,} steps of {tuned.loss} ({trained}: "
                     f"{tuned.trained_params:,} parameters{resumed}), last loss "
                     f"{tuned.last_loss:.4g}, in {duration(tuned.wall_s)} "
                     f"({tuned.cpu_s / 60:.1f} CPU-minutes)")
    return "\n".join(lines)


def _fewer(before: int, after: int) -> str:
    if not before:
        return "-"
    return f"{1 - after / before:.1%} fewer" if after <= before else f"{after / before:.2f}x more"


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=f"python -m {PROG}", description=__doc__.split("\n\n")[1])
    p.add_argument("--checkpoint", type=Path, required=True,
                   help="the teacher: a workers.train .pt, or a folder saved by transformers "
                        "(GPT-2, Llama, Qwen2, Mistral) or by this command")
    p.add_argument("--plan", type=Path, required=True,
                   help="its profile (python -m workers.profile --checkpoint ... --out)")
    p.add_argument("--out", type=Path, required=True,
                   help="student.pt (a workers.train checkpoint) or a folder that transformers "
                        "loads (see --layout)")
    p.add_argument("--layout", choices=("compact", "stock"),
                   help="a folder --out: compact (default) writes the student at its real, "
                        "smaller shapes with its own modelling file (AutoModelForCausalLM, "
                        "trust_remote_code=True); stock keeps the teacher's GPT-2 or Llama "
                        "layout, cut dims stored as zeros: compatible, not smaller")
    add_task_args(p, required=False,
                  default="the task the checkpoint was trained on, if it says")
    p.add_argument("--smoke-test", action="store_true", help="--task at its smoke size")
    p.add_argument("--seq-len", type=int_in(1),
                   help="window of --data or --task (default: the model's max_seq_len)")
    p.add_argument("--finetune-steps", type=int_in(0), default=0,
                   help="fine-tune the student for this many steps on --data or --task "
                        "(default 0: none)")
    p.add_argument("--finetune-loss", choices=FINETUNE_LOSSES, default="kl",
                   help="kl (default): KL(teacher || student) of the next-token "
                        "distributions, the teacher run on each batch; ce: the data's "
                        "next tokens")
    p.add_argument("--finetune-params", choices=FINETUNE_PARAMS, default="new",
                   help="new (default): train only the maps the cut made (latent down/up and "
                        "queries, cut query-key maps), everything copied from the teacher "
                        "frozen; all: the whole student")
    p.add_argument("--finetune-hidden", type=number(0), default=0.0, metavar="W",
                   help="add W x each block's output error relative to the teacher's to "
                        "the loss (default 0: none)")
    p.add_argument("--save-every", type=int_in(1), default=50, metavar="K",
                   help="checkpoint the fine-tune every K steps (and on Ctrl-C) beside --out "
                        "as NAME.finetune.pt; the same command re-run continues it "
                        "(default 50)")
    p.add_argument("--resume", action="store_true",
                   help="continue the fine-tune checkpoint beside --out (refused when there "
                        "is none; a matching one is continued without this flag too)")
    p.add_argument("--lr", type=number(0, strict=True), default=3e-4)
    p.add_argument("--batch-size", type=int_in(1), default=32)
    p.add_argument("--eval-batches", type=int_in(1), default=8,
                   help="validation batches of --batch-size windows each evaluation draws "
                        "from (default 8)")
    p.add_argument("--eval-tokens", type=eval_tokens, default=EVAL_TOKENS, metavar="N|all",
                   help=f"tokens each evaluation scores: the first ceil(N / window) windows "
                        f"of those batches (default {EVAL_TOKENS:,}); 0 or all: every one")
    p.add_argument("--seed", type=int_in(0), default=0)
    add_force(p, "--out (a .pt and its .arch.yaml, or a folder)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress on stderr (a bar on a terminal, else a line per stage "
                        "and per fine-tuning evaluation); errors and the report still print")
    add_format(p)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from workers.compression import compress

    try:
        result = compress(request_from_args(args))
    except FineTuneInterrupted as err:  # not bad input: the same command continues it
        return fault(PROG, err.text(flag_names(parser, **TASK_FLAGS)))
    except TransformerAllocError as err:
        return fail(PROG, err.text(flag_names(parser, **TASK_FLAGS)))
    if not result.reduces:
        print(f"{PROG}: the plan lowers no qk_dim: the student is as large as the teacher "
              f"({result.params.teacher_total:,} parameters)" + (
                  "" if result.measured else
              "; profile with --data or --task so that a reduction can be measured"),
              file=sys.stderr)
    wrote(PROG, *result.written)
    print(render(result) if args.format == "table" else dump(result.to_dict(), args.format))
    return 0


def request_from_args(args: argparse.Namespace) -> CompressRequest:
    """The ``CompressRequest`` the flags describe.

    Raises:
        UsageError: a malformed ``--task-param``; TaskError: a task that breaks a rule.
    """
    return CompressRequest(
        checkpoint=args.checkpoint, plan=args.plan, out=args.out, layout=args.layout,
        task=task_spec(args), seq_len=args.seq_len,
        finetune_steps=args.finetune_steps, lr=args.lr, batch_size=args.batch_size,
        finetune_loss=args.finetune_loss, finetune_params=args.finetune_params,
        finetune_hidden=args.finetune_hidden, save_every=args.save_every, resume=args.resume,
        eval_batches=args.eval_batches, eval_tokens=args.eval_tokens, force=args.force,
        quiet=args.quiet)


if __name__ == "__main__":
    sys.exit(main())
