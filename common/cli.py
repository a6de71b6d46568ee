"""Command-line conventions of the project's ``python -m`` entry points.

Bad input is one line on stderr naming the flag, the value and the rule, with exit code 2;
results go to stdout as ``--format table|json|yaml``; ``--help`` shows each default once.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from common.errors import Problem, UsageError, excerpt
from common.files import dump_yaml

FORMATS = ("table", "json", "yaml")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends ``(default: X)`` to a flag's help unless the help already states its default or
    there is none worth showing (``None``, ``False``, suppressed, a switch's); a flag without
    help text still shows its default."""

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and _shows_default(action):
            action = copy.copy(action)
            action.help = "(default: %(default)s)"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or not _shows_default(action):
            return text
        return f"{text} (default: %(default)s)"


def _shows_default(action: argparse.Action) -> bool:
    default = action.default
    return not (default is None or default is False or default == argparse.SUPPRESS
                or action.option_strings == [] or (isinstance(default, list) and not default)
                or action.nargs == 0)  # a switch (store_true/false): its default is its absence


class Parser(argparse.ArgumentParser):
    """``ArgumentParser`` whose errors are one line (no usage dump) with exit code 2, and whose
    help shows defaults once (``HelpFormatter``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def flag_names(parser: argparse.ArgumentParser, **fields: str) -> dict[str, str]:
    """The flag that sets each field, for showing a library's problems in the command's words
    (``TransformerAllocError.text``): each option's destination -> its long name
    (``extract_layers`` -> ``--extract-layers``), and ``fields`` (a nested field's flag,
    ``task.params`` -> ``--task-param``) over them."""
    names = {a.dest: max(a.option_strings, key=len) for a in parser._actions
             if a.option_strings and a.dest != "help"}
    return {**names, **fields}


def given_dests(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> frozenset[str]:
    """The destinations ``argv``'s flags set explicitly (a default, whatever its value, is not
    given): ``argv`` parsed again into a namespace holding a marker for every destination,
    which argparse leaves where no flag is given. ``argv`` must parse (parse it first)."""
    unset = object()
    dests = vars(parser.parse_args(argv))
    parsed = parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(dests, unset)))
    return frozenset(d for d, value in vars(parsed).items() if value is not unset)


def fail(prog: str, message: str) -> int:
    """Print one error line for ``prog`` and return the bad-input exit code."""
    return _error_line(prog, message, 2)


def fault(prog: str, message: str) -> int:
    """Print one error line for ``prog`` and return 1: not bad input, but work that stopped
    (a fault of the machine, an interruption) and that the same command continues."""
    return _error_line(prog, message, 1)


def _error_line(prog: str, message: str, code: int) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """argparse type: an integer in ``[low, high]``, with the rule in the error."""
    rule = f"an integer >= {low}" if high is None else f"an integer between {low} and {high}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: must be {rule}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text!r}: must be {rule}")
        return value

    return parse


def number(low: float, strict: bool = False) -> Callable[[str], float]:
    """argparse type: a finite number ``>= low`` (``> low`` if ``strict``)."""
    rule = f"a number {'>' if strict else '>='} {low:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: must be {rule}") from None
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"{text!r}: must be {rule}")
        return value

    return parse


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


def add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", "-f", choices=FORMATS, default="table",
                        help="output format")


def check_writable(name: str, path: Path, force: bool | None = None) -> None:
    """Raise ``UsageError`` unless ``path`` can be created (its directory exists and its name
    is one the file system takes); with ``force`` False, also if it exists (a checkpoint or an
    architecture file is never overwritten silently: ``force`` says to). ``name`` is what names
    ``path``: a command's flag (``--out``) or a library's field (``out``), the problem's field;
    the rule names ``{force}``, shown as the command's flag."""
    parent = path.parent if str(path.parent) else Path(".")
    shown = excerpt(str(path))

    def bad(rule: str) -> UsageError:
        return UsageError.of([Problem(name, shown, rule)])

    try:
        if not parent.is_dir():
            raise bad(f"directory {excerpt(str(parent))} does not exist")
        if path.is_dir():
            raise bad("is a directory, expected a file path")
        if force is False and path.exists():
            raise bad("exists; pass {force} to overwrite it")
    except OSError as err:  # a name too long, or a component that is not a directory
        raise bad(f"not a usable path ({err.strerror})") from None
    if len(path.name.encode()) > 255:
        raise bad("a file name is at most 255 bytes")


def add_force(parser: argparse.ArgumentParser, what: str = "--out") -> None:
    parser.add_argument("--force", action="store_true",
                        help=f"overwrite an existing {what} (refused without)")


def wrote(prog: str, *paths: Path | str) -> None:
    """Say on stderr which files a command wrote (one line each)."""
    for path in paths:
        print(f"{prog}: wrote {path}", file=sys.stderr)


def dump(data: Any, fmt: str) -> str:
    """``data`` as JSON or YAML text."""
    if fmt == "json":
        return json.dumps(data, indent=2)
    return dump_yaml(data)


def render_table(headers: Sequence[str], rows: Sequence[Sequence[Any]],
                 right: Sequence[bool] | None = None) -> str:
    """A plain monospace table; numbers right-aligned unless ``right`` says otherwise."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    if right is None:
        right = [isinstance(c, (int, float)) for c in rows[0]] if rows else [False] * len(headers)
    lines = []
    for n, row in enumerate(cells):
        parts = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right)]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
