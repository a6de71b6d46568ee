"""Output files written whole or not at all: a crash never leaves a half-written result."""

from __future__ import annotations

import csv
import io
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

# A space, plan, profile or config is kilobytes: this bounds what a wrong file can cost.
MAX_YAML_CHARS = 1 << 20


class _NoAliasLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses aliases (``*name``): nested aliases expand exponentially
    (the "billion laughs" document), and none of our files needs them."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            line = self.peek_event().start_mark.line + 1  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None, None, f"line {line}: aliases (*name) are not accepted")
        return super().compose_node(parent, index)


class _NoAliasDumper(yaml.SafeDumper):
    """``SafeDumper`` that writes a shared object out again instead of as an alias, so that
    what we write, ``load_yaml`` reads."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(data: Any) -> str:
    """``data`` as YAML, keys in their given order, without aliases."""
    return yaml.dump(data, Dumper=_NoAliasDumper, sort_keys=False, allow_unicode=True)


def load_yaml(text: str) -> Any:
    """Parse YAML of at most ``MAX_YAML_CHARS`` characters without aliases.

    Raises:
        yaml.YAMLError: not YAML, too long, or with an alias.
    """
    if len(text) > MAX_YAML_CHARS:
        raise yaml.YAMLError(f"{len(text):,} characters; at most {MAX_YAML_CHARS:,} are read")
    return yaml.load(text, Loader=_NoAliasLoader)  # a SafeLoader: no arbitrary objects


def read_yaml(path: Path) -> Any:
    """``load_yaml`` of a file, its size checked before it is read.

    Raises:
        OSError: unreadable; yaml.YAMLError: as ``load_yaml``.
    """
    size = path.stat().st_size
    if size > 4 * MAX_YAML_CHARS:  # UTF-8: at most 4 bytes a character
        raise yaml.YAMLError(f"{size:,} bytes; at most {MAX_YAML_CHARS:,} characters are read")
    return load_yaml(path.read_text())


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write ``path`` through a temporary file and a rename."""
    data = text.encode() if isinstance(text, str) else text
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".",
                               prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes it 0600: give it the user's mode
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask: read from ``/proc`` where there is one, since reading it through
    ``os.umask`` sets it to 0 for a moment, racing files other threads create."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """``rows`` as CSV: the columns of every row, in the order they first appear; a row
    without a column leaves it empty (e.g. a corpus measured on fewer seeds than another)."""
    buffer = io.StringIO()
    columns = list(dict.fromkeys(key for row in rows for key in row))
    writer = csv.DictWriter(buffer, fieldnames=columns, restval="")
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(path, buffer.getvalue())


def write_yaml(path: Path, data: Any) -> Path:
    """``data`` as YAML, keys in their given order."""
    write_atomic(path, dump_yaml(data))
    return path
