"""The Llama family's layout: ``LlamaForCausalLM``, ``Qwen2ForCausalLM`` and
``MistralForCausalLM`` folders saved by ``transformers`` (RoPE, grouped-query attention,
RMSNorm, SwiGLU; separate ``q_proj`` / ``k_proj`` / ``v_proj`` maps, ``(out, in)`` weights).

``llama_arch`` reads ``config.json`` into an ``ArchConfig`` and refuses, by name, every field
that would make ``transformers`` compute something our model does not (RoPE kinds that change
more than the frequencies, per-layer attention types, biases we do not place); RoPE kinds that
only change the frequencies (``linear``, Llama 3.1's ``llama3``) are read into the frequency
buffers, which our model holds as weights;
``load_llama`` reads the weights lazily, one tensor at a time. ``save_llama`` writes a student
back in the teacher's stock layout: heads whose query-key pairs were cut get zeros in the cut
pairs (RoPE turns a zero pair into zero), so stock ``transformers`` computes the student's
logits exactly, at the teacher's size.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from arch import MAX_DEPTH, MAX_WIDTH, ArchConfig, ConfigError, HeadGroup, LayerSpec
from common.files import write_atomic
from workers.checkpoints.folder import SAFETENSORS, TensorFolder, empty_model
from workers.checkpoints.gguf import GGUFTensors
from workers.errors import CheckpointError
from workers.models.attention import MultiHeadAttention, QKVLayout, rope_frequencies
from workers.models.model import Model

FAMILIES = ("llama", "mistral", "qwen2")
Tensors = TensorFolder | GGUFTensors  # a Llama-family checkpoint's tensors by stock name
MAX_CONTEXT = 1 << 22  # positions: a bound on what a config.json may claim
MAX_VOCAB = 1 << 24

# Fields that change what transformers computes, with the one value our model implements
# (absent counts as that value). Anything else is refused by name.
_SAME: dict[str, Any] = {
    "hidden_act": "silu", "mlp_bias": False, "pretraining_tp": 1,
    "partial_rotary_factor": 1.0, "use_sliding_window": False, "attention_logit_softcapping":
    None, "final_logit_softcapping": None, "no_rope_layers": None, "is_decoder": True,
    "add_cross_attention": False}


def _need(config: dict[str, Any], key: str, supported: Any, why: str = "") -> None:
    value = config.get(key, supported)
    if value != supported and not (value is None and supported is None):
        raise CheckpointError(f"config.json: {key} = {value!r} is not supported (this model "
                              f"computes only {key} = {supported!r}{why})")


def _int(config: dict[str, Any], key: str, low: int, high: int) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise CheckpointError(f"config.json: {key} = {value!r}: must be an integer in "
                              f"[{low}, {high:,}]")
    return value


# RoPE kinds whose only effect is on the frequencies (which our model holds as weights), with
# the parameters each needs; others (dynamic, yarn, longrope, ...) change the computation
ROPE_KINDS: dict[str, tuple[str, ...]] = {
    "default": (), "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings")}


def rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """RoPE's parameters from ``rope_parameters`` (transformers >= 5) or ``rope_theta`` and
    ``rope_scaling`` (earlier): ``rope_type``, ``rope_theta`` and the kind's own, checked; a
    kind that is not in ``ROPE_KINDS`` is refused by name."""
    params = config.get("rope_parameters")
    if not isinstance(params, dict):
        scaling = config.get("rope_scaling")
        if scaling is not None and not isinstance(scaling, dict):
            raise CheckpointError(f"config.json: rope_scaling = {scaling!r}: must be null or "
                                  "an object")
        params = {"rope_theta": config.get("rope_theta", 10000.0), **(scaling or {})}
        if "type" in params and "rope_type" not in params:  # the older spelling
            params["rope_type"] = params.pop("type")
    kind = params.get("rope_type", "default")
    if kind not in ROPE_KINDS:
        raise CheckpointError(f"config.json: rope_type = {kind!r} is not supported (this model "
                              f"computes RoPE of kinds {', '.join(ROPE_KINDS)}: the ones that "
                              "only change the frequencies)")
    known = {"rope_type", "rope_theta", "partial_rotary_factor", *ROPE_KINDS[kind]}
    for key in params:
        if key not in known:
            raise CheckpointError(f"config.json: rope_parameters.{key} is not supported with "
                                  f"rope_type {kind!r}")
    _need(params, "partial_rotary_factor", 1.0, ": every query-key dim rotates")
    for key in ("rope_theta", *ROPE_KINDS[kind]):
        value = params.get(key, 10000.0 if key == "rope_theta" else None)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not (
                math.isfinite(value) and value > (1 if key == "rope_theta" else 0)):
            raise CheckpointError(f"config.json: rope {key} = {value!r}: must be a number > "
                                  f"{1 if key == 'rope_theta' else 0}")
    if kind == "llama3" and not params["high_freq_factor"] > params["low_freq_factor"]:
        raise CheckpointError("config.json: rope high_freq_factor must exceed low_freq_factor")
    return {**params, "rope_type": kind, "rope_theta": float(params.get("rope_theta", 1e4))}


def rope_inv_freq(params: dict[str, Any], dim: int) -> Tensor:
    """The ``dim / 2`` frequencies of ``rope_parameters``' kind (float32, as transformers
    computes them): ``default``; ``linear`` divides them by ``factor``; ``llama3`` (Llama 3.1)
    divides the long wavelengths by ``factor``, keeps the short ones and blends between."""
    inv_freq = rope_frequencies(dim, params["rope_theta"])
    kind = params["rope_type"]
    if kind == "linear":
        return inv_freq / params["factor"]
    if kind != "llama3":
        return inv_freq
    factor, old = params["factor"], params["original_max_position_embeddings"]
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelength - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    between = ~(wavelength < old / high) & ~(wavelength > old / low)
    return torch.where(between, blended, scaled)


def context_length(config: dict[str, Any], family: str) -> int:
    """The longest sequence read: ``max_position_embeddings``, or a sliding window shorter than
    it (within one window, sliding-window attention is causal attention: the model is read as
    one of that context, and longer inputs are refused rather than computed differently)."""
    context = _int(config, "max_position_embeddings", 1, MAX_CONTEXT)
    window = sliding_window(config, family)
    return context if window is None else min(context, window)


def sliding_window(config: dict[str, Any], family: str) -> int | None:
    """The window of sliding-window attention the model computes (None: causal attention over
    every position)."""
    window = config.get("sliding_window")
    if family == "qwen2" or window is None:  # Qwen2's applies only with use_sliding_window
        return None
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise CheckpointError(f"config.json: sliding_window = {window!r}: must be null or an "
                              "integer >= 1")
    return window


def llama_arch(config: dict[str, Any]) -> ArchConfig:
    """The ``ArchConfig`` of a Llama / Qwen2 / Mistral ``config.json``."""
    family = config.get("model_type")
    if family not in FAMILIES:
        raise CheckpointError(f"config.json: model_type = {family!r}; the Llama family's "
                              f"are {', '.join(FAMILIES)}")
    for key, value in _SAME.items():
        _need(config, key, value)
    layer_types = config.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list) or any(
            t != "full_attention" for t in layer_types)):
        kinds = sorted({str(t) for t in layer_types}) if isinstance(layer_types, list) else \
            layer_types
        raise CheckpointError(f"config.json: layer_types = {kinds!r} is not supported (this "
                              "model computes only 'full_attention' layers)")
    d = _int(config, "hidden_size", 1, MAX_WIDTH)
    heads = _int(config, "num_attention_heads", 1, MAX_WIDTH)
    kv = config.get("num_key_value_heads") or heads
    kv = _int({"num_key_value_heads": kv}, "num_key_value_heads", 1, heads)
    head_dim = config.get("head_dim") or d // heads
    head_dim = _int({"head_dim": head_dim}, "head_dim", 2, MAX_WIDTH)
    hidden = _int(config, "intermediate_size", 1, 64 * MAX_WIDTH)
    if heads % kv:
        raise CheckpointError(f"config.json: num_key_value_heads = {kv} must divide "
                              f"num_attention_heads = {heads}")
    bias = bool(config.get("attention_bias", False))
    if family == "qwen2":
        bias = True  # Qwen2's query, key and value maps always have biases (its output none)
    elif bias:
        raise CheckpointError("config.json: attention_bias = True is not supported for "
                              f"{family} (biases on the output map as well; this model places "
                              "them on the query, key and value maps only, as Qwen2 does)")
    eps = config.get("rms_norm_eps", 1e-6)
    try:
        layer = LayerSpec("mhsa", (HeadGroup(heads, head_dim, head_dim, kv),),
                          mlp_ratio=hidden / d)
        return ArchConfig(d_model=d, layers=(layer,) * _int(config, "num_hidden_layers", 1,
                                                             MAX_DEPTH),
                          max_seq_len=context_length(config, family),
                          vocab_size=_int(config, "vocab_size", 1, MAX_VOCAB),
                          positional="rope", norm="rmsnorm", mlp="swiglu",
                          tie_embeddings=bool(config.get("tie_word_embeddings", False)),
                          qkv_bias=bias, rope_theta=rope_parameters(config)["rope_theta"],
                          norm_eps=eps)
    except ConfigError as err:
        raise CheckpointError(f"config.json: not a {family} config this model can read "
                              f"({err})") from None


def llama_config(arch: ArchConfig) -> dict[str, Any]:
    """The ``LlamaForCausalLM`` ``config.json`` of ``arch`` (the inverse of ``llama_arch``), for
    a model trained here in the Llama layout: one head group per layer, the same in every layer,
    RoPE, RMSNorm, SwiGLU, no biases.

    Raises:
        CheckpointError: ``arch`` is not such a model.
    """
    layer = arch.layers[0]
    problems = [name for name, bad in (
        ("layers differ", any(x != layer for x in arch.layers)),
        ("one head group per layer", len(layer.heads) != 1),
        ("mhsa attention", layer.attention != "mhsa"),
        ("qk_dim = v_dim", layer.heads[0].qk_dim != layer.heads[0].v_dim),
        ("positional rope", arch.positional != "rope"), ("norm rmsnorm", arch.norm != "rmsnorm"),
        ("mlp swiglu", arch.mlp != "swiglu" or layer.mlp_ratio == 0),
        ("no biases", arch.bias or arch.qkv_bias), ("token inputs", arch.vocab_size is None),
        ("eta 1", layer.eta != 1.0), ("causal", not arch.causal)) if bad]
    if problems:
        raise CheckpointError(f"arch {arch.describe()}: not a Llama model (needs: "
                              f"{', '.join(problems)})")
    g = layer.heads[0]
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": arch.vocab_size, "hidden_size": arch.d_model,
            "intermediate_size": arch.mlp_hidden(layer), "num_hidden_layers": arch.n_layers,
            "num_attention_heads": g.count, "num_key_value_heads": g.kv_heads,
            "head_dim": g.qk_dim, "hidden_act": "silu",
            "max_position_embeddings": arch.max_seq_len,
            "rms_norm_eps": arch.norm_eps or 1e-6, "tie_word_embeddings": arch.tie_embeddings,
            "rope_parameters": {"rope_type": "default", "rope_theta": arch.rope_theta},
            "attention_bias": False, "mlp_bias": False, "dtype": "float32"}


def block_pairs(arch: ArchConfig, i: int) -> list[tuple[str, list[str]]]:
    """(our key, the stock tensors concatenated into it, in order) of decoder block ``i``."""
    a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
    pairs = [(f"blocks.{i}.attn_norm.weight", [f"model.layers.{i}.input_layernorm.weight"]),
             (f"blocks.{i}.attn.qkv.weight", [a + "q_proj.weight", a + "k_proj.weight",
                                              a + "v_proj.weight"]),
             (f"blocks.{i}.attn.out.weight", [a + "o_proj.weight"]),
             (f"blocks.{i}.mlp_norm.weight", [f"model.layers.{i}.post_attention_layernorm.weight"]),
             (f"blocks.{i}.mlp.up.weight", [m + "gate_proj.weight", m + "up_proj.weight"]),
             (f"blocks.{i}.mlp.down.weight", [m + "down_proj.weight"])]
    if arch.qkv_bias:
        pairs.append((f"blocks.{i}.attn.qkv.bias", [a + "q_proj.bias", a + "k_proj.bias",
                                                    a + "v_proj.bias"]))
    return pairs


def stock_pairs(arch: ArchConfig) -> list[tuple[str, list[str]]]:
    """Every tensor of ``arch`` in the stock layout: (our key, its stock tensors)."""
    pairs = [("embed.weight", ["model.embed_tokens.weight"]),
             ("norm.weight", ["model.norm.weight"])]
    if not arch.tie_embeddings:
        pairs.append(("head.weight", ["lm_head.weight"]))
    for i in range(arch.n_layers):
        pairs += block_pairs(arch, i)
    return pairs


def stock_row_split(arch: ArchConfig, ours: str, n: int) -> list[int]:
    """Row counts of the stock tensors concatenated into our ``ours`` (``n`` of them): the
    query, key and value maps of a fused projection, the gate and up maps of a SwiGLU MLP;
    empty for a tensor that is one stock tensor."""
    layer = arch.layers[0]
    if ".attn.qkv." in ours:  # q_proj, k_proj, v_proj
        return list(QKVLayout.of(layer).widths)
    if ".mlp.up." in ours:
        return [arch.mlp_hidden(layer)] * 2
    assert n == 1
    return []


def load_llama(folder: Path, config: dict[str, Any], source: str) -> Model:
    """Our model of a Llama-family folder, read one tensor at a time (each checked against the
    shape its ``config.json`` makes before it is read)."""
    llama_arch(config)  # every field refused by name before a file is opened
    with TensorFolder(folder, source) as tensors:
        return tensors_into(tensors, config, source)


@torch.no_grad()
def tensors_into(tensors: Tensors, config: dict[str, Any], source: str) -> Model:
    """Our model of ``config`` with every stock tensor of ``tensors`` copied in."""
    arch = llama_arch(config)
    model = empty_model(arch, source)
    fill_llama(model, tensors, config, stock_pairs(arch), range(arch.n_layers))
    if arch.tie_embeddings:
        model.head.weight = model.embed.weight  # type: ignore[assignment]
    return model.eval()


@torch.no_grad()
def fill_llama(model: Model, tensors: Tensors, config: dict[str, Any],
               pairs: list[tuple[str, list[str]]], layers: Iterable[int]) -> None:
    """Copy the stock tensors of ``pairs`` (``stock_pairs``' entries) into ``model``'s
    parameters, and RoPE's frequencies of ``layers`` into their buffers (which a meta build
    leaves empty)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    arch = model.arch
    for ours, theirs in pairs:
        target = params[ours]
        rows = stock_row_split(arch, ours, len(theirs)) or [target.shape[0]]
        for part, name, n in zip(target.split(rows), theirs, rows):
            # as stored, converted by the copy: no float32 copy of the file's tensor
            part.copy_(tensors.get(name, (n, *target.shape[1:]), dtype=None))
    rope = rope_parameters(config)
    for i in layers:
        attn = model.block(i).attn
        for j, g in enumerate(arch.layers[i].heads):
            attn.frequencies(j).copy_(rope_inv_freq(rope, g.qk_dim))


