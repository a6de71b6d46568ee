"""Analytic parameter counts: hand-computed cases and the relations between kinds."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings

from arch import ArchConfig, HeadGroup, LayerSpec, ParamCount, attention_params, param_count
from arch.params import io_params, layer_params
from tests.conftest import arch_configs

D = 32
GROUPS = (HeadGroup(2, 8, 16), HeadGroup(3, 4))


def test_hand_computed_mhsa_model() -> None:
    arch = ArchConfig(d_model=D, input_dim=5, output_dim=3, max_seq_len=10, norm="layernorm",
                      layers=(LayerSpec("mhsa", GROUPS, mlp_ratio=2),))
    qk = D * (2 * 8 + 3 * 4)  # one of W_Q, W_K
    v = D * (2 * 16 + 3 * 4)  # one of W_V, W_O
    attention = 2 * qk + 2 * v
    mlp = 2 * D * (2 * D)
    norms = 2 * (2 * D) + 2 * D  # two block norms + final norm, weight and bias each
    io = 5 * D + D * 3 + 10 * D  # in, out, learned positions
    assert param_count(arch).total == param_count(arch).trainable == attention + mlp + norms + io


def test_hand_computed_token_model_with_tied_embeddings() -> None:
    layer = LayerSpec("mixit", (HeadGroup(4, 8),))
    arch = ArchConfig(d_model=D, vocab_size=11, max_seq_len=7, tie_embeddings=True,
                      positional="sinusoidal", norm="rmsnorm", layers=(layer, layer))
    per_layer = 2 * D * 32 + D  # V and O; one RMSNorm (no MLP)
    total = 2 * per_layer + 11 * D + D  # + shared embedding/head, final norm
    assert param_count(arch) == ParamCount(total, total)


def test_kind_relations() -> None:
    mhsa = attention_params(LayerSpec("mhsa", GROUPS), D)
    frozen = attention_params(LayerSpec("frozen_qk", GROUPS), D)
    qk = D * (2 * 8 + 3 * 4)
    assert frozen.total == mhsa.total and frozen.trainable == mhsa.total - 2 * qk
    single = (HeadGroup(2, 8), HeadGroup(3, 4))
    width = 2 * 8 + 3 * 4
    untied = attention_params(LayerSpec("mssa", single), D)
    tied = attention_params(LayerSpec("mssa", single, tied_output=True), D)
    assert untied.total == 2 * D * width and tied.total == D * width
    mixit = attention_params(LayerSpec("mixit", single), D)
    assert mixit == ParamCount(2 * D * width, 2 * D * width)


@settings(max_examples=100, deadline=None)
@given(arch_configs())
def test_totals_add_up_and_freezing_moves_params_out_of_trainable(arch: ArchConfig) -> None:
    total = param_count(arch)
    parts = io_params(arch)
    for i in range(arch.n_layers):
        parts += layer_params(arch, i)
    assert total == parts
    assert 0 <= total.trainable <= total.total
    frozen_mlp = replace(arch, layers=tuple(
        replace(layer, freeze_mlp=layer.mlp_ratio > 0) for layer in arch.layers))
    all_mlps = sum(_mlp_size(arch, layer) for layer in arch.layers)
    assert param_count(frozen_mlp).total == total.total
    assert param_count(frozen_mlp).frozen == (total.frozen + all_mlps - sum(
        _mlp_size(arch, layer) for layer in arch.layers if layer.freeze_mlp))


def _mlp_size(arch: ArchConfig, layer: LayerSpec) -> int:
    """By hand: d -> h (two of them gated) -> d, each map with a bias if the model has them."""
    h, d, b = arch.mlp_hidden(layer), arch.d_model, int(arch.bias)
    if h == 0:
        return 0
    up = 2 * h if arch.mlp == "swiglu" else h
    return (d + b) * up + (h + b) * d
