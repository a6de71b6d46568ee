"""Long samples a few windows at a time: what holds per-window maps (attention logits and their
softmax, pair terms, output logits over a large vocabulary) is computed on chunks of windows of
at most ``CHUNK_BYTES``, so that memory does not grow with the sample or the batch."""

from __future__ import annotations

from torch import Tensor

# at most this many bytes of per-window maps at once
CHUNK_BYTES = 256 << 20


def chunk_windows(bytes_per_window: int) -> int:
    """How many windows of ``bytes_per_window`` maps fit ``CHUNK_BYTES`` (at least one)."""
    return max(1, CHUNK_BYTES // bytes_per_window)


def window_chunks(x: Tensor, bytes_per_window: int) -> list[Tensor]:
    """``x`` (B, T, ...) split into chunks of windows whose maps fit ``CHUNK_BYTES``."""
    return list(x.split(chunk_windows(bytes_per_window)))
