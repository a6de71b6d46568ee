"""A model one decoder layer at a time: a ``LayerSource`` gives the residual stream before the
first block and each block in turn. ``WholeModel`` serves a model already in memory;
``StreamedFolder`` a Llama-family folder, built on the meta device (no memory) with one block at
a time read from the safetensors and freed after use, so that what a
layer-by-layer pass holds is one layer (and the embedding, while the inputs are made) plus the
sample's activations, never the model (GPTQ's layer-by-layer calibration, Frantar et al., 2023).

A block is held in the dtype its file stores (bfloat16 or float16: half of float32's bytes) and
computes in float32, each of its layers cast up for its own forward only and back after it
(``computed_in_float32``; diffusers' layerwise casting): both casts are exact, so a streamed
pass computes what the whole float32 model computes, holding the stored bytes and one layer's
float32 copy at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from arch import ArchConfig, param_count
from workers.checkpoints.folder import refuse_beyond_memory
from workers.checkpoints.gguf import model_config, open_tensors
from workers.checkpoints.llama import (
    block_pairs,
    fill_llama,
    llama_arch,
    stock_pairs,
    stock_row_split,
)
from workers.models.model import Block, Model, build_model


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

    def output(self) -> AbstractContextManager[Callable[[Tensor], Tensor]]:
        """The model's output from the residual stream after the last block, ``(B, T, d) ->
        (B, T, vocab)`` (the final norm and the head), in memory while the context lasts."""
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

    @contextmanager
    def output(self) -> Iterator[Callable[[Tensor], Tensor]]:
        yield lambda h: self.model.head(self.model.norm(h))


class StreamedFolder:
    """A Llama-family folder as a ``LayerSource`` that holds one block at a time, in the
    dtype its file stores (use as a context manager: the safetensors stay open while it
    lasts)."""

    def __init__(self, folder: Path, source: str) -> None:
        self.config = model_config(folder, source)
        self._arch = llama_arch(self.config)
        check_fits_streamed(self._arch, source)
        with torch.device("meta"):
            self.model = build_model(self._arch)
        self.tensors = open_tensors(folder, source)

    @property
    def arch(self) -> ArchConfig:
        return self._arch

    def __enter__(self) -> StreamedFolder:
        """Open the shards and check every tensor before any work: its shape against what
        config.json makes and its values finite, one tensor at a time as stored (a lie in the
        last layer is refused before the first is measured)."""
        give_back_freed_memory()
        self.tensors.__enter__()
        try:
            shapes = {k: tuple(v.shape) for k, v in self.model.state_dict().items()}
            arch = self._arch
            for ours, theirs in stock_pairs(arch):
                rows = stock_row_split(arch, ours, len(theirs)) or [shapes[ours][0]]
                for name, n in zip(theirs, rows):
                    self.tensors.get(name, (n, *shapes[ours][1:]), dtype=None)
            self._hold_as_stored()
        except BaseException:
            self.tensors.__exit__(None, None, None)
            raise
        return self

    def _hold_as_stored(self) -> None:
        """Give each layer (a leaf module: a linear map, a norm, the embedding) whose stock
        tensors are all stored in one 16-bit float type that type, on the meta device: its
        block is then read without conversion and held at the file's size."""
        modules = dict(self.model.named_modules())
        stored: dict[str, set[str]] = {}
        for ours, theirs in stock_pairs(self._arch):
            leaf = ours.rsplit(".", 1)[0]
            stored.setdefault(leaf, set()).update(self.tensors.dtype(name) for name in theirs)
        for leaf, dtypes in stored.items():
            dtype, *others = dtypes
            if not others and dtype in HALF_DTYPES and not list(modules[leaf].children()):
                modules[leaf].to(HALF_DTYPES[dtype])

    def __exit__(self, *exc: Any) -> None:
        self.tensors.__exit__(*exc)

    @torch.no_grad()
    def inputs(self, x: Tensor) -> Tensor:
        embed = self.model.embed
        embed.to_empty(device="cpu")
        try:
            fill_llama(self.model, self.tensors, self.config,
                       [("embed.weight", ["model.embed_tokens.weight"])], ())
            return self.model.inputs(x).float()  # rows gathered as stored: the cast is exact
        finally:
            embed.to("meta")

    @contextmanager
    def output(self) -> Iterator[Callable[[Tensor], Tensor]]:
        """The final norm and the head (the embedding, when they are tied), in float32 while
        the context lasts."""
        model, arch = self.model, self._arch
        head = model.embed if arch.tie_embeddings else model.head
        pairs = [("norm.weight", ["model.norm.weight"]),
                 ("embed.weight", ["model.embed_tokens.weight"]) if arch.tie_embeddings
                 else ("head.weight", ["lm_head.weight"])]
        for module in (model.norm, head):
            module.to_empty(device="cpu")
        try:
            fill_llama(model, self.tensors, self.config, pairs, ())
            weight = dict(head.named_parameters())["weight"].detach().float()
            with computed_in_float32(model.norm):
                yield lambda h: F.linear(model.norm(h), weight)
        finally:
            for module in (model.norm, head):
                module.to("meta")

    @contextmanager
    def block(self, i: int) -> Iterator[Block]:
        """Block ``i`` as stored, computing in float32 (``computed_in_float32``)."""
        block = self.model.block(i)
        block.to_empty(device="cpu")
        try:
            fill_llama(self.model, self.tensors, self.config, block_pairs(self._arch, i), (i,))
            with computed_in_float32(block):
                yield block
        finally:
            block.to("meta")  # its memory is released; the next block reads its own


