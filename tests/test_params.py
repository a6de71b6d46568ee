"""Analytic parameter counts: hand-computed cases, the relations between kinds, and every count
equal to the built modules'."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings

from arch import ArchConfig, HeadGroup, LayerSpec, ParamCount, attention_params, param_count
from arch.params import io_params, layer_params
from tests.helpers.strategies import arch_configs
from workers.models.model import build_model, count_params

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


@settings(max_examples=60, deadline=None)
@given(arch_configs())
def test_every_count_is_the_built_modules(arch: ArchConfig) -> None:
    """Each layer's analytic count is its built block's, the rest is the input/output's, and
    freezing the MLPs moves exactly their built parameters out of the trainable ones."""
    model = build_model(arch)
    count = param_count(arch)
    assert count_params(model) == (count.trainable, count.total)
    for i in range(arch.n_layers):
        assert count_params(model.block(i)) == (layer_params(arch, i).trainable,
                                                 layer_params(arch, i).total)
    blocks = [count_params(model.block(i)) for i in range(arch.n_layers)]
    outside = (count.trainable - sum(t for t, _ in blocks), count.total - sum(n for _, n in blocks))
    assert (io_params(arch).trainable, io_params(arch).total) == outside
    frozen = replace(arch, layers=tuple(replace(layer, freeze_mlp=layer.mlp_ratio > 0)
                                        for layer in arch.layers))
    trainable_mlps = sum(p.numel() for i in range(arch.n_layers)
                         for name, p in model.block(i).named_parameters()
                         if name.startswith("mlp.") and p.requires_grad)
    assert count_params(build_model(frozen)) == (param_count(frozen).trainable,
                                                 param_count(frozen).total)
    assert param_count(frozen) == replace(count, trainable=count.trainable - trainable_mlps)
