"""RoRoPE students (``workers.compression.rorope``): the change of basis across key heads
within each RoPE pair is exact when every mixed plane is kept (the student equals its teacher's
logits, in our model and through ``transformers`` with its absorbed decode), the bases are
orthogonal with their energies sorted, and a cut student caches its latent and one shared RoPE
key per group, what ``LayerSpec.kv_width`` says."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arch import ArchConfig, HeadGroup, LayerSpec
from workers.compression.rorope import plane_bases, rorope_student, strongest_planes
from workers.models import Model, build_model

GROUP = HeadGroup(4, 8, 6, 2)  # 4 query heads of 8 reading 2 key/value heads


def teacher(bias: bool = False) -> Model:
    """A small GQA RoPE model with random (non-standard) weights and biases."""
    layer = LayerSpec("mhsa", (GROUP,), mlp_ratio=2.0)
    arch = ArchConfig(d_model=16, layers=(layer, layer), max_seq_len=24, vocab_size=23,
                      positional="rope", norm="rmsnorm", mlp="swiglu", qkv_bias=bias,
                      rope_theta=100.0)
    torch.manual_seed(0)
    model = build_model(arch)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(std=0.3)
    return model.eval()


# longer than ABSORB_MAX_TOKENS: one pass rebuilds keys and values, one token at a time absorbs
IDS = torch.randint(0, 23, (2, 20), generator=torch.Generator().manual_seed(4))


@pytest.mark.parametrize(("bias", "balance"), [(False, False), (True, True)])
def test_keeping_every_plane_is_exact(bias: bool, balance: bool) -> None:
    """Every mixed plane kept (``rope_dim = kv * qk``) and a latent as wide as the values: the
    student's logits are the teacher's (with the keys balanced against the values too)."""
    model = teacher(bias)
    full = GROUP.kv_heads * GROUP.qk_dim
    student = rorope_student(model, [full, full], [GROUP.kv_heads * GROUP.v_dim] * 2,
                             balance=balance)
    assert student.arch.layers[0].rope_shared and student.arch.layers[0].rope_dim == full
    with torch.no_grad():
        torch.testing.assert_close(student(IDS), model(IDS), atol=1e-4, rtol=1e-4)


def test_the_exact_student_decodes_absorbed_through_transformers(tmp_path: Path,
                                                                 remote_code_cache: Path) -> None:
    """The same exact student saved as a folder: ``transformers`` gives the teacher's logits in
    one pass (keys and values rebuilt), and token by token from its cache (the absorbed decode,
    one shared RoPE key)."""
    from transformers import AutoModelForCausalLM
    from transformers.cache_utils import DynamicCache

    from workers.hf.export import save_student

    model = teacher(bias=True)
    full = GROUP.kv_heads * GROUP.qk_dim
    save_student(rorope_student(model, [full, full], [12, 12]), tmp_path / "student")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "student", trust_remote_code=True)
    with torch.no_grad():
        want = model(IDS)
        torch.testing.assert_close(loaded(IDS).logits, want, atol=1e-4, rtol=1e-4)
        cache = DynamicCache(config=loaded.config)
        steps = [loaded(IDS[:, :4], past_key_values=cache, use_cache=True).logits]
        steps += [loaded(IDS[:, i:i + 1], past_key_values=cache, use_cache=True).logits
                  for i in range(4, IDS.shape[1])]
    torch.testing.assert_close(torch.cat(steps, dim=1), want, atol=1e-4, rtol=1e-4)


def test_a_cut_student_caches_its_latent_and_one_shared_rope_key() -> None:
    model = teacher()
    student = rorope_student(model, [4, 6], [5, 7])
    x = torch.randn(1, 3, 16)
    for i, (r, c) in enumerate([(4, 5), (6, 7)]):
        layer = student.arch.layers[i]
        assert layer.kv_width == c + r < model.arch.layers[i].kv_width
        assert student.block(i).attn.cached(x).shape[-1] == layer.kv_width
        assert layer.heads == (HeadGroup(4, 8 + r, 6, 2),)


def test_plane_bases_are_orthogonal_and_put_the_energy_first() -> None:
    keys = torch.randn(3, 8, 5, dtype=torch.float64)
    inputs = torch.randn(5, 5, dtype=torch.float64)
    inputs = inputs @ inputs.T
    bases, energies = plane_bases(keys, inputs)
    assert bases.shape == (4, 3, 3) and energies.shape == (4, 3)
    eye = torch.eye(3, dtype=torch.float64).expand(4, 3, 3)
    torch.testing.assert_close(bases @ bases.transpose(1, 2), eye)
    assert torch.all(energies[:, :-1] >= energies[:, 1:])
    for f in range(4):  # the energies split each pair's total: its planes' trace
        rows = keys[:, [f, f + 4]]
        total = torch.einsum("hid,de,hie->", rows, inputs, rows)
        torch.testing.assert_close(energies[f].sum(), total)
    planes = strongest_planes(energies, 3)
    assert len(planes) == 3 and planes == sorted(planes)
    kept = sum(float(energies[f, e]) for f, e in planes)
    assert kept == pytest.approx(float(energies.flatten().sort(descending=True).values[:3].sum()))


def test_the_second_order_fit_is_exact_at_full_rank_and_prices_every_width() -> None:
    """With the loss gradient's moment at the keys and values (``grads``), the latent is fitted
    to second order: exact at full rank, and ``rorope_spectra`` gives one singular value per
    row of the remainder and values, largest first."""
    from workers.compression.rorope import rorope_spectra

    model = teacher()
    g = torch.Generator().manual_seed(5)
    d, rows = 16, GROUP.kv_heads * (GROUP.qk_dim + GROUP.v_dim)
    inputs = {i: (lambda a: a @ a.T / d)(torch.randn(d, 3 * d, generator=g, dtype=torch.float64))
              for i in range(2)}
    grads = {i: (lambda a: a @ a.T / rows)(torch.randn(rows, rows, generator=g,
                                                       dtype=torch.float64)) for i in range(2)}
    full = GROUP.kv_heads * GROUP.qk_dim
    student = rorope_student(model, [full, full], [16, 16], inputs, grads=grads)
    with torch.no_grad():
        torch.testing.assert_close(student(IDS), model(IDS), atol=1e-3, rtol=1e-3)
    spectra = rorope_spectra(model, [4, 4], inputs, grads)
    assert set(spectra) == {0, 1}
    for s in spectra.values():
        assert s.shape == (min(d, rows),) and torch.all(s[:-1] >= s[1:])
