"""Write a model as a ``transformers`` folder: ``save_student(model, folder)``.

The folder holds ``config.json`` (``model_type`` ``transformer_alloc``, the ``ArchConfig`` under
``arch``, an ``auto_map`` naming the classes of the modelling file), ``model.safetensors`` (our
``Model``'s state dict as it is: reduced shapes, RoPE frequencies per key/value head, a tied
head saved once as ``embed.weight``), and ``modeling_transformer_alloc.py`` with its
``attention_transformer_alloc.py``, the standalone model that
``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` runs; and, given a
``FromTeacher``, the teacher's tokenizer files.

The folder is written next to its destination under a hidden name and renamed into place, so a
failed export leaves no folder that looks valid.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from arch import ArchConfig, param_count
from workers.checkpoints.folder import INDEX, SAFETENSORS
from workers.errors import ExportError
from workers.hf.modeling_transformer_alloc import (
    ATTENTION_KINDS,
    MODEL_TYPE,
    TransformerAllocConfig,
    TransformerAllocForCausalLM,
)
from workers.models.model import Model

MODELING_FILE = Path(__file__).with_name("modeling_transformer_alloc.py")
# What a student folder's remote code is: the modelling file and the attention it imports
REMOTE_CODE = (MODELING_FILE, MODELING_FILE.with_name("attention_transformer_alloc.py"))
CONFIG_CLASS = TransformerAllocConfig.__name__
MODEL_CLASS = TransformerAllocForCausalLM.__name__
FREQUENCY_KEY = ".inv_freq"  # RoPE frequency buffers: saved, but no parameters


@dataclass(frozen=True)
class ExportReport:
    """What ``save_student`` wrote.

    Attributes:
        folder: the student folder.
        params: parameters, ``param_count(arch).total`` (a tied head counted once).
        buffer_elements: elements of the RoPE frequency buffers (``blocks.{i}.attn.inv_freq{j}``).
        elements: tensor elements in the weights file: ``params + buffer_elements``.
        file_bytes: size of ``model.safetensors``.
        dtype: the parameters' dtype in the file (the frequencies stay float32).
    """

    folder: Path
    params: int
    buffer_elements: int
    elements: int
    file_bytes: int
    dtype: str

    def summary(self) -> str:
        """One line for a command's output."""
        return (f"{self.folder}: {self.params:,} parameters ({self.dtype}), "
                f"{self.file_bytes:,} bytes of {SAFETENSORS}")


def check_exportable(arch: ArchConfig) -> None:
    """Raise ``ExportError`` (one line) unless the modelling file implements ``arch``: token
    inputs, causal attention, mhsa, frozen_qk and latent layers."""
    if arch.vocab_size is None:
        raise ExportError("transformers export: token models only (this one has vector inputs, "
                          f"input_dim = {arch.input_dim})")
    if not arch.causal:
        raise ExportError("transformers export: causal = false; a causal language model needs "
                          "causal attention")
    for i, layer in enumerate(arch.layers):
        if layer.attention not in ATTENTION_KINDS:
            raise ExportError(f"transformers export: layers[{i}].attention = "
                              f"{layer.attention!r}; the export takes "
                              f"{', '.join(ATTENTION_KINDS)} layers")


def student_config(arch: ArchConfig, dtype: torch.dtype,
                   sliding_window: int | None = None) -> dict[str, Any]:
    """The ``config.json`` contents of a student of ``arch`` whose weights are ``dtype``
    (``sliding_window``: its teacher's, which ``arch.max_seq_len`` is; the student refuses
    longer inputs rather than compute them differently)."""
    assert arch.vocab_size is not None  # check_exportable: token models only
    config = TransformerAllocConfig(
        arch=arch.to_dict(), vocab_size=arch.vocab_size, hidden_size=arch.d_model,
        num_hidden_layers=arch.n_layers, max_position_embeddings=arch.max_seq_len,
        tie_word_embeddings=arch.tie_embeddings, architectures=[MODEL_CLASS],
        dtype=str(dtype).removeprefix("torch."), sliding_window=sliding_window)
    data: dict[str, Any] = config.to_diff_dict()
    data["model_type"] = MODEL_TYPE
    data["auto_map"] = {"AutoConfig": f"{MODELING_FILE.stem}.{CONFIG_CLASS}",
                        "AutoModelForCausalLM": f"{MODELING_FILE.stem}.{MODEL_CLASS}"}
    return data


def student_tensors(model: Model, dtype: torch.dtype | None = None) -> dict[str, Tensor]:
    """The state dict to save: every tensor contiguous and unshared, the tied head left out
    (``transformers`` ties it to ``embed.weight`` on load), parameters cast to ``dtype`` (the
    RoPE frequencies stay float32: positions times frequencies need their precision)."""
    return _cast(model.arch, dict(model.state_dict()), dtype)


@dataclass(frozen=True)
class FromTeacher:
    """What a student folder takes from its teacher beside the weights: the window of a
    sliding-window teacher (its context), and what writes the teacher's tokenizer files into a
    folder (None: it has none)."""

    sliding_window: int | None = None
    tokenizer: Callable[[Path], None] | None = None


