"""Trained models on disk, in and out: our trainer's checkpoints (``.pt``) and the GPT-2 layout
of the ecosystem's small models (a folder with ``config.json`` and ``model.safetensors``; fused
``c_attn`` Conv1D weights, input dimension first), read with the ``safetensors`` package. No
network, no model hub.

A GPT-2 model becomes an ``ArchConfig`` with biases, tanh-GELU MLPs, learned positions and tied
embeddings, and its weights our ``Model``'s state; a model whose heads have a reduced
``qk_dim`` (a compressed student) is written back in the same layout with each head's query and
key maps zero-padded to the full head width and rescaled so that the stock GPT-2 forward, which
divides logits by ``sqrt(head width)``, computes the student's logits exactly.
"""

from __future__ import annotations

import json
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from arch import ArchConfig, ConfigError, HeadGroup, LayerSpec
from common.errors import TransformerAllocError
from common.files import write_atomic
from workers.model import Model, build_model

Layout = Literal["ours", "gpt2"]
SAFETENSORS = "model.safetensors"


class CheckpointError(TransformerAllocError):
    """A checkpoint that cannot be read or written; one line naming the file and the rule."""


@dataclass
class Loaded:
    """A model read from disk, with what the file says about it."""

    arch: ArchConfig
    model: Model
    layout: Layout
    path: Path
    task: dict[str, Any] | None = None  # ours: the fields of the task it was trained on
    config: dict[str, Any] | None = None  # gpt2: config.json


def load(path: Path) -> Loaded:
    """Read ``path``: our ``.pt`` checkpoint or a GPT-2-layout folder.

    Raises:
        CheckpointError: missing file, unknown layout, or weights that do not fit.
    """
    if not path.exists():
        raise CheckpointError(f"--checkpoint {str(path)!r}: no such file or folder")
    if path.is_dir():
        if not (path / "config.json").is_file() or not (path / SAFETENSORS).is_file():
            raise CheckpointError(f"--checkpoint {str(path)!r}: unknown layout; a folder needs "
                                  f"config.json and {SAFETENSORS} (GPT-2 layout)")
        return _load_gpt2(path)
    try:
        # weights_only: our checkpoints are tensors, dicts and numbers; never unpickle code
        with warnings.catch_warnings():  # torch's own warning would repeat our one line
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "Unsupported global" not in str(err):  # not a pickle of ours at all
            raise CheckpointError(f"--checkpoint {str(path)!r}: unknown layout (not a "
                                  "workers.train checkpoint: UnpicklingError)") from None
        raise CheckpointError(f"--checkpoint {str(path)!r}: refused as unsafe: it holds "
                              "pickled Python objects beyond tensors, dicts and numbers, which "
                              "are never loaded (they could run code)") from None
    except Exception as err:  # torch raises many kinds for a file that is not a checkpoint
        raise CheckpointError(f"--checkpoint {str(path)!r}: unknown layout (not a "
                              f"workers.train checkpoint: {type(err).__name__})") from None
    if not isinstance(state, dict) or not {"arch", "model"} <= set(state):
        raise CheckpointError(f"--checkpoint {str(path)!r}: unknown layout (a workers.train "
                              "checkpoint holds arch and model)")
    try:
        arch = ArchConfig.from_dict(state["arch"])
        model = build_model(arch)
        model.load_state_dict(state["model"])
    except (ConfigError, RuntimeError, TypeError) as err:
        raise CheckpointError(f"--checkpoint {str(path)!r}: its weights do not fit its "
                              f"architecture ({str(err).splitlines()[0]})") from None
    return Loaded(arch, model.eval(), "ours", path, task=state.get("task"))


# --- GPT-2 layout -----------------------------------------------------------------------------


# GPT-2 options our model does not implement: a config that sets one otherwise is refused
# rather than loaded into a model that computes something else.
UNSUPPORTED_GPT2: dict[str, Any] = {"tie_word_embeddings": True, "scale_attn_weights": True,
                                    "scale_attn_by_inverse_layer_idx": False,
                                    "reorder_and_upcast_attn": False, "layer_norm_epsilon": 1e-5,
                                    "add_cross_attention": False}


