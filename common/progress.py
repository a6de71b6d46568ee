"""Progress of the long commands, on stderr: what runs, how far it is and how long it has left.

On a terminal a ``tqdm`` bar; when stderr is not a terminal (a log file, a pipe, CI) one plain
line per event the caller marks (the start, an evaluation, a layer done, a trial finished, the
end) and never a bar's redraws, so logs stay readable; nothing with ``quiet``. Results go to
stdout and errors are printed by each command's ``main()``: neither goes through here.

    with Progress("pilot", total=300, unit="steps", quiet=args.quiet,
                  start="training the baseline") as bar:
        for step in range(1, 301):
            ...
            bar.update(1, loss=f"{loss:.3g}")
            if step % 30 == 0:
                bar.event()  # one line when stderr is not a terminal; the bar otherwise
"""

from __future__ import annotations

import io
import math
import os
import shutil
import sys
import time
from types import TracebackType
from typing import IO, Any


def duration(seconds: float) -> str:
    """``seconds`` for a person: ``8.2 s``, ``45 s``, ``3 min 20 s``, ``2 h 05 min``,
    ``3 d 4 h``."""
    if not math.isfinite(seconds):
        return "?"
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def is_terminal(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _bar_size(stream: IO[str]) -> dict[str, Any]:
    """tqdm's size arguments: follow the terminal's width, or a fixed size where it reports
    none (some pseudo-terminals say 0 x 0, and tqdm would hide the bar)."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        size = os.terminal_size((0, 0))
    if size.columns > 0 and size.lines > 0:
        return {"dynamic_ncols": True}
    columns, rows = shutil.get_terminal_size()
    return {"ncols": columns, "nrows": rows}


def say(text: str, *, quiet: bool = False, stream: IO[str] | None = None) -> None:
    """One line of progress on stderr (a phase starting, an estimate), unless ``quiet``."""
    if quiet:
        return
    out = stream if stream is not None else sys.stderr
    bars = sys.modules.get("tqdm")
    if bars is not None and is_terminal(out):  # above any bar being drawn, not through it
        bars.tqdm.write(text, file=out)
    else:
        print(text, file=out, flush=True)


class Progress:
    """The progress of one long operation, counted in ``unit`` up to ``total`` (None: unknown).

    ``update`` advances and sets the fields shown after the count (``loss="4.2"``); ``event``
    marks a milestone: one line when stderr is not a terminal, a refreshed bar on one. The end
    (``close``, or leaving the ``with`` block) is one line; leaving it by an exception prints
    nothing more (and clears the bar), so the error that follows stands alone.

    Args:
        desc: what runs, the first word of every line (``pilot``, ``search``).
        start: the first line (``training the baseline at D = 256``); none when empty.
        initial: units already done (a resumed run): the time left counts from here.
        quiet: print nothing.
        stream: where to write (default: ``sys.stderr`` when the progress is made).
    """

    def __init__(self, desc: str, total: int | None = None, unit: str = "it", *,
                 start: str = "", initial: int = 0, quiet: bool = False,
                 stream: IO[str] | None = None) -> None:
        self.desc, self.total, self.unit, self.quiet = desc, total, unit, quiet
        self.stream = stream if stream is not None else sys.stderr
        self.n = self.initial = initial
        self.fields: dict[str, Any] = {}
        self.started = time.monotonic()
        self.closed = False
        self.tty = not quiet and is_terminal(self.stream)
        self._bar: Any = None
        if self.tty:
            from tqdm import tqdm  # only where a bar is drawn (say() then writes above bars)
        if start:
            self.write(f"{desc}: {start}")
        if self.tty:
            self._bar = tqdm(total=total, initial=initial, desc=desc, unit=f" {unit}",
                             file=self.stream, mininterval=0.5, smoothing=0.1,
                             **_bar_size(self.stream))

    # --- what the caller reports -------------------------------------------------------------

    def update(self, n: int = 1, **fields: Any) -> None:
        """``n`` more units done; ``fields`` replace the shown values of the same names."""
        self.n += n
        self.fields.update(fields)
        if self._bar is not None:
            if fields:
                self._bar.set_postfix_str(self._postfix(), refresh=False)
            self._bar.update(n)

    def event(self, text: str = "", *, eta: float | None = None, **fields: Any) -> None:
        """A milestone: one line (the count, ``text``, the fields, the time spent and left)
        when not on a terminal; on one, the bar shows ``text`` and the fields. ``eta``: the
        caller's own estimate of the seconds left (default: from the rate so far)."""
        self.fields.update(fields)
        if self.quiet:
            return
        if self._bar is not None:  # the caller's estimate first: a long postfix is cut
            left = "" if eta is None or eta <= 0 else f"~{duration(eta)} left"
            self._bar.set_postfix_str(", ".join(p for p in (left, text, self._postfix()) if p))
            return
        parts = [self._count(), text, self._postfix(),
                 f"{duration(self.elapsed)} elapsed" + self._left(eta)]
        self.write(f"{self.desc}: " + "; ".join(p for p in parts if p))

    def refresh(self) -> None:
        """Redraw the bar (its elapsed time) on a terminal; nothing otherwise."""
        if self._bar is not None:
            self._bar.refresh()

    def write(self, text: str) -> None:
        """A line of its own (above the bar on a terminal), unless quiet."""
        if self.quiet:
            return
        say(text, stream=self.stream)

    def close(self, text: str = "") -> None:
        """The end: one line (``done``, or ``text``) with the count and the time it took; on a
        terminal the finished bar says it, and the line is printed only with ``text``."""
        if self.closed:
            return
        self.closed = True
        bar, self._bar = self._bar, None
        if bar is not None:
            bar.close()
        if self.quiet or (bar is not None and not text):
            return
        count = (f"{self.n:,} {self.unit}" if self.total is None else
                 f"{self.n:,}/{self.total:,} {self.unit}")
        self.write(f"{self.desc}: {text or 'done'}, {count} in {duration(self.elapsed)}")

    def abandon(self) -> None:
        """Stop without an end line, clearing the bar (an error is about to be reported)."""
        if self.closed:
            return
        self.closed = True
        bar, self._bar = self._bar, None
        if bar is not None:
            bar.leave = False
            bar.close()

    # --- derived -----------------------------------------------------------------------------

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def remaining(self) -> float | None:
        """Seconds left at the rate so far (None before the first unit, or with no total)."""
        done = self.n - self.initial
        if self.total is None or done <= 0:
            return None
        return self.elapsed / done * max(0, self.total - self.n)

    def _count(self) -> str:
        if self.total is None:
            return f"{self.n:,} {self.unit}"
        share = f" ({self.n / self.total:.0%})" if self.total else ""
        return f"{self.n:,}/{self.total:,} {self.unit}{share}"

    def _left(self, eta: float | None) -> str:
        left = eta if eta is not None else self.remaining()
        return "" if left is None or left <= 0 else f", ~{duration(left)} left"

    def _postfix(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.fields.items() if v is not None)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if kind is None:
            self.close()
        else:
            self.abandon()
