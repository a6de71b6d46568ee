"""Latent attention (workers.models.latent) and latent students
(workers.compression.latent_students): what a decoder caches equals the vocabulary's count, a
student at full rank is its teacher (through ``transformers`` too), the latent is the weighted
SVD's best, and the vocabulary refuses what the layer cannot be."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from alloc.compression import CompressionError
from arch import ArchConfig, ConfigError, HeadGroup, LayerSpec, param_count
from workers.compression.latent_students import latent_arch, latent_factors, latent_student
from workers.hf.export import save_student
from workers.models.latent import LatentAttention
from workers.models.model import Model, build_model, count_params

pytestmark = pytest.mark.usefixtures("remote_code_cache")


def teacher_arch(**fields: Any) -> ArchConfig:
    """A Llama/Qwen2-like teacher: RoPE, RMSNorm, SwiGLU, grouped keys, two head groups."""
    layer = LayerSpec("mhsa", (HeadGroup(4, 8, 6, 2), HeadGroup(2, 8, 4, 1)), mlp_ratio=2.0)
    return ArchConfig(d_model=32, layers=(layer, layer), max_seq_len=16, vocab_size=41,
                      positional="rope", norm="rmsnorm", mlp="swiglu", **fields)


def trained_like(arch: ArchConfig) -> Model:
    """Weights far from their init (so a wrong row order or frequency shows in the logits) and
    RoPE frequencies that differ per key/value head."""
    torch.manual_seed(0)
    model = build_model(arch).eval()
    with torch.no_grad():
        for name, value in model.named_parameters():
            value.copy_(torch.randn_like(value) * (0.2 if "norm" not in name else 1.0))
        for name, buffer in model.named_buffers():
            if "inv_freq" in name:
                buffer.copy_(torch.rand_like(buffer) + 0.05)
    return model


def ids(arch: ArchConfig) -> torch.Tensor:
    return torch.randint(0, arch.vocab_size or 1, (2, arch.max_seq_len),
                         generator=torch.Generator().manual_seed(1))


def stacked_rows(arch: ArchConfig, rope_dim: int) -> int:
    """Rows the latent rebuilds per layer: every key head's latent part and every value."""
    layer = arch.layers[0]
    return sum(g.kv_heads * (g.qk_dim - rope_dim + g.v_dim) for g in layer.heads)


@pytest.mark.parametrize(("rope_dim", "rotate"), [(0, True), (8, False), (4, True)])
@pytest.mark.parametrize("bias", [False, True])
def test_a_full_rank_latent_student_is_its_teacher(rope_dim: int, rotate: bool, bias: bool,
                                                   tmp_path: Path) -> None:
    """Every RoPE pair kept (as decoupled keys, in a turned latent part, or some of each):
    the student's logits are the teacher's, ours and through ``transformers``'
    ``trust_remote_code`` (1e-5), with what it caches per token what the modules hold."""
    arch = teacher_arch(qkv_bias=bias)
    teacher = trained_like(arch)
    full = min(arch.d_model, stacked_rows(arch, rope_dim))
    student_arch = latent_arch(arch, [full] * arch.n_layers, rope_dim, rotate)
    orders = {(i, j, h): tuple(reversed(range(4))) for i in range(2) for j in range(2)
              for h in range(2)}  # the slowest pairs first: a ranking, not the identity
    student = latent_student(teacher, student_arch, orders)
    x = ids(arch)
    with torch.no_grad():
        expected = teacher(x)
        torch.testing.assert_close(student(x), expected, atol=1e-5, rtol=1e-5)
        save_student(student, tmp_path / "student")
        loaded: Any = AutoModelForCausalLM.from_pretrained(tmp_path / "student",
                                                           trust_remote_code=True)
        loaded.eval()
        torch.testing.assert_close(loaded(x).logits, expected, atol=1e-5, rtol=1e-5)
    counted = param_count(student_arch)
    assert count_params(student) == (counted.trainable, counted.total)
    for i, block in enumerate(student.blocks):
        attn = block.attn
        assert isinstance(attn, LatentAttention)
        rope_units = 0 if attn.k_rope is None else attn.k_rope.out_features
        assert attn.down.out_features + rope_units == student_arch.layers[i].kv_width


def test_a_teacher_without_rope_and_odd_head_dims_is_kept_at_full_rank() -> None:
    layer = LayerSpec("mhsa", (HeadGroup(2, 5, 3), HeadGroup(2, 3, 4, 1)), mlp_ratio=1.0)
    arch = ArchConfig(d_model=24, layers=(layer,), max_seq_len=8, vocab_size=11, bias=True)
    teacher = trained_like(arch)
    rows = 2 * (5 + 3) + 1 * (3 + 4)
    student = latent_student(teacher, latent_arch(arch, [rows], 0))
    x = ids(arch)
    with torch.no_grad():
        torch.testing.assert_close(student(x), teacher(x), atol=1e-5, rtol=1e-5)


