"""A model one decoder layer at a time: a ``LayerSource`` gives the residual stream before the
first block and each block in turn. ``WholeModel`` serves a model already in memory;
``StreamedFolder`` a Llama-family folder, built on the meta device (no memory) with one block at
a time read from the memory-mapped safetensors into float32 and freed after use, so that what a
layer-by-layer pass holds is one layer (and the embedding, while the inputs are made) plus the
sample's activations, never the model (GPTQ's layer-by-layer calibration, Frantar et al., 2023).
The files keep their own dtype; only the layer in use is float32.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from arch import ArchConfig, param_count
from workers.checkpoints.folder import TensorFolder, read_config, refuse_beyond_memory
from workers.checkpoints.llama import (
    block_pairs,
    fill_llama,
    llama_arch,
    stock_pairs,
    stock_row_split,
)
from workers.model import Block, Model, build_model


class LayerSource(Protocol):
    """A model's inputs and blocks, one block at a time."""

    @property
    def arch(self) -> ArchConfig: ...

    def inputs(self, x: Tensor) -> Tensor:
        """The residual stream before the first block, ``(B, T, d)``, of ids ``x``."""
        ...

    def block(self, i: int) -> AbstractContextManager[Block]:
        """Block ``i``, in memory while the context lasts."""
        ...


class WholeModel:
    """A model in memory as a ``LayerSource``."""

    def __init__(self, model: Model) -> None:
        self.model = model

    @property
    def arch(self) -> ArchConfig:
        return self.model.arch

    def inputs(self, x: Tensor) -> Tensor:
        return self.model.inputs(x)

    @contextmanager
    def block(self, i: int) -> Iterator[Block]:
        yield self.model.block(i)


class StreamedFolder:
    """A Llama-family folder as a ``LayerSource`` that holds one block at a time (use as a
    context manager: the safetensors stay open, memory-mapped, while it lasts)."""

    def __init__(self, folder: Path, source: str) -> None:
        self.config = read_config(folder, source)
        self._arch = llama_arch(self.config)
        check_fits_streamed(self._arch, source)
        with torch.device("meta"):
            self.model = build_model(self._arch)
        self.tensors = TensorFolder(folder, source)

    @property
    def arch(self) -> ArchConfig:
        return self._arch

    def __enter__(self) -> StreamedFolder:
        """Open the shards and check every tensor before any work: its shape against what
        config.json makes and its values finite, one tensor at a time as stored (a lie in the
        last layer is refused before the first is measured)."""
        self.tensors.__enter__()
        try:
            shapes = {k: tuple(v.shape) for k, v in self.model.state_dict().items()}
            arch = self._arch
            for ours, theirs in stock_pairs(arch):
                rows = stock_row_split(arch, ours, len(theirs)) or [shapes[ours][0]]
                for name, n in zip(theirs, rows):
                    self.tensors.get(name, (n, *shapes[ours][1:]), dtype=None)
        except BaseException:
            self.tensors.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.tensors.__exit__(*exc)

    @torch.no_grad()
    def inputs(self, x: Tensor) -> Tensor:
        embed = self.model.embed
        embed.to_empty(device="cpu")
        try:
            fill_llama(self.model, self.tensors, self.config,
                       [("embed.weight", ["model.embed_tokens.weight"])], ())
            return self.model.inputs(x)
        finally:
            embed.to("meta")

    @contextmanager
    def block(self, i: int) -> Iterator[Block]:
        block = self.model.block(i)
        block.to_empty(device="cpu")
        try:
            fill_llama(self.model, self.tensors, self.config, block_pairs(self._arch, i), (i,))
            yield block
        finally:
            block.to("meta")  # its memory is released; the next block reads its own


def streamed_bytes(arch: ArchConfig) -> int:
    """What a layer-by-layer pass holds of the model's weights at once, as float32: the largest
    of one block and the embedding."""
    blocks = param_count(arch).total - (arch.vocab_size or 0) * arch.d_model * (
        1 if arch.tie_embeddings else 2)
    return 4 * max(blocks // arch.n_layers + 1, (arch.vocab_size or 0) * arch.d_model)


def check_fits_streamed(arch: ArchConfig, source: str) -> None:
    """Refuse a model even one layer of which does not fit this machine's memory."""
    refuse_beyond_memory(streamed_bytes(arch), "layers of", source, ", even one at a time")
