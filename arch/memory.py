"""What training a model costs in memory, from its analytic counts (no torch): the bound every
search checks before it starts, so that a space whose trials cannot fit on their device is
refused in one line instead of failing every trial.

An estimate of the peak, in float32: weights, gradients and the optimizer's state (AdamW two
moments, Lion one), plus the activations autograd keeps for the backward pass at the batch and
length (per layer a few ``d_model``-wide tensors, the query/key/value projections, the MLP's
hidden units and, per head, the ``T x T`` logits and attention weights), plus the output logits.
It errs high rather than low; real peaks with fused kernels are lower.
"""

from __future__ import annotations

from arch.config import ArchConfig
from arch.params import param_count

FLOAT = 4  # bytes
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
