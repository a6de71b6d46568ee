"""What every task shares: the batch, the reproducible per-batch RNG, the split of discrete
examples between train and validation, and the ``Task`` base class.

Every batch is a pure function of ``(seed, split, index)``, so a run is reproducible and a resumed
run continues the same data stream without saved RNG state. Train and validation never overlap:
continuous tasks draw from separate streams; discrete tasks either split a fixed example set or
keep an example in exactly one split by a hash of its tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from arch import ModelIO

SPLITS = {"train": 0, "val": 1}
VAL_BUCKETS = 10  # a hashed discrete example is in val iff hash % VAL_BUCKETS == 0


@dataclass(frozen=True)
class Batch:
    """``x``: (B, T) ids or (B, T, in); ``y``: (B, T) ids or (B, T, out); ``mask``: (B, T) bool
    positions that count; ``aux``: per-token side information (e.g. cluster labels)."""

    x: Tensor
    y: Tensor
    mask: Tensor
    aux: Tensor | None = None

    def to(self, device: str | torch.device) -> Batch:
        aux = None if self.aux is None else self.aux.to(device)
        return Batch(self.x.to(device), self.y.to(device), self.mask.to(device), aux)

    def split(self, windows: int) -> list[Batch]:
        """The batch in parts of at most ``windows`` windows (rows), in order."""
        parts = [t.split(windows) for t in (self.x, self.y, self.mask)]
        auxes = [None] * len(parts[0]) if self.aux is None else self.aux.split(windows)
        return [Batch(x, y, m, a) for x, y, m, a in zip(*parts, auxes)]


def generator(seed: int, split: str, index: int) -> torch.Generator:
    """The RNG of batch ``index`` of ``split``: distinct, reproducible streams."""
    return torch.Generator().manual_seed(((seed * 1_000_003 + SPLITS[split]) * 1_000_033
                                          + index) % (2**63 - 1))


def row_hash(x: Tensor) -> Tensor:
    """Stable hash of each row of an integer tensor (B, T) -> (B,)."""
    h = torch.zeros(x.shape[0], dtype=torch.int64)
    for column in x.long().unbind(1):
        h = (h * 131 + column + 1) % 2_147_483_647
    return h


def in_split(x: Tensor, split: str) -> Tensor:
    """(B,) bool: which example rows belong to ``split`` (by hash bucket)."""
    val = row_hash(x) % VAL_BUCKETS == 0
    return val if split == "val" else ~val


@dataclass(frozen=True)
class Task:
    """Base: subclasses set the class variables and implement ``make``."""

    name: ClassVar[str]
    inputs: ClassVar[str]  # "tokens" or "vectors"
    metric: ClassVar[str]
    higher_is_better: ClassVar[bool]
    sizes: ClassVar[dict[str, dict[str, Any]]]
    seed: int = 0

    @property
    def seq_len(self) -> int:
        raise NotImplementedError

    @property
    def vocab_size(self) -> int | None:
        return None

    @property
    def input_dim(self) -> int | None:
        return None

    @property
    def output_dim(self) -> int | None:
        return self.input_dim

    @property
    def io(self) -> ModelIO:
        """The sequence length and input/output maps this task gives a model."""
        if self.inputs == "tokens":
            return ModelIO(self.seq_len, vocab_size=self.vocab_size)
        return ModelIO(self.seq_len, input_dim=self.input_dim, output_dim=self.output_dim)

    def make(self, g: torch.Generator, size: int, split: str) -> Batch:
        raise NotImplementedError

    def batch(self, split: str, index: int, size: int) -> Batch:
        return self.make(generator(self.seed, split, index), size, split)

    def loss(self, out: Tensor, b: Batch) -> Tensor:
        """Cross-entropy on masked positions (tokens) or their mean squared error (vectors)."""
        if self.inputs == "tokens":
            return F.cross_entropy(out[b.mask].float(), b.y[b.mask])
        return (out[b.mask].float() - b.y[b.mask]).pow(2).mean()

    @property
    def output_size(self) -> int:
        """Numbers the model outputs per position: the vocabulary or the output dim."""
        return (self.vocab_size if self.inputs == "tokens" else self.output_dim) or 1

    def score(self, out: Tensor, b: Batch) -> tuple[float, int]:
        """(sum, count) of the metric over the batch, to average across batches (additive
        over the batch's windows)."""
        if self.inputs == "tokens":
            right = (out.argmax(-1) == b.y) & b.mask
            return float(right.sum()), int(b.mask.sum())
        err = (out.float() - b.y).pow(2).mean(-1)[b.mask]
        return float(err.sum()), int(err.numel())

    def extra(self, metric: float, trainable_params: int) -> dict[str, float]:
        """Task-specific numbers derived at the end (e.g. bits per parameter)."""
        return {}


def take_split(make_rows: Any, g: torch.Generator, size: int, split: str) -> Tensor:
    """Rows from ``make_rows(g, n)`` that hash into ``split``, until ``size`` are found."""
    found: list[Tensor] = []
    have = 0
    while have < size:
        rows = make_rows(g, 2 * size + 8)
        keep = rows[in_split(rows, split)]
        found.append(keep)
        have += len(keep)
    return torch.cat(found)[:size]


def last_position(seq: Tensor, answer: Tensor) -> Batch:
    """Predict ``answer`` (B,) at the last position of ``seq`` (B, T)."""
    y = torch.zeros_like(seq)
    y[:, -1] = answer
    mask = torch.zeros_like(seq, dtype=torch.bool)
    mask[:, -1] = True
    return Batch(seq, y, mask)
