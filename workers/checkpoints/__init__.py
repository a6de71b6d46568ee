"""Trained models on disk, in and out: our trainer's checkpoints (``.pt``), folders saved by
``transformers`` in the layouts practitioners hold (GPT-2; Llama, Qwen2 and Mistral with RoPE
and grouped-query attention), read lazily with ``safetensors``, and llama.cpp's GGUF files of
the Llama family (``gguf``: dequantized a tensor at a time). No network, no model hub.

``load(path)`` returns a ``Loaded``: our ``Model`` with the file's weights, its ``ArchConfig``
and what the file says about it. The layouts live in their own modules (``gpt2``, ``llama``);
``folder`` reads a ``transformers`` folder, one tensor at a time.
"""

from __future__ import annotations

import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from arch import ArchConfig, ConfigError
from workers.checkpoints.folder import (
    INDEX,
    SAFETENSORS,
    TensorFolder,
    check_finite,
    check_fits_memory,
    checkpoint_error,
    is_model_folder,
    read_config,
    source_of,
)
from workers.checkpoints.gguf import GGUFTensors, gguf_file, model_config, open_tensors
from workers.checkpoints.gpt2 import gpt2_arch, load_gpt2, save_gpt2
from workers.checkpoints.llama import (
    FAMILIES,
    llama_arch,
    llama_config,
    load_llama,
    save_llama,
    stock_pairs,
    stock_row_split,
    tensors_into,
)
from workers.checkpoints.stream import WholeModel
from workers.errors import CheckpointError
from workers.models.model import Model, build_model

Layout = Literal["ours", "gpt2", "llama"]
STUDENT_TYPE = "transformer_alloc"  # the model_type of our students' folders (workers.hf)
__all__ = [
    "STUDENT_TYPE",
    "CheckpointError",
    "Layout",
    "Loaded",
    "WholeModel",
    "gguf_file",
    "gpt2_arch",
    "is_family_folder",
    "llama_arch",
    "llama_config",
    "load",
    "model_config",
    "open_tensors",
    "read_arch",
    "save_gpt2",
    "save_llama",
    "source_of",
    "stock_pairs",
    "stock_row_split",
]


@dataclass
class Loaded:
    """A model read from disk, with what the file says about it."""

    arch: ArchConfig
    model: Model
    layout: Layout
    path: Path
    task: dict[str, Any] | None = None  # ours: the fields of the task it was trained on
    config: dict[str, Any] | None = None  # a transformers folder: its config.json

    @property
    def family(self) -> str:
        """``ours``, or the folder's ``model_type`` (gpt2, llama, qwen2, mistral,
        transformer_alloc)."""
        return "ours" if self.config is None else str(self.config.get("model_type", "gpt2"))


def load(path: Path) -> Loaded:
    """Read ``path``: our ``.pt`` checkpoint or a ``transformers`` folder.

    Raises:
        CheckpointError: missing file, unknown layout, a config field the model does not
            implement, or weights that do not fit.
    """
    if not path.exists():
        raise checkpoint_error(source_of(path), "no such file or folder")
    gguf = gguf_file(path)
    if gguf is not None:
        return _load_gguf(gguf)
    if path.is_dir():
        return load_folder(path)
    return _load_ours(path)


def is_family_folder(path: Path) -> bool:
    """True for a model folder whose ``config.json`` names a Llama-family model, or a GGUF file
    (a checkpoint a pass can read one decoder layer at a time: ``workers.checkpoints.stream``)."""
    if gguf_file(path) is not None:
        return True
    if not (path.is_dir() and is_model_folder(path)):
        return False
    return read_config(path, source_of(path)).get("model_type") in FAMILIES


def read_arch(path: Path) -> ArchConfig:
    """The architecture of the checkpoint at ``path``: from ``config.json`` alone for a
    folder, or a GGUF file's metadata (no weight read), else from our ``.pt``, so that what
    depends on sizes only is checked before any work.

    Raises:
        CheckpointError: as ``load``.
    """
    if not path.exists():
        raise checkpoint_error(source_of(path), "no such file or folder")
    gguf = gguf_file(path)
    if gguf is not None:
        return llama_arch(model_config(gguf, source_of(path)))
    if not path.is_dir():
        return _load_ours(path).arch
    source, config, kind = _folder_config(path)
    if kind == "gpt2":
        return gpt2_arch(config)
    if kind in FAMILIES:
        return llama_arch(config)
    return _student_arch(config, source)


