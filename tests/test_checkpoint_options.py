"""GPT-2 checkpoints whose ``config.json`` changes the computation in a way our model does not
implement are refused by name: for each option, ``transformers`` itself computes other logits
with it than without it (so accepting it would report another model's losses), and our loader
says which field. Broken weights name the tensor and both shapes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workers.checkpoints import CheckpointError, load

BASE = {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 32, "vocab_size": 64,
        "bos_token_id": 0, "eos_token_id": 0}
# field -> a value that changes what the model computes
CHANGES = {"scale_attn_weights": False, "scale_attn_by_inverse_layer_idx": True,
           "activation_function": "relu", "layer_norm_epsilon": 1e-2,
           "tie_word_embeddings": False}


def gpt2(folder: Path, **changes: object) -> torch.Tensor:
    """Save a random GPT-2 (same weights for every ``changes``) and return its logits, computed
    by transformers' reference (eager) attention: its SDPA path in transformers 5.0 ignores
    the attention-scaling options, which the architecture defines."""
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (pip install -e '.[test]')")
    torch.manual_seed(0)
    config = transformers.GPT2Config(**BASE, **changes, attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(config).eval()
    if not model.config.tie_word_embeddings:  # an untied head: give it its own weights
        model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.lm_head.weight))
    model.save_pretrained(folder)
    with torch.no_grad():
        return model(torch.arange(24)[None] % 64).logits


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_an_option_that_changes_the_logits_is_refused_by_name(field: str, tmp_path: Path) -> None:
    plain = gpt2(tmp_path / "plain")
    changed = gpt2(tmp_path / field, **{field: CHANGES[field]})
    assert not torch.allclose(plain, changed, atol=1e-4)  # transformers computes another model
    ours = load(tmp_path / "plain").model
    with torch.no_grad():
        assert torch.allclose(ours(torch.arange(24)[None] % 64), plain, atol=1e-4)
    with pytest.raises(CheckpointError, match=field):
        load(tmp_path / field)


def test_broken_weights_name_the_tensor_and_both_shapes(tmp_path: Path) -> None:
    import json

    gpt2(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "n_inner": 64}))
    with pytest.raises(CheckpointError, match=r"tensor 'transformer\.h\.0\.mlp\.c_fc\.weight' "
                                              r"has shape \(32, 128\), config\.json makes it "
                                              r"\(32, 64\)"):
        load(tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "n_head": 5}))
    with pytest.raises(CheckpointError, match="n_embd 32 is not a multiple of n_head 5"):
        load(tmp_path / "m")


def test_reordered_upcast_attention_is_refused_too(tmp_path: Path) -> None:
    """``reorder_and_upcast_attn`` changes the computation only in half precision (the same
    logits in float32), where our bf16 autocast would differ: refused all the same."""
    gpt2(tmp_path / "m", reorder_and_upcast_attn=True)
    with pytest.raises(CheckpointError, match="reorder_and_upcast_attn"):
        load(tmp_path / "m")
