"""Language modelling on text: byte-level tokens of Python's own documentation."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from workers.tasks.base import Batch, Task


@functools.cache
def corpus() -> Tensor:
    """Python's own documentation topics (stdlib ``pydoc_data``), ~0.47 MB of English, as bytes."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).long()


@dataclass(frozen=True)
class LMTask(Task):
    """Byte-level language modelling on the stdlib's documentation topics: first 90% train,
    last 10% validation. Metric: validation cross-entropy (nats per byte)."""

    name: ClassVar[str] = "lm"
    inputs: ClassVar[str] = "tokens"
    metric: ClassVar[str] = "loss"
    higher_is_better: ClassVar[bool] = False
    sizes: ClassVar[dict[str, dict[str, Any]]] = {"smoke": {"length": 32},
                                                  "paper": {"length": 256}}
    length: int = 32

    @property
    def seq_len(self) -> int:
        return self.length

    @property
    def vocab_size(self) -> int:
        return 256

    def text(self, split: str) -> Tensor:
        data = corpus()
        cut = int(0.9 * len(data))
        return data[:cut] if split == "train" else data[cut:]

    def make(self, g: torch.Generator, size: int, split: str) -> Batch:
        data = self.text(split)
        start = torch.randint(0, len(data) - self.length - 1, (size, 1), generator=g)
        windows = data[start + torch.arange(self.length + 1)]
        return Batch(windows[:, :-1], windows[:, 1:],
                     torch.ones(size, self.length, dtype=torch.bool))

    def score(self, out: Tensor, b: Batch) -> tuple[float, int]:
        loss = F.cross_entropy(out[b.mask].float(), b.y[b.mask], reduction="sum")
        return float(loss), int(b.mask.sum())