def _folder_config(folder: Path) -> tuple[str, dict[str, Any], str]:
    """A model folder's source (for error lines), ``config.json`` and ``model_type``, checked
    to be one this package reads."""
    source = source_of(folder)
    if not is_model_folder(folder):
        raise checkpoint_error(source, f"unknown layout; a folder needs config.json and "
                                       f"{SAFETENSORS} (or shards listed in {INDEX}), as "
                                       "transformers' save_pretrained writes them")
    config = read_config(folder, source)
    kind = config.get("model_type", "gpt2" if "n_embd" in config else None)
    if kind != "gpt2" and kind not in FAMILIES and kind != STUDENT_TYPE:
        raise CheckpointError(f"config.json: model_type = {kind!r} is not supported; this "
                              f"model reads gpt2, {', '.join(FAMILIES)} (RoPE and grouped-query "
                              f"attention included) and {STUDENT_TYPE} (our students)")
    return source, config, str(kind)


def load_folder(folder: Path) -> Loaded:
    """A folder saved by ``transformers``: GPT-2, or the Llama family (by ``model_type``)."""
    source, config, kind = _folder_config(folder)
    if kind == "gpt2":
        return Loaded(gpt2_arch(config), load_gpt2(folder, config, source), "gpt2", folder,
                      config=config)
    if kind in FAMILIES:
        model = load_llama(folder, config, source)
        return Loaded(model.arch, model, "llama", folder, config=config)
    model = _load_student(folder, config, source)
    return Loaded(model.arch, model, "ours", folder, config=config)


def _load_gguf(path: Path) -> Loaded:
    """A GGUF file of the Llama family, read as the folder its metadata describes."""
    source = source_of(path)
    with GGUFTensors(path, source) as tensors:
        model = tensors_into(tensors, tensors.config, source)
    return Loaded(model.arch, model, "llama", path, config=tensors.config)


def _student_arch(config: dict[str, Any], source: str) -> ArchConfig:
    try:
        return ArchConfig.from_dict(config.get("arch"))
    except ConfigError as err:
        raise checkpoint_error(source, f"config.json's arch is not an architecture ({err})"
                              ) from None


def _load_student(folder: Path, config: dict[str, Any], source: str) -> Model:
    """A student folder of ``workers.hf.export``: our arch under ``arch``, our state dict."""
    arch = _student_arch(config, source)
    check_fits_memory(arch, source)
    model = build_model(arch)
    state = model.state_dict()
    with torch.no_grad(), TensorFolder(folder, source) as tensors:
        for name, target in state.items():
            if not (name == "head.weight" and arch.tie_embeddings):  # saved once, as embed
                target.copy_(tensors.get(name, tuple(target.shape)))
    return model.eval()


def _load_ours(path: Path) -> Loaded:
    try:
        # weights_only: our checkpoints are tensors, dicts and numbers; never unpickle code
        with warnings.catch_warnings():  # torch's own warning would repeat our one line
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "Unsupported global" not in str(err):  # not a pickle of ours at all
            raise checkpoint_error(source_of(path), "unknown layout (not a workers.train "
                                                    "checkpoint: UnpicklingError)") from None
        raise checkpoint_error(source_of(path), "refused as unsafe: it holds pickled Python "
                                                "objects beyond tensors, dicts and numbers, "
                                                "which are never loaded (they could run code)"
                               ) from None
    except Exception as err:  # torch raises many kinds for a file that is not a checkpoint
        raise checkpoint_error(source_of(path), "unknown layout (not a workers.train "
                                                f"checkpoint: {type(err).__name__})") from None
    if not isinstance(state, dict) or not {"arch", "model"} <= set(state):
        raise checkpoint_error(source_of(path), "unknown layout (a workers.train "
                                                "checkpoint holds arch and model)")
    try:
        arch = ArchConfig.from_dict(state["arch"])
        model = build_model(arch)
        for name, tensor in dict(state["model"]).items():
            check_finite(name, tensor, source_of(path))
        model.load_state_dict(state["model"])
    except (ConfigError, RuntimeError, TypeError, ValueError) as err:
        raise checkpoint_error(source_of(path), "its weights do not fit its architecture "
                                                f"({str(err).splitlines()[0]})") from None
    return Loaded(arch, model.eval(), "ours", path, task=state.get("task"))
