"""The one root of the project's errors.

Every error the project raises on purpose derives from ``TransformerAllocError``: input that
breaks a rule (a flag, a YAML key, a data file, a checkpoint, a storage URL) or a state the user
must change (a study that already exists). Its message is one line naming the field, the value
and the rule. Library code raises the domain subclass (``ConfigError``, ``DataError``, ...);
only a command's ``main()`` turns it into that line on stderr and exit code 2. Any other
exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Self

# a field named inside a rule: ``{layers}``
_FIELD = re.compile(r"\{([a-z_][a-z0-9_.]*)\}")


@dataclass(frozen=True)
class Problem:
    """One broken rule, in the library's words: the field (a record's field, ``extract_layers``,
    ``task.params``), its value, and the rule it breaks, which may name other fields as
    ``{field}``. A command shows it with its flags' names instead (``line(flags)``), so the
    Python API speaks of fields and the command line of flags.

    Attributes:
        shown: how the line shows ``value`` (None: ``str(value)``; "": not at all).
    """

    field: str
    value: object
    rule: str
    shown: str | None = None

    def line(self, names: Mapping[str, str] | None = None) -> str:
        """``field value: rule``, each field written as ``names`` calls it (a flag), else as
        itself."""
        names = names or {}
        rule = _FIELD.sub(lambda m: names.get(m.group(1), m.group(1)), self.rule)
        shown = str(self.value) if self.shown is None else self.shown
        return f"{names.get(self.field, self.field)}{' ' if shown else ''}{shown}: {rule}"


class TransformerAllocError(Exception):
    """Root of every error the project raises on purpose; the message is one line.

    Raised with problems (``of``), the message joins their lines in the library's words and
    ``broken`` keeps them, so that a command shows them with its flags' names (``text``)."""

    broken: tuple[Problem, ...] = ()
    prefix: str = ""  # before the problems' lines: e.g. the record's name

    @classmethod
    def of(cls, problems: Sequence[Problem], prefix: str = "") -> Self:
        """The error for ``problems`` (at least one): their lines joined by ``"; "``."""
        err = cls(prefix + "; ".join(p.line() for p in problems))
        err.broken, err.prefix = tuple(problems), prefix
        return err

    def text(self, names: Mapping[str, str]) -> str:
        """The message with each problem's fields written as ``names`` calls them (a command's
        flags); a message raised without problems as it is."""
        if not self.broken:
            return str(self)
        return self.prefix + "; ".join(p.line(names) for p in self.broken)


class UsageError(TransformerAllocError):
    """A command-line flag whose value breaks a rule found after parsing (the flag's own
    type and choices are argparse's)."""


def excerpt(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut to about ``limit`` characters: what an error line shows of a value
    (a value read from a file may be megabytes)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on (ESC, BEL, a newline, a bidi
    override: whatever ``str.isprintable`` refuses) written as its Python escape, ``\\x1b``: a
    name read from a database goes into a line as itself, never as a control sequence."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def shell_word(text: str) -> str:
    """``text`` as one word of a POSIX shell command to copy: ``shlex.quote`` when it is all
    printable, else bash's ``$'...'`` quoting, whose escapes a terminal shows as text and the
    shell turns back into the very characters (``$'bad\\x1b[31m'``)."""
    import shlex

    if text.isprintable():
        return shlex.quote(text)
    return "$'" + "".join(_ansi_c(c) for c in text) + "'"


def _ansi_c(char: str) -> str:
    """One character inside bash's ``$'...'``: escaped when it is a quote, a backslash or not
    printable (with a fixed number of hex digits, so a following digit is never read into it)."""
    if char in "\\'":
        return "\\" + char
    if char.isprintable():
        return char
    code = ord(char)  # \xHH is a byte to bash: above ASCII, the character's \u form
    return f"\\x{code:02x}" if code < 0x80 else (
        f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
