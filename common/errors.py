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
