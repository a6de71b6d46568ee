"""A `transformers`-saved folder read lazily: ``config.json`` and the weights, one
``model.safetensors`` or shards listed by ``model.safetensors.index.json``.

Tensors are read one at a time (each shard's header checked by ``safetensors``' ``safe_open``,
its bytes read with plain reads into a new tensor, never mapped), so loading a checkpoint
needs the model's memory plus one tensor, never a second copy of the whole file, and a pass
that reads every tensor holds none of the file's pages. Every
name and size read from the folder is checked before it is used: shard names must be plain files
of the folder (a link leaving it is refused, but for a hub cache's snapshots), the model's size
must fit this machine, shapes are compared with what ``config.json`` makes before a tensor is
read, and a tensor holding NaN or infinity is refused by name.

Every error names the checkpoint by its path as its ``source`` (``source_of``): a problem of the
field ``checkpoint``, which a command shows as its flag (``--checkpoint``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from arch import ArchConfig, param_count
from common.errors import Problem
from workers.errors import CheckpointError
from workers.models.model import Model, build_model

SAFETENSORS = "model.safetensors"
INDEX = "model.safetensors.index.json"
MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few KB; a larger one is not a config
MAX_INDEX_BYTES = 64 << 20
MAX_SHARDS = 10_000


def source_of(path: Path) -> str:
    """How the errors of the checkpoint at ``path`` show it (its ``source``): the path, quoted."""
    return repr(str(path))


def checkpoint_error(source: str, rule: str) -> CheckpointError:
    """The error for the checkpoint ``source`` (``source_of``) breaking ``rule``: one problem
    of the field ``checkpoint``."""
    return CheckpointError.of([Problem("checkpoint", source, rule)])


def memory_bytes() -> int:
    """This machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits_memory(arch: ArchConfig, source: str) -> None:
    """Refuse, before anything is allocated, a model whose float32 weights exceed this
    machine's memory: every field of a config.json may be within its bounds while their
    product is absurd (hidden 65,536 x vocabulary 2^24 is a trillion parameters)."""
    params = param_count(arch).total
    refuse_beyond_memory(4 * params, f"a model of {params:,} parameters,", source)


def refuse_beyond_memory(need: int, what: str, source: str, why: str = "") -> None:
    """Refuse ``need`` bytes of float32 weights (``what`` config.json makes) beyond this
    machine's memory, in one line."""
    have = memory_bytes()
    if need > have:
        raise checkpoint_error(source, f"config.json makes {what} {need / 2**30:,.1f} GiB as "
                                       "float32, more than this machine's "
                                       f"{have / 2**30:,.1f} GiB of memory{why}")


def empty_model(arch: ArchConfig, source: str) -> Model:
    """The model of ``arch`` with uninitialised weights and buffers (built on the meta device:
    no random initialisation of what the checkpoint is about to overwrite), once its size is
    checked to fit this machine."""
    check_fits_memory(arch, source)
    with torch.device("meta"):
        model = build_model(arch)
    return model.to_empty(device="cpu")


def is_model_folder(path: Path) -> bool:
    """True for a folder with ``config.json`` and weights (one file or an index of shards)."""
    return (path / "config.json").is_file() and ((path / SAFETENSORS).is_file()
                                                  or (path / INDEX).is_file())


def folder_file(folder: Path, name: str, source: str) -> Path:
    """``folder / name``, refused when it is a link to a file outside the folder: a checkpoint
    is what its folder holds. The one exception is the layout of a model hub's cache, where
    ``<repo>/snapshots/<revision>/`` holds links to the files of ``<repo>/blobs/``."""
    path = folder / name
    root, target = folder.resolve(), path.resolve()
    hub_blobs = root.parent.parent / "blobs" if root.parent.name == "snapshots" else None
    if target.is_relative_to(root) or (hub_blobs is not None and target.is_relative_to(hub_blobs)):
        return path
    raise checkpoint_error(source, f"{name} is a link to {str(target)!r}, outside the folder; "
                                   "a checkpoint's files must be in its folder (or, in a hub "
                                   "cache, link from snapshots/ into the same repository's "
                                   "blobs/)")


def check_finite(name: str, tensor: Tensor, source: str) -> None:
    """Refuse a tensor holding NaN or infinity: every measurement and every student made from
    it would be NaN or silently wrong."""
    if not tensor.is_floating_point() or bool(torch.isfinite(tensor).all()):
        return  # (counted only when some are not: a sum over a bool map widens it)
    bad = int(torch.count_nonzero(~torch.isfinite(tensor)))
    if bad:
        raise checkpoint_error(source, f"tensor {name!r} holds {bad:,} non-finite values (NaN "
                                       f"or infinity) of {tensor.numel():,}; a checkpoint must "
                                       "hold finite weights")


def _read_json(path: Path, limit: int, source: str) -> Any:
    try:
        size = path.stat().st_size
        if size > limit:
            raise checkpoint_error(source, f"{path.name} is {size:,} bytes, more than the "
                                           f"{limit:,} such a file can be")
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise checkpoint_error(source, f"unreadable {path.name} ({type(err).__name__}: "
                                       f"{str(err).splitlines()[0] if str(err) else ''})") from None


def read_config(folder: Path, source: str) -> dict[str, Any]:
    """``config.json`` of ``folder`` as a dict."""
    config = _read_json(folder_file(folder, "config.json", source), MAX_CONFIG_BYTES, source)
    if not isinstance(config, dict):
        raise checkpoint_error(source, "config.json is not an object")
    return config