def save_llama(model: Model, config: dict[str, Any], folder: Path,
               dtype: torch.dtype | None = None) -> None:
    """Write ``model`` (the teacher's arch, or a student with fewer query-key pairs per head)
    in the stock layout of ``config``: cut pairs are zero rows at their place in the teacher's
    head, the query scaled by ``sqrt(head_dim / qk_dim)`` so that stock attention's
    ``1 / sqrt(head_dim)`` gives the student's logits. ``dtype``: the tensors' dtype in the file
    (default: as they are)."""
    from safetensors.torch import save_file

    teacher = llama_arch(config)
    full = teacher.layers[0].heads[0]
    frequencies = rope_inv_freq(rope_parameters(config), full.qk_dim)  # the teacher's
    state = {k: v.detach() for k, v in model.state_dict().items()}
    for i, layer in enumerate(model.arch.layers):
        attn = model.block(i).attn
        assert isinstance(attn, MultiHeadAttention)
        key = f"blocks.{i}.attn.qkv."
        for suffix in ("weight", "bias") if model.arch.qkv_bias else ("weight",):
            state[key + suffix] = padded_rope_qkv(state[key + suffix], attn, layer, full,
                                                  frequencies)
    tensors: dict[str, Tensor] = {}
    for ours, theirs in stock_pairs(teacher):
        rows = stock_row_split(teacher, ours, len(theirs)) or [state[ours].shape[0]]
        for part, name in zip(state[ours].split(rows), theirs):
            tensors[name] = part.to(dtype or part.dtype).contiguous().clone()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / SAFETENSORS), metadata={"format": "pt"})
    write_atomic(folder / "config.json", json.dumps(config, indent=2))


