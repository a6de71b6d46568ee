"""What ``bench.gpu`` runs: the sizes (the GPU one and the CPU smoke one), each part's time
limit, and the record a part fills as it goes (so that what it measured before its limit ran
out is kept)."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bench.throughput import Shape


@dataclass(frozen=True)
class TeacherSize:
    """The random grouped-query Llama whose students are built, compared and timed."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    positions: int
    sample_tokens: int  # workers.profile --sample-tokens
    seq_len: int  # workers.profile --seq-len
    align: int  # workers.profile --align


@dataclass(frozen=True)
class Sizes:
    """Every size of one run."""

    shape: Shape  # the throughput shape, also the training one
    rounds: int  # interleaved rounds of the throughput part
    steps: int  # training steps per round
    teacher: TeacherSize
    parity_tokens: int  # sequence length of the logits compared
    context: int  # decode: prompt length
    batch: int  # decode: sequences
    new_tokens: int  # decode: tokens generated
    train_steps: int  # training part: steps per architecture
    train_batch: int
    check_steps: int  # checks: training steps compared


# GPT-2 small (12 layers, d_model 768, 12 heads of 64, sequence 1024) in bf16 autocast
FULL = Sizes(
    shape=Shape(d_model=768, heads=12, layers=12, seq_len=1024, batch=8, mlp_ratio=4.0),
    rounds=5, steps=5,
    teacher=TeacherSize(hidden=512, layers=8, heads=8, kv_heads=2, intermediate=1408,
                        vocab=32000, positions=8448, sample_tokens=4096, seq_len=512, align=16),
    parity_tokens=1024, context=8192, batch=8, new_tokens=64, train_steps=300, train_batch=8,
    check_steps=4)
SMOKE = Sizes(
    shape=Shape(d_model=64, heads=4, layers=2, seq_len=32, batch=2, mlp_ratio=4.0),
    rounds=1, steps=1,
    teacher=TeacherSize(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=128,
                        positions=256, sample_tokens=1024, seq_len=64, align=4),
    parity_tokens=48, context=64, batch=2, new_tokens=4, train_steps=6, train_batch=2,
    check_steps=2)

# Seconds of each part at the default 8 minutes (scaled with --minutes), in the order run;
# the students are built on the CPU beside the first parts and waited for by parity.
PART_SECONDS = {"suite": 25.0, "checks": 40.0, "throughput": 40.0, "compiled": 150.0,
           "parity": 40.0, "decode": 60.0, "training": 60.0}
DEFAULT_MINUTES = 8.0
# What each part imports beyond torch, numpy, scipy and yaml (checked before any work).
MODULES = {"suite": ("pytest",), "parity": ("transformers", "safetensors"),
           "decode": ("transformers", "safetensors")}
BASE_MODULES = ("torch", "numpy", "scipy", "yaml")


class TimeUp(Exception):
    """A part's time limit ran out (raised at a check, or by the hard stop)."""


@dataclass
class TimeLimit:
    """A part's seconds, counted from its start."""

    seconds: float
    start: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def check(self, what: str) -> None:
        """Raise ``TimeUp`` naming ``what`` was not started when none is left."""
        if self.left() <= 0:
            raise TimeUp(f"limit of {self.seconds:.0f} s spent before {what}")


@contextlib.contextmanager
def hard_stop(seconds: float) -> Iterator[None]:
    """Raise ``TimeUp`` in the main thread ``seconds`` from now, wherever it is (a compile
    that runs far past its limit); a no-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise TimeUp(f"stopped {seconds:.0f} s in: the part ran past its limit")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class PartResult:
    """What a part measured: rows of one table, lines to read beside it, and how it ended
    (``ok``, ``time_up``: stopped by its time limit with what it had, ``failed``, ``skipped``)."""

    name: str
    status: str = "ok"
    seconds: float = 0.0
    limit_s: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def note(self, line: str) -> None:
        self.notes.append(line)


class Students(Protocol):
    """Folders made beside the parts (``bench.gpu.students.StudentsJob``): ``wait`` returns
    them once made, or raises ``TimeUp`` when ``limit`` ends first."""

    def wait(self, limit: TimeLimit) -> dict[str, Path]: ...

    def stop(self) -> None: ...


@dataclass
class Context:
    """What every part reads: the device, the sizes, the working folder, the report folder,
    the compile backend and the accelerator's peak (None: unknown, no MFU); and what parts
    hand on."""

    device: str
    sizes: Sizes
    work: Path
    out: Path
    backend: str
    peak_flops: float | None
    smoke: bool
    arch_file: Path | None = None  # the training part's --arch
    students: Students | None = None  # made beside the parts; parity and decode wait
    matmul_tflops: float | None = None  # measured by the throughput part