# safetensors dtypes read with a plain read (``TensorFolder._read``); others through its map
READ_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
               "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
               "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


class TensorFolder:
    """The tensors of a folder's safetensors files, opened lazily (use as a context manager).

    ``shape(name)`` reads a header only; ``get(name)`` reads one tensor from its shard.
    """

    def __init__(self, folder: Path, source: str) -> None:
        self.folder, self.source = folder, source
        self.files = self._weight_map()
        self._stack = ExitStack()
        self._open: dict[str, Any] = {}
        self._headers: dict[str, tuple[dict[str, Any], int]] = {}
        self._files: dict[str, Any] = {}

    def _weight_map(self) -> dict[str, str]:
        """Tensor name -> shard file name."""
        if not (self.folder / INDEX).is_file():
            return {}  # one file: names come from its header when it is opened
        index = _read_json(folder_file(self.folder, INDEX, self.source), MAX_INDEX_BYTES,
                           self.source)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
            raise checkpoint_error(self.source, f"{INDEX} has no weight_map of tensor names "
                                                "to shard files")
        shards = set(weight_map.values())
        if len(shards) > MAX_SHARDS:
            raise checkpoint_error(self.source, f"{INDEX} lists {len(shards):,} shards, more "
                                                f"than {MAX_SHARDS:,}")
        for shard in sorted(shards):
            if Path(shard).name != shard or not shard.endswith(".safetensors"):
                raise checkpoint_error(self.source, f"{INDEX} names shard {shard!r}; a shard "
                                                    "must be a .safetensors file of the folder "
                                                    "itself")
            if not folder_file(self.folder, shard, self.source).is_file():
                raise checkpoint_error(self.source, f"shard {shard!r} listed in {INDEX} is "
                                                    "missing")
        return dict(weight_map)

    def __enter__(self) -> TensorFolder:
        if not self.files:
            handle = self._handle(SAFETENSORS)
            self.files = dict.fromkeys(handle.keys(), SAFETENSORS)
        return self

    def __exit__(self, *_: object) -> None:
        self._stack.close()
        self._open.clear()
        self._headers.clear()
        self._files.clear()

    def _handle(self, shard: str) -> Any:
        from safetensors import safe_open

        if shard not in self._open:
            path = folder_file(self.folder, shard, self.source)
            try:
                self._open[shard] = self._stack.enter_context(
                    safe_open(str(path), framework="pt"))
            except Exception as err:  # safetensors raises its own kinds for a broken header
                first = str(err).splitlines()[0] if str(err) else ""
                raise checkpoint_error(self.source, f"unreadable {shard} "
                                                    f"({type(err).__name__}: {first})") from None
        return self._open[shard]

    def _read(self, shard: str, name: str) -> Tensor | None:
        """Tensor ``name`` read from its shard's bytes with a plain read into a new tensor
        (None for a dtype not in ``READ_DTYPES``): the file is never mapped, so what a
        process holds resident is the tensors it keeps, not the pages of every tensor it has
        read (a streamed pass reads the whole file, 270 MB for a 135 M model in bf16)."""
        header, start = self._header(shard)
        entry = header[name]
        dtype = READ_DTYPES.get(entry["dtype"])
        if dtype is None:
            return None
        first, end = entry["data_offsets"]
        out = torch.empty(entry["shape"], dtype=dtype)
        if out.numel():
            raw = out.view(-1).view(torch.uint8).numpy()
            handle = self._files[shard]
            handle.seek(start + first)
            if handle.readinto(raw) != end - first or raw.nbytes != end - first:
                raise checkpoint_error(self.source, f"tensor {name!r}: {shard} is shorter "
                                                    "than its header says")
        return out

    def _header(self, shard: str) -> tuple[dict[str, Any], int]:
        """A shard's header (read once; ``safe_open`` has checked it) and where its data
        start, its file kept open for reads."""
        if shard not in self._headers:
            self._handle(shard)  # safetensors validates the header first
            handle = self._stack.enter_context(
                folder_file(self.folder, shard, self.source).open("rb"))
            size = int.from_bytes(handle.read(8), "little")
            self._headers[shard] = (json.loads(handle.read(size)), 8 + size)
            self._files[shard] = handle
        return self._headers[shard]

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def names(self) -> Iterator[str]:
        return iter(self.files)

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of tensor ``name`` from its shard's header (nothing read)."""
        if name not in self.files:
            raise checkpoint_error(self.source, f"tensor {name!r} is missing")
        return tuple(self._handle(self.files[name]).get_slice(name).get_shape())

    def dtype(self, name: str) -> str:
        """The dtype tensor ``name`` is stored in, as its shard's header names it ("BF16",
        "F32", ...; nothing read)."""
        self.shape(name)  # a missing name is refused in words
        return str(self._handle(self.files[name]).get_slice(name).get_dtype())

    def get(self, name: str, shape: tuple[int, ...],
            dtype: torch.dtype | None = torch.float32) -> Tensor:
        """Tensor ``name``, checked to have ``shape`` before it is read, as ``dtype`` (None: as
        stored)."""
        found = self.shape(name)
        if found != shape:
            raise checkpoint_error(self.source, f"tensor {name!r} has shape {found}, "
                                                f"config.json makes it {shape}")
        shard = self.files[name]
        tensor = self._read(shard, name)
        if tensor is None:  # a dtype read through safetensors' own map
            tensor = self._handle(shard).get_tensor(name)
        check_finite(name, tensor, self.source)
        return tensor if dtype is None else tensor.to(dtype)
