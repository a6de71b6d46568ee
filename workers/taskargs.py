"""How a command names its task: ``--task NAME`` (a generated task) or ``--data PATH`` (the
user's own data), with ``--task-param KEY=VALUE`` overrides; shared by ``workers.train`` and
``workers.search``, and (``task_for_model``) by the commands that run a trained model:
``workers.profile --checkpoint`` and ``workers.compress``.

Outside ``workers.tasks`` and free of torch until a task is built, so that the commands' flags
(and ``--help``) need no torch: the generated tasks' names are listed here (a test checks them
against ``workers.tasks.TASKS``), and ``workers.tasks`` is imported only to build a task.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from arch import ArchConfig
from common.cli import parse_task_params
from common.errors import UsageError
from userdata import DataError, DataSpec, add_data_args, data_spec
from workers.errors import TaskError

if TYPE_CHECKING:
    from workers.tasks import Task

# The generated tasks (``make_task``, ``--task``): names ``workers.tasks.TASKS`` registers.
GENERATED_TASKS = ("addition", "denoise", "dyck", "icl_linear", "induction", "kernel", "lm",
                   "memorize", "modadd", "ngram", "retrieval")


def add_task_args(p: argparse.ArgumentParser, required: bool = True,
                  default: str | None = None) -> None:
    """``--task`` or ``--data`` (one is required unless ``required`` is False; ``default``
    says what is used without either) and their parameters."""
    source = p.add_mutually_exclusive_group(required=required)
    source.add_argument("--task", choices=GENERATED_TASKS,
                        help="a generated task" + (f" (default: {default})" if default else ""))
    add_data_args(p, source)
    p.add_argument("--task-param", action="append", default=[], metavar="KEY=VALUE",
                   help="override a task parameter, e.g. m_max=10, or length=N of --data "
                        "(repeatable)")


def task_from_args(args: argparse.Namespace, size: str, data: DataSpec | None = None) -> Task:
    """The task the flags name (``data``: a default source, e.g. a search space's).

    Raises:
        UsageError: one line naming the flag, the value and the rule.
    """
    from workers.tasks import make_data_task, make_task  # torch: only once a task is built

    params = parse_task_params(args.task_param)
    if args.data is not None:
        data = data_spec(args)
    elif args.data_format or args.vocab_size:
        raise UsageError("--data-format/--vocab-size: only with --data")
    if args.task is not None:
        try:
            return make_task(args.task, size, args.seed, **params)
        except (TaskError, TypeError) as err:
            raise UsageError(f"--task: {err}") from None
    if data is None:
        raise UsageError("--task or --data: one is required")
    unknown = sorted(set(params) - {"length"})
    if unknown:
        raise UsageError(f"--task-param {unknown[0]}: a --data task takes only length=N")
    try:
        return make_data_task(data, size, args.seed, params.get("length"))
    except (DataError, ValueError) as err:
        raise UsageError(str(err)) from None


def task_for_model(arch: ArchConfig, *, data: DataSpec | None = None, task: str | None = None,
                   params: Mapping[str, Any] | None = None, size: str = "paper", seed: int = 0,
                   seq_len: int | None = None) -> tuple[Task | None, str]:
    """The task a trained model runs on, and the flag that chose it (for messages): ``data`` or
    the generated ``task``, in windows of the model's length (``seq_len``: shorter ones) unless
    ``params`` set ``length``; (None, "no task") when neither is given.

    Raises:
        TaskError, DataError: an unknown task or parameter, or unusable data.
    """
    from workers.tasks import make_data_task, make_task  # torch: only once a task is built

    params = dict(params or {})
    window = min(seq_len or arch.max_seq_len, arch.max_seq_len)
    if data is not None:
        unknown = sorted(set(params) - {"length"})
        if unknown:
            raise TaskError(f"--task-param {unknown[0]}: a --data task takes only length=N")
        # Token windows take the model's length, and token files without --vocab-size or a
        # meta file the model's vocabulary; vector sequences keep their own length (at most
        # the model's: ``check_fits``) unless ``length`` says otherwise.
        default = None if data.resolved().format == "npy" else window
        data = dataclasses.replace(data, default_vocab=arch.vocab_size)
        return (make_data_task(data, size, seed, params.get("length", default)),
                f"--data {data.path!r}")
    if task is None:
        return None, "no task"
    try:
        made = make_task(task, size, seed, **params)
    except TypeError as err:
        raise TaskError(f"--task-param: {err}") from None
    if "length" not in params and hasattr(made, "length") and made.seq_len != window:
        # Tasks whose window is their ``length`` (lm, induction, dyck) take the model's.
        made = dataclasses.replace(made, length=made.length + window - made.seq_len)  # type: ignore[call-arg]
    return made, f"--task {task}"


def check_fits(task: Task, arch: ArchConfig, trains: bool, source: str) -> None:
    """``task`` feeds ``arch`` as it is: the same vocabulary (or input/output widths), windows
    no longer than its positions, and, where a student is trained or saved as a ``workers.train``
    checkpoint (``trains``), exactly its length (the trainer wires the model to the task).

    Raises:
        TaskError: naming ``source`` (the flag that chose the task) and the mismatch.
    """
    io = task.io
    for name, want in (("vocab_size", arch.vocab_size), ("input_dim", arch.input_dim),
                       ("output_dim", arch.output_dim)):
        got = getattr(io, name)
        if got != want:
            hint = ("; give --vocab-size" if name == "vocab_size" and source.startswith("--data")
                    else "")
            raise TaskError(f"{source}: {name} {got}, the checkpoint's model has {want}{hint}")
    if io.max_seq_len > arch.max_seq_len or (trains and io.max_seq_len != arch.max_seq_len):
        rule = ("at most" if not trains else
                "exactly (fine-tuning and .pt students keep the model's positions)")
        raise TaskError(f"{source}: windows of {io.max_seq_len} tokens, the checkpoint's model "
                        f"takes {rule} {arch.max_seq_len}; leave --seq-len out (the model's "
                        "length) or set it there")
