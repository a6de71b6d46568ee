"""Hypothesis strategies of the vocabulary: random valid head groups, layers and architectures
(every kind, grouped key/value heads, every positional and I/O form)."""

from __future__ import annotations

from hypothesis import strategies as st

from arch import ArchConfig, HeadGroup, LayerSpec

DIMS = st.sampled_from([2, 4, 8, 16, 32])


@st.composite
def head_groups(draw: st.DrawFn, single_width: bool) -> HeadGroup:
    qk = draw(DIMS)
    v = qk if single_width else draw(DIMS)
    count = draw(st.integers(1, 8))
    kv = 0 if single_width else draw(st.sampled_from([n for n in range(1, count + 1)
                                                      if count % n == 0]))
    return HeadGroup(count, qk, v, kv)


@st.composite
def latent_fields(draw: st.DrawFn, heads: tuple[HeadGroup, ...], rope: bool) -> dict[str, object]:
    """A latent layer's fields: any latent width; with RoPE, a RoPE part that fits every head
    and, when the rest of every head is whole pairs, perhaps a turned latent part."""
    fields: dict[str, object] = {"latent_dim": draw(st.integers(1, 40))}
    if rope:
        fields["rope_dim"] = draw(st.sampled_from(range(0, min(g.qk_dim for g in heads) + 1, 2)))
        fields["rotate_latent"] = draw(st.booleans())
    return fields


@st.composite
def layer_specs(draw: st.DrawFn, allow_mixit: bool = True, rope: bool = False) -> LayerSpec:
    kinds = ["mhsa", "mssa", "frozen_qk", "latent"] + (["mixit"] if allow_mixit else [])
    kind = draw(st.sampled_from(kinds))
    single = kind in ("mssa", "mixit")
    heads = tuple(draw(st.lists(head_groups(single), min_size=1, max_size=3)))
    mlp_ratio = draw(st.sampled_from([0.0, 1.0, 2.0, 4.0]))
    latent = draw(latent_fields(heads, rope)) if kind == "latent" else {}
    return LayerSpec(kind, heads, mlp_ratio=mlp_ratio,
                     role=draw(st.sampled_from(["extract", "process"])),
                     freeze_mlp=mlp_ratio > 0 and draw(st.booleans()),
                     eta=draw(st.sampled_from([0.5, 1.0, 2.0])),
                     tied_output=kind == "mssa" and draw(st.booleans()), **latent)


@st.composite
def arch_configs(draw: st.DrawFn) -> ArchConfig:
    positional = draw(st.sampled_from(["learned", "sinusoidal", "rope"]))
    rope = positional == "rope"
    layers = tuple(draw(st.lists(layer_specs(allow_mixit=not rope, rope=rope),
                                 min_size=1, max_size=4)))
    tokens = draw(st.booleans())
    io = ({"vocab_size": draw(st.integers(2, 300)), "tie_embeddings": draw(st.booleans())}
          if tokens else {"input_dim": draw(st.integers(1, 20)),
                          "output_dim": draw(st.integers(1, 20))})
    with_qk = all(layer.attention in ("mhsa", "frozen_qk", "latent") for layer in layers)
    return ArchConfig(d_model=draw(st.sampled_from([8, 16, 32, 64])), layers=layers,
                      max_seq_len=draw(st.integers(1, 64)), causal=draw(st.booleans()),
                      positional=positional, norm=draw(st.sampled_from(["layernorm", "rmsnorm"])),
                      mlp=draw(st.sampled_from(["gelu", "gelu_tanh", "swiglu"])),
                      bias=(bias := with_qk and draw(st.booleans())),
                      qkv_bias=with_qk and not bias and draw(st.booleans()),
                      rope_theta=draw(st.sampled_from([10000.0, 500.0])),
                      seed=draw(st.integers(0, 2**31)), **io)