def gpt2_arch(config: dict[str, Any]) -> ArchConfig:
    """The ``ArchConfig`` of a GPT-2 ``config.json``."""
    try:
        d, heads = int(config["n_embd"]), int(config["n_head"])
        if heads < 1 or d % heads:
            raise CheckpointError(f"config.json: n_embd {d} is not a multiple of n_head {heads}")
        inner = config.get("n_inner") or 4 * d
        if config.get("activation_function", "gelu_new") not in ("gelu_new", "gelu"):
            raise CheckpointError(f"config.json: activation_function = "
                                  f"{config['activation_function']!r}; this model supports only "
                                  "'gelu_new' and 'gelu'")
        for key, supported in UNSUPPORTED_GPT2.items():
            if config.get(key, supported) != supported:
                raise CheckpointError(f"config.json: {key} = {config[key]!r}; this model "
                                      f"supports only {supported!r}")
        layer = LayerSpec("mhsa", (HeadGroup(heads, d // heads),), mlp_ratio=inner / d)
        return ArchConfig(d_model=d, layers=(layer,) * int(config["n_layer"]),
                          max_seq_len=int(config["n_positions"]),
                          vocab_size=int(config["vocab_size"]), positional="learned",
                          norm="layernorm",
                          mlp="gelu_tanh" if config.get("activation_function",
                                                        "gelu_new") == "gelu_new" else "gelu",
                          tie_embeddings=True, bias=True)
    except (KeyError, TypeError, ValueError, ConfigError) as err:
        raise CheckpointError(f"config.json: not a GPT-2 config ({err})") from None


def _load_gpt2(folder: Path) -> Loaded:
    from safetensors.numpy import load_file

    try:
        config = json.loads((folder / "config.json").read_text())
        weights = {k.removeprefix("transformer."): v
                   for k, v in load_file(folder / SAFETENSORS).items()}
    except Exception as err:  # JSON and safetensors errors: a broken or foreign file
        raise CheckpointError(f"--checkpoint {str(folder)!r}: unreadable config.json or "
                              f"{SAFETENSORS} ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"--checkpoint {str(folder)!r}: config.json is not an object")
    arch = gpt2_arch(config)
    model = build_model(arch)
    check_gpt2_shapes(weights, model, f"--checkpoint {str(folder)!r}")
    model.load_state_dict(gpt2_state(weights, arch))
    return Loaded(arch, model.eval(), "gpt2", folder, config=config)


def check_gpt2_shapes(weights: dict[str, np.ndarray], model: Model, source: str) -> None:
    """Raise ``CheckpointError`` naming the first GPT-2 tensor that is missing or whose shape is
    not the one its ``config.json`` makes (both in the file's orientation)."""
    expected = model.state_dict()
    for ours, theirs, transpose in _pairs(model.arch):
        if theirs not in weights:
            raise CheckpointError(f"{source}: tensor {theirs!r} is missing from {SAFETENSORS}")
        want = tuple(expected[ours].shape)[::-1] if transpose else tuple(expected[ours].shape)
        if tuple(weights[theirs].shape) != want:
            raise CheckpointError(f"{source}: tensor {theirs!r} has shape "
                                  f"{tuple(weights[theirs].shape)}, config.json makes it {want}")


# Our Model's state-dict keys and the GPT-2 ones (without "transformer."); Conv1D weights
# are (in, out), ours (out, in).
_GLOBAL = (("embed.weight", "wte.weight"), ("pos.weight", "wpe.weight"),
           ("norm.weight", "ln_f.weight"), ("norm.bias", "ln_f.bias"))
_BLOCK = (("attn_norm.weight", "ln_1.weight", False), ("attn_norm.bias", "ln_1.bias", False),
          ("attn.qkv.weight", "attn.c_attn.weight", True),
          ("attn.qkv.bias", "attn.c_attn.bias", False),
          ("attn.out.weight", "attn.c_proj.weight", True),
          ("attn.out.bias", "attn.c_proj.bias", False),
          ("mlp_norm.weight", "ln_2.weight", False), ("mlp_norm.bias", "ln_2.bias", False),
          ("mlp.up.weight", "mlp.c_fc.weight", True), ("mlp.up.bias", "mlp.c_fc.bias", False),
          ("mlp.down.weight", "mlp.c_proj.weight", True),
          ("mlp.down.bias", "mlp.c_proj.bias", False))


def _pairs(arch: ArchConfig) -> list[tuple[str, str, bool]]:
    """(our key, GPT-2 key, transposed) for every tensor of ``arch``."""
    pairs = [(ours, theirs, False) for ours, theirs in _GLOBAL]
    for i in range(arch.n_layers):
        pairs += [(f"blocks.{i}.{ours}", f"h.{i}.{theirs}", t) for ours, theirs, t in _BLOCK]
    return pairs


def gpt2_state(weights: dict[str, np.ndarray], arch: ArchConfig) -> dict[str, Tensor]:
    """Our ``Model``'s state dict from GPT-2 weights (keys without ``transformer.``)."""
    state = {}
    for ours, theirs, transpose in _pairs(arch):
        value = torch.from_numpy(np.ascontiguousarray(weights[theirs]))
        state[ours] = value.T.contiguous() if transpose else value
    state["head.weight"] = state["embed.weight"]  # tied
    return state


def save_gpt2(model: Model, config: dict[str, Any], folder: Path) -> None:
    """Write ``model`` in the GPT-2 layout of ``config`` (``config.json`` copied). Heads with a
    reduced ``qk_dim`` are padded with zeros to the config's head width, and their query and key
    maps scaled by ``(width / qk_dim) ** 0.25`` each, which keeps every logit."""
    from safetensors.torch import save_file

    arch, state = model.arch, model.state_dict()
    width = arch.d_model // int(config["n_head"])
    for i, layer in enumerate(arch.layers):
        key = f"blocks.{i}.attn.qkv."
        state[key + "weight"], state[key + "bias"] = padded_qkv(
            state[key + "weight"], state[key + "bias"], layer, width)
    tensors = {f"transformer.{theirs}": (state[ours].T if transpose else state[ours])
               .detach().contiguous().clone() for ours, theirs, transpose in _pairs(arch)}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / SAFETENSORS), metadata={"format": "pt"})
    write_atomic(folder / "config.json", json.dumps(config, indent=2))


def padded_qkv(weight: Tensor, bias: Tensor, layer: LayerSpec, width: int
               ) -> tuple[Tensor, Tensor]:
    """``(3 * heads * width, d)`` query/key/value weights and biases of a layer whose groups
    may have ``qk_dim < width``: each head's rows zero-padded to ``width`` and scaled so that
    ``q . k / sqrt(width)`` equals the reduced head's ``q . k / sqrt(qk_dim)``."""
    if any(g.v_dim != width for g in layer.heads):
        raise CheckpointError(f"every head of a GPT-2 layer has width {width}; this layer has "
                              f"{layer.heads_str}")
    qk_width = sum(g.count * g.qk_dim for g in layer.heads)
    q, k, v = weight.split([qk_width, qk_width, layer.width])
    qb, kb, vb = bias.split([qk_width, qk_width, layer.width])
    out_w: list[list[Tensor]] = [[], []]
    out_b: list[list[Tensor]] = [[], []]
    offset = 0
    for g in layer.heads:
        scale = (width / g.qk_dim) ** 0.25
        for _ in range(g.count):
            rows = slice(offset, offset + g.qk_dim)
            for n, (w, b) in enumerate(((q, qb), (k, kb))):
                out_w[n].append(torch.cat([w[rows] * scale, w.new_zeros(width - g.qk_dim,
                                                                          w.shape[1])]))
                out_b[n].append(torch.cat([b[rows] * scale, b.new_zeros(width - g.qk_dim)]))
            offset += g.qk_dim
    return (torch.cat([*out_w[0], *out_w[1], v]), torch.cat([*out_b[0], *out_b[1], vb]))