HALF_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16}

MMAP_BYTES = 1 << 20  # glibc: blocks from this size on are mapped alone and unmapped when freed


def give_back_freed_memory() -> None:
    """Where the C library is glibc, have every block of ``MMAP_BYTES`` or more mapped on its
    own, so that freeing it gives it back to the system (glibc's default threshold rises to
    32 MB after the first large free, and a layer-by-layer pass's tensors, a few to a few
    tens of MB each, then fragment the heap: on SmolLM2-135M the resident set grew by
    320 MB from 8 to 16 windows of the same chunk). Once per process; a no-op elsewhere."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None or "libc.so" not in name:
        return
    try:
        libc = ctypes.CDLL(name)
        if hasattr(libc, "gnu_get_libc_version"):
            libc.mallopt(-3, MMAP_BYTES)  # M_MMAP_THRESHOLD (fixed: no dynamic rise)
            libc.mallopt(-1, MMAP_BYTES)  # M_TRIM_THRESHOLD: the heap's free top given back
    except OSError:
        return


@contextmanager
def computed_in_float32(module: nn.Module) -> Iterator[None]:
    """While it lasts, each leaf of ``module`` held in another float type runs its forward in
    float32 (every 16-bit float is a float32: nothing is rounded), holding between forwards
    its stored bytes only: a linear map multiplies a few of its rows at a time, each cast as
    it is used (a fused SwiGLU map of an 8 B model is 470 MB as float32); other leaves (norms)
    are cast up for their forward and back after it."""
    patched = []
    for leaf in module.modules():
        own = list(leaf.parameters(recurse=False))
        if any(True for _ in leaf.children()) or all(p.dtype == torch.float32 for p in own):
            continue
        # an instance's forward shadows its class's while the context lasts (as accelerate's
        # hooks do); deleting it restores the class's
        leaf.forward = _rows_in_float32(leaf) if isinstance(leaf, nn.Linear) else _cast_around(
            leaf)
        patched.append(leaf)
    try:
        yield
    finally:
        for leaf in patched:
            del leaf.forward


CAST_BYTES = 64 << 20  # a linear map's rows cast to float32 at once, at most


def _rows_in_float32(linear: nn.Linear) -> Callable[[Tensor], Tensor]:
    def forward(x: Tensor) -> Tensor:
        weight, bias = linear.weight, linear.bias
        step = max(1, CAST_BYTES // (4 * weight.shape[1]))
        out = x.new_empty(*x.shape[:-1], weight.shape[0])
        for a in range(0, weight.shape[0], step):
            rows = slice(a, a + step)
            out[..., rows] = F.linear(x, weight[rows].float(),
                                      None if bias is None else bias[rows].float())
        return out
    return forward


def _cast_around(leaf: nn.Module) -> Callable[..., Any]:
    def forward(*args: Any, **kwargs: Any) -> Any:
        stored = next(leaf.parameters()).dtype
        leaf.to(torch.float32)
        try:
            return type(leaf).forward(leaf, *args, **kwargs)
        finally:
            leaf.to(stored)
    return forward


def streamed_bytes(arch: ArchConfig) -> int:
    """What a layer-by-layer pass holds of the model's weights at once, as float32: the largest
    of one block and the embedding."""
    blocks = param_count(arch).total - (arch.vocab_size or 0) * arch.d_model * (
        1 if arch.tie_embeddings else 2)
    return 4 * max(blocks // arch.n_layers + 1, (arch.vocab_size or 0) * arch.d_model)


def check_fits_streamed(arch: ArchConfig, source: str) -> None:
    """Refuse a model even one layer of which does not fit this machine's memory."""
    refuse_beyond_memory(streamed_bytes(arch), "layers of", source, ", even one at a time")

