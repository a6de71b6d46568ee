"""workers.models.attention: MixiT properties, RoPE, and the theory checks of docs/theory.md §7."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import Tensor

from arch import ATTENTION_KINDS, KINDS, ArchConfig, HeadGroup, LayerSpec
from workers.models.attention import (
    LogitRecorder,
    MixiTAttention,
    MultiHeadAttention,
    SubspaceAttention,
    mixing_matrix,
    rope_frequencies,
    rotate,
    thresholded_softmax,
)
from workers.models.kinds import ATTENTION, make_attention
from workers.models.model import Block


def single_layer(kind: str, d: int, heads: tuple[HeadGroup, ...], t: int, causal: bool = True,
                 **layer: object) -> ArchConfig:
    spec = LayerSpec(kind, heads, **layer)  # type: ignore[arg-type]
    return ArchConfig(d_model=d, layers=(spec,), max_seq_len=t, causal=causal, input_dim=d)


@pytest.mark.parametrize("causal", [True, False])
def test_mixit_rows_sum_to_one_and_causal_rows_ignore_the_future(causal: bool) -> None:
    mix = mixing_matrix(4, 32, 8, causal, torch.Generator().manual_seed(0))
    torch.testing.assert_close(mix.sum(-1), torch.ones(4, 32))
    if causal:
        assert torch.equal(mix.triu(1), torch.zeros_like(mix))
    attn = MixiTAttention(single_layer("mixit", 16, (HeadGroup(2, 8),), 32, causal), (
        LayerSpec("mixit", (HeadGroup(2, 8),))), 0)
    for t in (32, 9):
        torch.testing.assert_close(attn.mixing(0, t).sum(-1), torch.ones(2, t))


def test_mixit_ignores_query_key_content() -> None:
    # The mixing does not depend on the input: the attention is a linear map of x.
    arch = single_layer("mixit", 16, (HeadGroup(2, 8), HeadGroup(1, 4)), 10)
    attn = make_attention(arch, arch.layers[0], 0)
    x1, x2 = torch.randn(3, 10, 16), torch.randn(3, 10, 16)
    torch.testing.assert_close(attn(x1 + 2 * x2), attn(x1) + 2 * attn(x2), rtol=1e-5, atol=1e-5)
    softmax = make_attention(single_layer("mhsa", 16, (HeadGroup(2, 8),), 10),
                             LayerSpec("mhsa", (HeadGroup(2, 8),)), 0)
    for p in softmax.parameters():
        torch.nn.init.normal_(p, std=0.5)
    assert not torch.allclose(softmax(x1 + 2 * x2), softmax(x1) + 2 * softmax(x2), atol=1e-3)


def test_mixit_matrix_is_reproducible_from_the_seed() -> None:
    arch = single_layer("mixit", 16, (HeadGroup(2, 8),), 10)
    a = MixiTAttention(arch, arch.layers[0], 3)
    b = MixiTAttention(arch, arch.layers[0], 3)
    c = MixiTAttention(arch, arch.layers[0], 4)
    assert torch.equal(a.mix0, b.mix0) and not torch.equal(a.mix0, c.mix0)
    w = mixing_matrix(64, 256, 8, False, torch.Generator().manual_seed(1)) - torch.eye(256)
    # Entries of W have std 1/sqrt(width * T) (variance preserving), up to the row centring.
    assert abs(w.std().item() - 1 / math.sqrt(8 * 256)) < 0.01 / math.sqrt(8 * 256)


def test_rope_depends_only_on_relative_position() -> None:
    freqs = rope_frequencies(8, 10000.0)[None]
    q, k = torch.randn(8), torch.randn(8)

    def at(v: Tensor, pos: int) -> Tensor:
        x = torch.zeros(1, 1, 64, 8)
        x[0, 0, pos] = v
        return rotate(x, freqs)[0, 0, pos]

    torch.testing.assert_close(at(q, 10) @ at(k, 3), at(q, 40) @ at(k, 33), rtol=1e-4, atol=1e-5)


def test_registry_lists_choices() -> None:
    assert set(ATTENTION) == set(ATTENTION_KINDS)
    assert tuple(KINDS) == ATTENTION_KINDS  # the table: one row per kind, in order
    arch = single_layer("mhsa", 16, (HeadGroup(2, 8),), 10)
    bogus = LayerSpec.__new__(LayerSpec)
    object.__setattr__(bogus, "attention", "linear")
    with pytest.raises(ValueError, match="unknown attention 'linear'; choices: mhsa"):
        make_attention(arch, bogus, 0)


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_kinds_table_says_what_each_module_has(kind: str) -> None:
    """``arch.KINDS``' row of each kind against its built module: logits from queries and
    keys exactly where it says so, frozen maps where it says so, a latent where it says so."""
    traits = KINDS[kind]
    latent = {"latent_dim": 4} if traits.latent else {}
    arch = single_layer(kind, 16, (HeadGroup(2, 8),), 5, **latent)
    recorder = LogitRecorder()
    attn = make_attention(arch, arch.layers[0], 0, recorder)
    attn(torch.randn(1, 5, 16))
    assert bool(recorder.logits) == traits.queries_keys
    assert any(not p.requires_grad for p in attn.parameters()) == traits.frozen_qk
    assert hasattr(attn, "down") == traits.latent
    assert isinstance(attn, MultiHeadAttention) == (traits.projections == "qkv")
    assert isinstance(attn, SubspaceAttention) == (traits.projections == "shared")


# --- Theory checks (docs/theory.md §7) ------------------------------------------------------------


def mixture_of_low_rank_gaussians(k: int, p: int, n_per: int, delta: float,
                                  g: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """The mixture of low-rank Gaussians (docs/theory.md §7), orthogonal subspaces: tokens
    (N, d), bases (k, d, p), labels."""
    d = k * p
    basis, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    u = basis.T.reshape(k, p, d).transpose(1, 2)  # (k, d, p), orthonormal columns
    tokens, labels = [], []
    for c in range(k):
        signal = torch.randn(n_per, p, generator=g, dtype=torch.float64) @ u[c].T
        noise = sum(delta * torch.randn(n_per, p, generator=g, dtype=torch.float64) @ u[j].T
                    for j in range(k) if j != c)
        tokens.append(signal + noise)
        labels += [c] * n_per
    return torch.cat(tokens), u, torch.tensor(labels)


def snr(z: Tensor, u: Tensor, labels: Tensor) -> Tensor:
    """Per cluster ||U_k U_k^T Z_k||_F / ||(I - U_k U_k^T) Z_k||_F (docs/theory.md §7)."""
    out = []
    for c in range(u.shape[0]):
        zc = z[labels == c]
        inside = zc @ u[c] @ u[c].T
        out.append(inside.norm() / (zc - inside).norm())
    return torch.stack(out)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("k", "p", "n_per", "delta", "eta", "layers"), [
    (3, 32, 20, 0.2, 0.5, 1), (3, 32, 20, 0.1, 0.5, 3), (3, 64, 64, 0.1, 0.5, 3),
    (3, 64, 128, 0.05, 1.0, 3)])
def test_mssa_step_multiplies_snr_by_one_plus_eta_tau(seed: int, k: int, p: int, n_per: int,
                                                      delta: float, eta: float,
                                                      layers: int) -> None:
    """Exact (to 1e-9) for ``layers`` steps. Deeper, the grown signal lets a noise token's
    softmax pass tau on one signal token and the rate drops (measured: from step 2 at
    delta 0.2, from step 4 at delta <= 0.1): the theorem's "sufficiently large N" grows with
    depth."""
    tau = 0.75
    n = k * n_per
    assert 0.5 < tau < 1 / (1 + n * math.exp(-9 * p / 32))  # the theorem's range for tau
    g = torch.Generator().manual_seed(seed)
    z, u, labels = mixture_of_low_rank_gaussians(k, p, n_per, delta, g)
    arch = single_layer("mssa", k * p, (HeadGroup(k, p),), n, causal=False, tied_output=True,
                        eta=eta)
    attn = SubspaceAttention(arch, arch.layers[0], 0,
                             attention_fn=thresholded_softmax(tau)).double()
    with torch.no_grad():
        attn.basis.weight.copy_(torch.cat(list(u), dim=1).T)  # [U_1 .. U_K]^T
    x = z[None]
    before = snr(x[0], u, labels)
    for _ in range(layers):  # Z <- Z + eta * MSSA(Z), no norm (the theorem's update)
        x = x + arch.layers[0].eta * attn(x).detach()
        after = snr(x[0], u, labels)
        torch.testing.assert_close(after / before, torch.full((k,), 1 + eta * tau,
                                                              dtype=torch.float64),
                                   rtol=1e-9, atol=0)
        before = after


def token_rank_residual(x: Tensor) -> float:
    """||X - 1 mean^T||_F / ||X||_F: zero iff every token is the same (rank one)."""
    return ((x - x.mean(dim=1, keepdim=True)).norm() / x.norm()).item()


def test_attention_without_skip_collapses_rank_and_skip_keeps_it() -> None:
    torch.manual_seed(0)
    arch = single_layer("mhsa", 32, (HeadGroup(4, 8),), 16, causal=False)
    depth = 12
    blocks = [Block(arch, 0) for _ in range(depth)]
    for block in blocks:  # O(1) logits so the attention is far from uniform
        for param in block.attn.parameters():
            torch.nn.init.normal_(param, std=1 / math.sqrt(32))
    x = torch.randn(4, 16, 32)
    pure, skip = x, x
    start = token_rank_residual(x)
    with torch.no_grad():
        for block in blocks:
            attn = block.attn
            assert isinstance(attn, MultiHeadAttention)
            pure = attn(pure)  # stacked attention, no skip (seed 004: collapses)
            skip = block(skip)  # AoT layer: x + Attn(Norm(x))
    # Measured over seeds 0-4: pure ~1e-7, skip 0.37-0.49 of a start of ~0.97.
    assert token_rank_residual(pure) < 1e-4 * start
    assert token_rank_residual(skip) > 0.2 * start


@pytest.mark.parametrize("bound", [0.5, 1.0, 2.0])
def test_softmax_jacobian_norm_respects_bound_and_falls_with_n(bound: float) -> None:
    g = torch.Generator().manual_seed(0)
    means = []
    for n in (16, 64, 256):
        norms = []
        for _ in range(8):
            z = (torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1) * bound
            jac = torch.func.jacrev(lambda v: torch.softmax(v, dim=-1))(z)
            norms.append(torch.linalg.matrix_norm(jac, ord=2).item())
        assert max(norms) <= 2 * math.exp(2 * bound) / n
        means.append(sum(norms) / len(norms))
    assert means[0] > means[1] > means[2]


@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_grouped_query_attention_is_mhsa_with_shared_key_value_heads(positional: str) -> None:
    """8 query heads reading 2 key/value heads compute what 8 full heads compute when each
    consecutive block of 4 query heads has copies of one key/value head; SDPA's
    grouped path and an attention function that sees every head agree."""
    grouped = HeadGroup(8, 4, 6, kv_heads=2)
    layer = LayerSpec("mhsa", (grouped, HeadGroup(2, 8)))
    arch = ArchConfig(d_model=16, layers=(layer,), max_seq_len=12, input_dim=16,
                      positional=positional, qkv_bias=True)  # type: ignore[arg-type]
    gqa = MultiHeadAttention(arch, layer, 0)
    full_layer = LayerSpec("mhsa", (HeadGroup(8, 4, 6), HeadGroup(2, 8)))
    full = MultiHeadAttention(replace(arch, layers=(full_layer,)), full_layer, 0)
    w, b = gqa.qkv.weight.detach(), gqa.qkv.bias.detach()  # rows: q 48 | k 8 + 16 | v 12 + 16

    def expand(rows: torch.Tensor) -> torch.Tensor:
        q, k, v = rows.split([48, 24, 28])
        k_g, k_rest = k.split([8, 16])
        v_g, v_rest = v.split([12, 16])
        return torch.cat([q, k_g.unflatten(0, (2, 4)).repeat_interleave(4, 0).flatten(0, 1),
                          k_rest, v_g.unflatten(0, (2, 6)).repeat_interleave(4, 0).flatten(0, 1),
                          v_rest])

    with torch.no_grad():
        full.qkv.weight.copy_(expand(w))
        full.qkv.bias.copy_(expand(b))
        full.out.load_state_dict(gqa.out.state_dict())
    x = torch.randn(3, 12, 16)
    torch.testing.assert_close(gqa(x), full(x), atol=1e-6, rtol=1e-5)
    gqa.attention_fn = LogitRecorder()
    torch.testing.assert_close(gqa(x), full(x), atol=1e-6, rtol=1e-5)


def test_a_rope_checkpoint_written_before_saved_frequencies_loads_with_the_standard_ones(
) -> None:
    """RoPE frequencies are saved buffers now; a state dict without them (an older checkpoint)
    still loads strictly and computes with RoPE's standard frequencies."""
    from workers.models.model import build_model

    layer = LayerSpec("mhsa", (HeadGroup(4, 8, kv_heads=2),))
    arch = ArchConfig(d_model=16, layers=(layer,), max_seq_len=12, vocab_size=11,
                      positional="rope", rope_theta=500.0)
    model = build_model(arch).eval()
    old = {k: v for k, v in model.state_dict().items() if "inv_freq" not in k}
    assert len(old) < len(model.state_dict())
    fresh = build_model(arch)
    with torch.no_grad():
        fresh.block(0).attn.frequencies(0).mul_(3.0)  # not the standard ones before loading
    fresh.load_state_dict(old)  # strict: the missing buffers are filled, not reported
    x = torch.randint(0, 11, (2, 12))
    torch.testing.assert_close(fresh.eval()(x), model(x))
    torch.testing.assert_close(fresh.block(0).attn.frequencies(0),
                               rope_frequencies(8, 500.0).expand(2, -1))


