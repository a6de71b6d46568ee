"""Tasks on the user's own data (``userdata``): language modelling on a text corpus
(``text``) or on nanoGPT-style token files (``bin``), and regression on numpy arrays of vector
sequences (``npy``).

They are ordinary registry tasks, so the trainer and the search (checkpoints, ASHA, progress,
tokens/s) work on them unchanged. Batches are random windows of ``length + 1`` tokens (or random
sequences), drawn from the batch's own RNG like every task, read from memory-mapped files:
nothing loads a whole file. ``make_data_task`` opens and checks the data once, where the search
or the trainer starts; workers re-open it lazily from the task's fields.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from common.errors import Problem
from userdata import ArrayData, DataError, DataFormat, DataSpec, TokenData, open_arrays, open_tokens
from workers.tasks.base import Batch, Task

SIZES: dict[str, dict[str, Any]] = {"smoke": {"length": 32}, "paper": {"length": 256}}


@dataclass(frozen=True)
class TextTask(Task):
    """Next-token prediction on a UTF-8 corpus, byte-level. Metric: validation cross-entropy
    (nats per token)."""

    name: ClassVar[str] = "text"
    inputs: ClassVar[str] = "tokens"
    metric: ClassVar[str] = "loss"
    higher_is_better: ClassVar[bool] = False
    sizes: ClassVar[dict[str, dict[str, Any]]] = SIZES
    path: str = ""
    length: int = 32
    dtype: str = "uint16"
    vocab: int | None = None  # set by make_data_task, so workers need not scan the data

    @property
    def seq_len(self) -> int:
        return self.length

    @property
    def vocab_size(self) -> int:
        return self.vocab or self.data.vocab_size

    def data_spec(self) -> DataSpec:
        return DataSpec(self.path, self.format, self.dtype, self.vocab)

    @functools.cached_property
    def data(self) -> TokenData:
        return open_tokens(self.data_spec(), self.length + 1, scan=self.vocab is None)

    @property
    def format(self) -> DataFormat:
        return "text"

    def make(self, g: torch.Generator, size: int, split: str) -> Batch:
        tokens = self.data.train if split == "train" else self.data.val
        start = torch.randint(0, len(tokens) - self.length, (size, 1), generator=g).numpy()
        # (B, T + 1) windows gathered from the memory map; int64 for the embedding.
        windows = torch.from_numpy(tokens[start + np.arange(self.length + 1)].astype(np.int64))
        return Batch(windows[:, :-1], windows[:, 1:],
                     torch.ones(size, self.length, dtype=torch.bool))

    def score(self, out: Tensor, b: Batch) -> tuple[float, int]:
        loss = F.cross_entropy(out[b.mask].float(), b.y[b.mask], reduction="sum")
        return float(loss), int(b.mask.sum())


@dataclass(frozen=True)
class BinTask(TextTask):
    """Next-token prediction on ``train.bin`` / ``val.bin`` (nanoGPT's layout)."""

    name: ClassVar[str] = "bin"

    @property
    def format(self) -> DataFormat:
        return "bin"


@dataclass(frozen=True)
class ArrayTask(Task):
    """Regression of ``y`` (or the next step of ``x``) on vector sequences. Metric: MSE."""

    name: ClassVar[str] = "npy"
    inputs: ClassVar[str] = "vectors"
    metric: ClassVar[str] = "mse"
    higher_is_better: ClassVar[bool] = False
    sizes: ClassVar[dict[str, dict[str, Any]]] = {"smoke": {}, "paper": {}}
    path: str = ""
    length: int | None = None  # None: the arrays' own length

    def data_spec(self) -> DataSpec:
        return DataSpec(self.path, "npy")

    @functools.cached_property
    def data(self) -> ArrayData:
        return open_arrays(self.data_spec())

    @property
    def seq_len(self) -> int:
        return self.length or self.data.length

    @property
    def input_dim(self) -> int:
        return self.data.input_dim

    @property
    def output_dim(self) -> int:
        return self.data.output_dim

    def make(self, g: torch.Generator, size: int, split: str) -> Batch:
        x, y = ((self.data.x_train, self.data.y_train) if split == "train"
                else (self.data.x_val, self.data.y_val))
        rows = torch.randint(0, len(x), (size,), generator=g).numpy()
        t = self.seq_len
        return Batch(torch.from_numpy(np.asarray(x[rows, :t], dtype=np.float32)),
                     torch.from_numpy(np.asarray(y[rows, :t], dtype=np.float32)),
                     torch.ones(size, t, dtype=torch.bool))


# The tasks on the user's data (``--data``), one per format, made by ``make_data_task``.
DATA_TASKS = (TextTask.name, BinTask.name, ArrayTask.name)


def make_data_task(spec: DataSpec, size: str = "paper", seed: int = 0,
                   length: int | None = None) -> Task:
    """The task of ``spec``, its data opened and checked now (``DataError`` if unusable).

    Args:
        spec: where the data is and how to read it.
        size: ``smoke`` or ``paper`` (the window length of token data, 32 or 256).
        seed: the batches' seed.
        length: window (token data) or sequence (arrays) length instead of the size's.
    """
    spec = spec.resolved()
    if spec.format == "npy":
        task: Task = ArrayTask(seed=seed, path=spec.path, length=length)
        data = task.data  # type: ignore[attr-defined]
        if length is not None and length > data.length:
            raise DataError.of([Problem("task.params", f"length={length}", f"the sequences of "
                                        f"{spec.path!r} have {data.length} steps")])
        return task
    window = length or SIZES[size]["length"]
    data = open_tokens(spec, window + 1)  # every check, and the vocabulary, once, here
    cls = BinTask if spec.format == "bin" else TextTask
    return cls(seed=seed, path=spec.path, length=window, dtype=spec.dtype,
               vocab=data.vocab_size)