def padded_rope_qkv(rows: Tensor, attn: MultiHeadAttention, layer: LayerSpec,
                    full: HeadGroup, standard: Tensor) -> Tensor:
    """The teacher-shaped fused query/key/value rows (weights ``(n, d)`` or biases ``(n,)``) of
    a student layer: each key/value head's kept pairs go back to the teacher's pair positions
    (found by their frequencies among the teacher's, ``standard``), zeros elsewhere."""
    queries, keys, values = attn.layout.split(rows)
    padded_q, padded_k = [], []
    for j, g in enumerate(layer.heads):
        if g.v_dim != full.v_dim or g.count // g.kv_heads != full.count // full.kv_heads:
            raise CheckpointError(f"layer heads {layer.heads_str}: the stock layout keeps "
                                  f"{full} heads; only qk_dim may be lower")
        scale = math.sqrt(full.qk_dim / g.qk_dim)
        for kv, freqs in enumerate(attn.frequencies(j)):  # (qk/2,) per key/value head
            place = _pair_places(freqs, standard)
            padded_q += [_scatter(queries[j][h] * scale, place, full.qk_dim)
                         for h in attn.layout.query_heads(j, kv)]
            padded_k.append(_scatter(keys[j][kv], place, full.qk_dim))
    return attn.layout.fuse(padded_q, padded_k, values)


def _pair_places(kept: Tensor, standard: Tensor) -> Tensor:
    """Indices of the teacher's pairs whose frequencies ``kept`` are."""
    distance = (kept[:, None] - standard[None, :]).abs()
    place = distance.argmin(dim=1)
    if bool((distance.min(dim=1).values > 1e-6 * standard.max()).any()):
        raise CheckpointError("a head's RoPE frequencies are not its teacher's: the stock "
                              "layout can only hold pairs cut from the teacher")
    return place


def _scatter(rows: Tensor, place: Tensor, dim: int) -> Tensor:
    """``rows`` (2r, ...) in rotate-half order (pair i = rows i and r + i) put at pairs
    ``place`` of a ``dim``-row head, zeros elsewhere."""
    half, full_half = rows.shape[0] // 2, dim // 2
    out = rows.new_zeros(dim, *rows.shape[1:])
    out[place] = rows[:half]
    out[place + full_half] = rows[half:]
    return out
