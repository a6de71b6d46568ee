"""The one root of the project's errors.

Every error the project raises on purpose derives from ``TransformerAllocError``: input that
breaks a rule (a flag, a YAML key, a data file, a checkpoint, a storage URL) or a state the user
must change (a study that already exists). Its message is one line naming the field, the value
and the rule. Library code raises the domain subclass (``ConfigError``, ``DataError``, ...);
only a command's ``main()`` turns it into that line on stderr and exit code 2. Any other
exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class TransformerAllocError(Exception):
    """Root of every error the project raises on purpose; the message is one line."""


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
