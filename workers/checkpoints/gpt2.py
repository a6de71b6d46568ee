"""The GPT-2 layout of the ecosystem's small models (``GPT2LMHeadModel`` folders: fused
``c_attn`` Conv1D weights, input dimension first).

A GPT-2 model becomes an ``ArchConfig`` with biases, tanh-GELU MLPs, learned positions and tied
embeddings, and its weights our ``Model``'s state; a model whose heads have a reduced
``qk_dim`` (a compressed student) can be written back in the same layout (``--layout stock``)
with each head's query and key maps zero-padded to the full head width and rescaled so that the
stock GPT-2 forward, which divides logits by ``sqrt(head width)``, computes the student's logits
exactly: compatible, but not smaller.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from arch import ArchConfig, ConfigError, HeadGroup, LayerSpec
from common.files import write_atomic
from workers.checkpoints.folder import SAFETENSORS, TensorFolder, empty_model
from workers.errors import CheckpointError
from workers.models.attention import QKVLayout
from workers.models.model import Model

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


def load_gpt2(folder: Path, config: dict[str, Any], source: str) -> Model:
    """Our model of the GPT-2 folder ``folder`` (its ``config.json`` already read), built
    without a random initialisation and filled one tensor at a time, each checked against the
    shape the config makes before it is read."""
    arch = gpt2_arch(config)
    model = empty_model(arch, source)
    params = dict(model.named_parameters(remove_duplicate=False))
    with torch.no_grad(), TensorFolder(folder, source) as tensors:
        prefix = "transformer." if any(n.startswith("transformer.") for n in tensors.names()) \
            else ""
        for ours, theirs, transpose in _pairs(arch):
            shape = tuple(params[ours].shape)
            value = tensors.get(prefix + theirs, shape[::-1] if transpose else shape)
            params[ours].copy_(value.T if transpose else value)
    model.head.weight = model.embed.weight  # type: ignore[assignment]  # tied
    return model.eval()


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


def save_gpt2(model: Model, config: dict[str, Any], folder: Path,
              dtype: torch.dtype | None = None) -> None:
    """Write ``model`` in the GPT-2 layout of ``config`` (``config.json`` copied). Heads with a
    reduced ``qk_dim`` are padded with zeros to the config's head width, and their query and key
    maps scaled by ``(width / qk_dim) ** 0.25`` each, which keeps every logit. ``dtype``: the
    tensors' dtype in the file (default: as they are)."""
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
    if dtype is not None:  # the teacher's dtype: a stock student is the teacher's size
        tensors = {k: v.to(dtype) for k, v in tensors.items()}
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
    if any(g.grouped for g in layer.heads):
        raise CheckpointError(f"a GPT-2 layer has a key/value head per query head; this layer "
                              f"has {layer.heads_str}")
    layout = QKVLayout.of(layer)

    def padded(rows: Tensor) -> Tensor:
        queries, keys, values = layout.split(rows)
        return layout.fuse([_pad_head(x, width) for xs in queries for x in xs],
                           [_pad_head(x, width) for xs in keys for x in xs], values)

    return padded(weight), padded(bias)


def _pad_head(rows: Tensor, width: int) -> Tensor:
    """A head's ``(qk_dim, ...)`` query or key rows scaled by ``(width / qk_dim) ** 0.25`` and
    zero-padded to ``width`` rows."""
    qk_dim = rows.shape[0]
    zeros = rows.new_zeros(width - qk_dim, *rows.shape[1:])
    return torch.cat([rows * (width / qk_dim) ** 0.25, zeros])

