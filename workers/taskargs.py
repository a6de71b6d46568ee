"""How a command names its task: ``--task NAME`` (a generated task) or ``--data PATH`` (the
user's own data), with ``--task-param KEY=VALUE`` overrides, read once into a ``TaskSpec``
(``task_spec``) by ``workers.train``, ``workers.search``, ``workers.profile --checkpoint`` and
``workers.compress``; and the one resolver that builds the task a ``TaskSpec`` names
(``resolve_task``), for a trained model in windows of its length.

Outside ``workers.tasks`` and free of torch until a task is built, so that the commands' flags
(and ``--help``) need no torch: ``workers.tasks`` is imported only to build a task.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from arch import ArchConfig
from common.cli import parse_task_params
from common.errors import Problem, UsageError
from userdata import (
    DATA_FLAGS,
    GENERATED_TASKS,
    DataError,
    DataSpec,
    TaskSpec,
    add_data_args,
    data_spec,
)
from workers.errors import TaskError

if TYPE_CHECKING:
    from workers.tasks import Task

# The flag that sets each field of a ``TaskSpec`` and of its data's ``DataSpec`` (the commands
# show their problems so).
TASK_FLAGS = {"task.name": "--task", "task.data": "--data", "task.params": "--task-param",
              "task.seed": "--seed", **DATA_FLAGS}


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


def task_spec(args: argparse.Namespace, data: DataSpec | None = None) -> TaskSpec:
    """The ``TaskSpec`` the flags name, the same in every command: at ``--size`` if the command
    has it and it is given, else the smoke size with ``--smoke-test``, else the paper size
    (``data``: the default source without ``--task`` or ``--data``, e.g. a search space's).

    Raises:
        UsageError: a malformed ``--task-param``, or ``--data-format``/``--vocab-size``
            without ``--data``; TaskError: a field that breaks its rule.
    """
    params = parse_task_params(args.task_param)
    if args.data is not None:
        data = data_spec(args)
    elif args.data_format or args.vocab_size:
        raise UsageError("--data-format/--vocab-size: only with --data")
    size = vars(args).get("size") or ("smoke" if args.smoke_test else "paper")
    return TaskSpec(args.task, None if args.task is not None else data, params, size, args.seed)


def task_from_args(args: argparse.Namespace, data: DataSpec | None = None) -> Task:
    """The task the flags name (``task_spec``, then ``resolve_task``), its problems shown with
    the flags' names.

    Raises:
        UsageError: one line naming the flag, the value and the rule.
    """
    try:
        task = resolve_task(task_spec(args, data))
    except (TaskError, DataError) as err:
        raise UsageError(err.text(TASK_FLAGS)) from None
    if task is None:
        raise UsageError("--task or --data: one is required")
    return task


def resolve_task(spec: TaskSpec, model: ArchConfig | None = None,
                 seq_len: int | None = None) -> Task | None:
    """The task ``spec`` names (None when it names none). For a trained ``model``, in windows
    of its length (``seq_len``: shorter ones) unless ``params`` set ``length``, and token data
    without a vocabulary of its own in the model's.

    Raises:
        TaskError: an unknown parameter of the task; DataError: unusable data.
    """
    from workers.tasks import make_data_task, make_task  # torch: only once a task is built

    window = None if model is None else min(seq_len or model.max_seq_len, model.max_seq_len)
    params = dict(spec.params)
    if spec.data is not None:
        data, length = spec.data, params.get("length")
        if model is not None:
            # Token windows take the model's length, and token files without --vocab-size or
            # a meta file the model's vocabulary; vector sequences keep their own length (at
            # most the model's: ``check_fits``) unless ``length`` says otherwise.
            if length is None and data.resolved().format != "npy":
                length = window
            data = dataclasses.replace(data, default_vocab=model.vocab_size)
        try:
            return make_data_task(data, spec.size, spec.seed, length)
        except ValueError as err:
            raise DataError(str(err)) from None
    if spec.name is None:
        return None
    try:
        made = make_task(spec.name, spec.size, spec.seed, **params)
    except (TaskError, TypeError) as err:
        raise TaskError.of([Problem("task.name", spec.name, str(err), shown="")]) from None
    if (window is not None and "length" not in params and hasattr(made, "length")
            and made.seq_len != window):
        # Tasks whose window is their ``length`` (lm, induction, dyck) take the model's.
        made = dataclasses.replace(made, length=made.length + window - made.seq_len)  # type: ignore[call-arg]
    return made


def source(spec: TaskSpec) -> str:
    """What was sampled, as a plan records it (``--data 'x'``, ``--task lm``)."""
    if spec.data is not None:
        return f"--data {spec.data.path!r}"
    return f"--task {spec.name}" if spec.name is not None else "no task"


def chosen_by(spec: TaskSpec | None) -> tuple[str, str]:
    """The field that chose the task and its value as a message shows it (``task.data``,
    ``'x.txt'``); None: the checkpoint's own task."""
    if spec is None or not spec.given:
        return "the checkpoint's task", ""
    if spec.data is not None:
        return "task.data", repr(spec.data.path)
    return "task.name", str(spec.name)


def check_fits(task: Task, arch: ArchConfig, trains: bool, spec: TaskSpec | None) -> None:
    """``task`` feeds ``arch`` as it is: the same vocabulary (or input/output widths), windows
    no longer than its positions, and, where a student is trained or saved as a ``workers.train``
    checkpoint (``trains``), exactly its length (the trainer wires the model to the task).

    Raises:
        TaskError: a problem naming the field that chose the task (``spec``'s; None: the
            checkpoint's own) and the mismatch.
    """
    field, shown = chosen_by(spec)
    io = task.io
    for name, want in (("vocab_size", arch.vocab_size), ("input_dim", arch.input_dim),
                       ("output_dim", arch.output_dim)):
        got = getattr(io, name)
        if got != want:
            hint = "; give {vocab_size}" if name == "vocab_size" and field == "task.data" else ""
            raise TaskError.of([Problem(field, shown, f"{name} {got}, the checkpoint's model "
                                        f"has {want}{hint}")])
    if io.max_seq_len > arch.max_seq_len or (trains and io.max_seq_len != arch.max_seq_len):
        rule = ("at most" if not trains else
                "exactly (a .pt student keeps the model's positions)")
        raise TaskError.of([Problem(field, shown, f"windows of {io.max_seq_len} tokens, the "
                                    f"checkpoint's model takes {rule} {arch.max_seq_len}; leave "
                                    "{seq_len} out (the model's length) or set it there")])