def save_student(model: Model, folder: Path, dtype: torch.dtype | None = None,
                 teacher: FromTeacher = FromTeacher()) -> ExportReport:
    """Write ``model`` to ``folder`` as a ``transformers`` causal LM (see the module docstring);
    ``dtype`` casts the parameters (default: as they are). An existing student folder (or an
    empty one) is replaced; any other existing path is refused.

    Raises:
        ExportError: a model the modelling file does not implement, or a folder in the way.
    """
    return save_student_parts(model.arch, [student_tensors(model, dtype)], folder, dtype,
                              teacher)


def save_student_parts(arch: ArchConfig, parts: Iterable[dict[str, Tensor]], folder: Path,
                       dtype: torch.dtype | None = None,
                       teacher: FromTeacher = FromTeacher()) -> ExportReport:
    """``save_student`` of a student of ``arch`` whose state dict comes in ``parts``, each
    written as it comes (a student built one layer at a time is never whole in memory): one
    part is ``model.safetensors``, more are shards listed by ``model.safetensors.index.json``,
    as ``transformers`` writes large models. The tied head is left out, parameters cast to
    ``dtype``; the parts together must hold the parameters ``arch`` describes.

    Raises:
        ExportError: a model the modelling file does not implement, or a folder in the way.
    """
    from safetensors.torch import save_file

    check_exportable(arch)
    _check_destination(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    weight_map: dict[str, str] = {}
    elements = buffers = 0
    weights_dtype = dtype or torch.float32
    try:
        for n, part in enumerate(parts, start=1):
            tensors = _cast(arch, part, dtype)
            name = f"model-{n:05d}.safetensors"
            save_file(tensors, str(tmp / name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(tensors, name))
            buffers += sum(v.numel() for k, v in tensors.items() if FREQUENCY_KEY in k)
            elements += sum(v.numel() for v in tensors.values())
            if "embed.weight" in tensors:
                weights_dtype = tensors["embed.weight"].dtype
        params = param_count(arch).total
        if elements - buffers != params:  # a model whose weights are not the ones arch describes
            raise ExportError(f"transformers export: the state dict holds "
                              f"{elements - buffers:,} parameters, its ArchConfig {params:,}")
        files = sorted(set(weight_map.values()))
        if len(files) == 1:
            os.replace(tmp / files[0], tmp / SAFETENSORS)
        else:
            total = sum((tmp / f).stat().st_size for f in files)
            (tmp / INDEX).write_text(json.dumps({"metadata": {"total_size": total},
                                                 "weight_map": weight_map}, indent=2))
        config = json.dumps(student_config(arch, weights_dtype, teacher.sliding_window),
                            indent=2, sort_keys=True)
        (tmp / "config.json").write_text(config + "\n")
        if teacher.tokenizer is not None:
            teacher.tokenizer(tmp)
        for source in REMOTE_CODE:
            shutil.copyfile(source, tmp / source.name)
        file_bytes = sum(f.stat().st_size for f in tmp.glob("*.safetensors"))
        _publish(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportReport(folder, params, buffers, elements, file_bytes,
                        str(weights_dtype).removeprefix("torch."))


def _cast(arch: ArchConfig, part: dict[str, Tensor], dtype: torch.dtype | None
          ) -> dict[str, Tensor]:
    """A part of the state dict as saved: the tied head left out, parameters cast to ``dtype``
    (the RoPE frequencies stay float32: positions times frequencies need their precision).
    Consumes ``part``: each tensor is dropped from it once cast, so a float32 layer and its
    cast copy are never both whole in memory."""
    out = {}
    for name in list(part):
        value = part.pop(name)
        if name == "head.weight" and arch.tie_embeddings:
            continue
        value = value.detach()
        cast = dtype is not None and value.is_floating_point() and FREQUENCY_KEY not in name \
            and value.dtype != dtype
        # a cast is a new tensor already; anything else is copied, so no two share storage
        out[name] = value.to(dtype).contiguous() if cast else value.contiguous().clone()
    return out


def _is_student(folder: Path) -> bool:
    """True for an empty folder or one whose ``config.json`` is a student's."""
    if not any(folder.iterdir()):
        return True
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") == MODEL_TYPE


def _check_destination(folder: Path) -> None:
    """Refuse a destination that exists and is not a student folder (never overwritten)."""
    if folder.exists() and not (folder.is_dir() and _is_student(folder)):
        raise ExportError(f"{str(folder)!r}: exists and is not a transformers student folder "
                          "(its config.json is not model_type transformer_alloc); choose "
                          "another folder or remove it")


def _publish(tmp: Path, folder: Path) -> None:
    """Rename the finished ``tmp`` folder to ``folder``, replacing an old student there."""
    if not folder.exists():
        os.replace(tmp, folder)
        return
    _check_destination(folder)  # checked again: it may have changed while we wrote
    old = folder.parent / f".{folder.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
    os.replace(folder, old)
    os.replace(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)


def load_student(folder: Path) -> TransformerAllocForCausalLM:
    """The student in ``folder`` through this package's copy of the modelling file (no remote
    code), in eval mode."""
    model = TransformerAllocForCausalLM.from_pretrained(folder)
    assert isinstance(model, TransformerAllocForCausalLM)
    return model.eval()