def test_the_fused_layout_is_what_the_projection_computes() -> None:
    """``QKVLayout`` states the fused rows once: ``split`` then ``fuse`` is the identity, its row
    slices are ``split``'s blocks, and the module's projection computes each query head from its
    query rows and each key/value head from its key and value rows."""
    layer = LayerSpec("mhsa", (HeadGroup(4, 8, 6, kv_heads=2), HeadGroup(2, 4, 4)))
    arch = ArchConfig(d_model=16, layers=(layer,), max_seq_len=8, input_dim=16, qkv_bias=True)
    attn = MultiHeadAttention(arch, layer, 0)
    layout = attn.layout
    w, b = attn.qkv.weight.detach(), attn.qkv.bias.detach()
    assert layout.widths == (40, 24, 20) and sum(layout.widths) == w.shape[0]
    queries, keys, values = layout.split(w)
    flat = [[x for group in block for x in group] for block in (queries, keys)]
    assert torch.equal(layout.fuse(*flat, values), w)
    x = torch.randn(2, 8, 16)
    q, k, v = attn.project(x)
    # the projections' units as the leading axis, as rows are
    q_heads, k_heads, _ = layout.split(torch.cat([q, k], -1).transpose(0, -1))
    v_rows = sum(layout.widths[:2])
    for j, g in enumerate(layer.heads):
        for h in range(g.count):
            kv = layout.kv_head(j, h)
            assert h in layout.query_heads(j, kv)
            rows, krows = layout.query_rows(j, h), layout.key_rows(j, kv)
            assert torch.equal(w[rows], queries[j][h]) and torch.equal(w[krows], keys[j][kv])
            torch.testing.assert_close(q_heads[j][h].transpose(0, -1), x @ w[rows].T + b[rows])
            torch.testing.assert_close(k_heads[j][kv].transpose(0, -1),
                                       x @ w[krows].T + b[krows])
    torch.testing.assert_close(v, x @ w[v_rows:].T + b[v_rows:])
