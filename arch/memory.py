"""What training a model costs in memory, from its analytic counts (no torch): the bound every
search checks before it starts, so that a space whose trials cannot fit on their device is
refused in one line instead of failing every trial.

An estimate of the peak, in float32: weights, gradients and the optimizer's state (AdamW two
moments, Lion one), plus the activations autograd keeps for the backward pass at the batch and
length (per layer a few ``d_model``-wide tensors, the query/key/value projections, the MLP's
hidden units and, per head, the ``T x T`` logits and attention weights), plus the output logits.
It errs high rather than low; real peaks with fused kernels are lower.

Also what a trained decoder caches at inference: ``kv_cache_bytes``, the keys and values of one
token over all layers, at a given dtype.
"""

from __future__ import annotations

from arch.config import ArchConfig
from arch.errors import ConfigError
from arch.params import param_count

FLOAT = 4  # bytes
# Bytes per value of the dtypes a model is trained or served in.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
OPTIMIZER_STATES = {"adamw": 2, "lion": 1}  # float tensors per trainable parameter


def training_bytes(arch: ArchConfig, batch_size: int, optimizer: str = "adamw") -> int:
    """Estimated peak memory of a training step of ``arch`` at ``batch_size``."""
    count = param_count(arch)
    states = count.total + count.trainable * (1 + OPTIMIZER_STATES.get(optimizer, 2))
    tokens = batch_size * arch.max_seq_len
    activations = 0
    for layer in arch.layers:
        qk = sum(g.count * g.qk_dim for g in layer.heads)
        v = sum(g.width for g in layer.heads)
        heads = sum(g.count for g in layer.heads)
        hidden = arch.mlp_hidden(layer) * (2 if arch.mlp == "swiglu" else 1)
        activations += tokens * (6 * arch.d_model + 2 * qk + 2 * v + 2 * hidden)
        activations += 2 * batch_size * heads * arch.max_seq_len ** 2  # logits and weights
    outputs = arch.vocab_size or arch.output_dim or arch.d_model
    activations += 2 * tokens * outputs  # logits and their softmax
    return FLOAT * (states + activations)


def gib(size: int) -> str:
    """``size`` bytes for a message."""
    return f"{size / 2 ** 30:,.1f} GiB" if size >= 2 ** 27 else f"{size / 2 ** 20:,.1f} MiB"


def dtype_bytes(dtype: str) -> int:
    """Bytes per value of ``dtype`` (``float32``, ``bfloat16`` or ``float16``).

    Raises:
        ConfigError: another name.
    """
    if dtype not in DTYPE_BYTES:
        raise ConfigError([f"dtype = {dtype!r}: must be one of {', '.join(DTYPE_BYTES)}"])
    return DTYPE_BYTES[dtype]


def training_dtype(device: str) -> str:
    """The dtype activations (and so keys and values) have when the trainer runs on
    ``device``: it autocasts to bfloat16 on ``cuda`` and stays in float32 elsewhere."""
    return "bfloat16" if device == "cuda" else "float32"


def kv_cache_bytes(arch: ArchConfig, dtype: str = "float32") -> int:
    """Bytes a decoder caches per token of context: ``arch.kv_width`` units (per layer, what
    its kind caches, ``arch.kinds.KindTraits.kv_units``: e.g. each head group's ``kv_heads``
    key/value heads store ``qk_dim + v_dim`` values, so grouped-query attention shrinks it by
    the query heads each key/value head serves) at ``dtype``."""
    return arch.kv_width * dtype_bytes(dtype)
