"""Small random Llama-family models written by ``transformers`` itself (nothing downloaded),
shared by the tests of reading, profiling and compressing them: ``build(kind, **overrides)``,
``saved`` as a folder, the ``CASES`` every family is checked on, ``ids`` to feed them and a
``token_folder`` of random tokens below their vocabulary. Importing this module skips the test
module without ``transformers``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

VOCAB, SEQ = 97, 24
SMALL = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64}


def build(kind: str, **overrides: Any) -> Any:
    """A random ``transformers`` model of family ``kind``, its norms and biases perturbed so that
    every tensor shows in the logits."""
    config_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                  "mistral": transformers.MistralConfig}[kind]
    model_cls = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
                 "mistral": transformers.MistralForCausalLM}[kind]
    torch.manual_seed(0)
    model = model_cls(config_cls(**{**SMALL, **overrides}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.3 if "norm" in name or "bias" in name else 0.02))
    return model.eval()


def ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))


def token_folder(folder: Path) -> Path:
    """nanoGPT-style ``train.bin`` / ``val.bin`` of random tokens below ``VOCAB``."""
    tokens = np.random.default_rng(0).integers(0, VOCAB, 30_000, dtype=np.uint16)
    folder.mkdir()
    tokens[:25_000].tofile(folder / "train.bin")
    tokens[25_000:].tofile(folder / "val.bin")
    return folder


def saved(model: Any, folder: Path, **kwargs: Any) -> Path:
    model.save_pretrained(folder, **kwargs)
    return folder


CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {"num_key_value_heads": 4}),
    "llama-gqa": ("llama", {"num_key_value_heads": 2, "rope_theta": 500.0}),
    "llama-tied-head-dim": ("llama", {"num_key_value_heads": 1, "head_dim": 8,
                                      "tie_word_embeddings": True}),
    "qwen2": ("qwen2", {"num_key_value_heads": 2}),
    "mistral": ("mistral", {"num_key_value_heads": 2, "sliding_window": None}),
    # Llama 3.1's frequencies: a short original context puts pairs in all three bands
    "llama3-rope": ("llama", {"num_key_value_heads": 2, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}),
    "linear-rope": ("llama", {"num_key_value_heads": 2, "rope_parameters": {
        "rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}}),
}