def test_the_kept_pairs_are_the_rankings_leaders_with_their_frequencies() -> None:
    arch = teacher_arch()
    teacher = trained_like(arch)
    orders = {(0, 0, 1): (3, 1, 0, 2)}
    student = latent_student(teacher, latent_arch(arch, [20, 20], 4), orders)
    freqs = teacher.state_dict()["blocks.0.attn.inv_freq0"]
    kept = student.state_dict()["blocks.0.attn.inv_freq0"]
    assert torch.equal(kept[1], freqs[1][[3, 1]])  # the ranking's two leaders, in its order
    assert torch.equal(kept[0], freqs[0][[0, 1]])  # no ranking: the fastest pairs
    # the cache per token: the latent, and each key/value head's 4 RoPE dims
    assert student.arch.layers[0].kv_width == 20 + 3 * 4


def test_the_latent_is_the_best_of_its_rank_in_the_weighted_norm() -> None:
    """Eckart-Young in the input-weighted norm: the error of ``up @ down`` weighted by the
    inputs' RMS is the tail of the weighted singular values, and no other rank-r factor pair
    (here: the unweighted SVD's) does better."""
    torch.manual_seed(3)
    rows = torch.randn(24, 16, dtype=torch.float64)
    scale = torch.rand(16, dtype=torch.float64) * 3 + 0.1
    sv = torch.linalg.svdvals(rows * scale)
    for rank in (1, 5, 12, 16, 20):
        up, down = latent_factors(rows, scale, rank)
        assert up.shape == (24, rank) and down.shape == (rank, 16)
        error = torch.linalg.norm((up @ down - rows) * scale)
        torch.testing.assert_close(error, sv[rank:].square().sum().sqrt(), atol=1e-9, rtol=1e-9)
        plain_up, plain_down = latent_factors(rows, None, rank)
        assert error <= torch.linalg.norm((plain_up @ plain_down - rows) * scale) + 1e-9


def test_a_latent_layer_trains() -> None:
    """Gradients reach every map, the latent included, and a few steps lower the loss."""
    arch = latent_arch(teacher_arch(), [12, 12], 4)
    model = build_model(arch)
    x = ids(arch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses: list[float] = []
    for _ in range(20):
        loss = torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1),
                                                 x[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        if not losses:
            assert all(p.grad is not None and p.grad.abs().sum() > 0
                       for p in model.parameters())
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_latent_students_come_from_mhsa_teachers_only() -> None:
    arch = teacher_arch()
    frozen = ArchConfig.from_dict({**arch.to_dict(), "layers": [
        {**arch.layers[0].to_dict(), "attention": "frozen_qk"}, arch.layers[1].to_dict()]})
    with pytest.raises(CompressionError, match=r"layers\[0\]\.attention = 'frozen_qk'"):
        latent_arch(frozen, [8, 8], 0)
    with pytest.raises(CompressionError, match="1 values for 2 layers"):
        latent_arch(arch, [8], 0)


@pytest.mark.parametrize(("fields", "message"), [
    ({"attention": "latent"}, "latent_dim = 0: must be an integer between 1"),
    ({"attention": "latent", "latent_dim": 8, "rope_dim": 3}, "rope_dim = 3: must be even"),
    ({"attention": "latent", "latent_dim": 8, "rope_dim": 10},
     "rope_dim = 10: must not exceed heads\\[0\\]'s qk_dim = 8"),
    ({"attention": "mhsa", "latent_dim": 8}, "latent_dim = 8: only for latent layers"),
    ({"attention": "mhsa", "rotate_latent": True}, "rotate_latent = True: only for latent"),
    ({"attention": "latent", "latent_dim": 2 ** 20}, "latent_dim = 1048576: must be an integer"),
])
def test_the_vocabulary_refuses_what_a_latent_layer_cannot_be(fields: dict[str, Any],
                                                             message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LayerSpec.from_dict({"heads": ["4x8"], **fields})


def test_rope_parts_need_rope_and_older_layers_keep_their_ids() -> None:
    layer = LayerSpec("latent", (HeadGroup(4, 8),), latent_dim=8, rope_dim=4)
    with pytest.raises(ConfigError, match=r"layers\[0\]\.rope_dim = 4: needs positional: rope"):
        ArchConfig(d_model=16, layers=(layer,), max_seq_len=8, vocab_size=5)
    plain = LayerSpec("mhsa", (HeadGroup(4, 8),))
    assert set(plain.to_dict()) == {"attention", "heads", "mlp_ratio", "role", "freeze_mlp",
                                    "eta", "tied_output"}  # the canonical form before latents
    arch = ArchConfig(d_model=16, layers=(layer,), max_seq_len=8, vocab_size=5,
                      positional="rope")
    assert ArchConfig.from_yaml(arch.to_yaml()) == arch
    assert arch.describe() == "latent 4x8 c8 rope4"
