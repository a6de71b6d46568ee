"""The model an ``ArchConfig`` describes: attention kinds, latent attention,
``build_model``. The public names are those of ``__all__``, imported from here by the top floor
(``experiments/``, ``bench/``); the runtime's own subpackages import the modules directly."""

from workers.models.attention import (
    LogitRecorder,
    MultiHeadAttention,
    SubspaceAttention,
    future_mask,
)
from workers.models.model import Block, Model, build_model, count_params

__all__ = ["Block", "LogitRecorder", "Model", "MultiHeadAttention", "SubspaceAttention",
           "build_model", "count_params", "future_mask"]
