"""How a command names its task: ``--task NAME`` (a generated task) or ``--data PATH`` (the
user's own data), with ``--task-param KEY=VALUE`` overrides; shared by ``workers.train`` and
``workers.search``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from common.cli import UsageError, int_in
from search_spaces.data import DTYPES, FORMATS, DataError, DataSpec
from workers.tasks import DATA_TASKS, TASKS, Task, TaskError, make_data_task, make_task


def add_task_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    """``--task`` or ``--data`` (one is required unless ``required`` is False) and their
    parameters."""
    source = p.add_mutually_exclusive_group(required=required)
    source.add_argument("--task", choices=sorted(set(TASKS) - set(DATA_TASKS)),
                        help="a generated task")
    source.add_argument("--data", type=Path,
                        help="your data: a UTF-8 text file or folder of *.txt, a folder with "
                             "nanoGPT's train.bin/val.bin, or x.npy (with y.npy)")
    p.add_argument("--data-format", choices=FORMATS, help="default: from the --data path")
    p.add_argument("--data-dtype", choices=DTYPES, default="uint16",
                   help="token type of .bin files")
    p.add_argument("--vocab-size", type=int_in(1),
                   help=".bin vocabulary (default: meta.pkl/meta.json, else the largest token "
                        "+ 1)")
    p.add_argument("--task-param", action="append", default=[], metavar="KEY=VALUE",
                   help="override a task parameter, e.g. m_max=10, or length=N of --data "
                        "(repeatable)")


def parse_task_params(items: list[str]) -> dict[str, Any]:
    """``["m_max=10", ...]`` -> ``{"m_max": 10}`` (ints, then floats, else strings)."""
    params: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--task-param {item!r}: expected KEY=VALUE")
        for cast in (int, float):
            try:
                params[key] = cast(text)
                break
            except ValueError:
                continue
        else:
            params[key] = text
    return params


def task_from_args(args: argparse.Namespace, size: str, data: DataSpec | None = None) -> Task:
    """The task the flags name (``data``: a default source, e.g. a search space's).

    Raises:
        UsageError: one line naming the flag, the value and the rule.
    """
    params = parse_task_params(args.task_param)
    if args.data is not None:
        data = DataSpec(str(args.data), args.data_format, args.data_dtype, args.vocab_size)
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
