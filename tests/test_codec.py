"""The one codec between flat Optuna params and ``ArchConfig``: ``decode(encode(arch)) == arch``
for random architectures (shared layers, several head groups, every attention kind), and every
name a search space suggests decodes to the architecture it sampled."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

from arch import ATTENTION_KINDS, ArchConfig, ConfigError, HeadGroup, LayerSpec, ModelIO, codec
from search_spaces import RandomSuggester, load_space, parse_space, shipped_spaces
from tests.helpers.strategies import arch_configs


@st.composite
def shared_archs(draw: st.DrawFn) -> tuple[ArchConfig, list[tuple[int, ...]]]:
    """An architecture in which some disjoint sets of layers share one configuration."""
    arch = draw(arch_configs())
    layers = list(arch.layers)
    free = list(range(len(layers)))
    sets: list[tuple[int, ...]] = []
    while len(free) >= 2 and draw(st.booleans()):
        chosen = tuple(sorted(draw(st.lists(st.sampled_from(free), min_size=2, max_size=3,
                                            unique=True))))
        for i in chosen:
            layers[i] = layers[chosen[0]]
            free.remove(i)
        sets.append(chosen)
    return dataclasses.replace(arch, layers=tuple(layers)), sets


@settings(max_examples=150, deadline=None)
@given(shared_archs(), st.booleans())
def test_decode_inverts_encode(case: tuple[ArchConfig, list[tuple[int, ...]]],
                               group_count: bool) -> None:
    arch, shared = case
    params = codec.encode(arch, shared)
    assert all("/" not in key for key in params)  # Ray would nest the name
    named = {codec.parse_key(key)[0] for key in params}  # type: ignore[index]
    assert set(shared) <= named  # each shared set is named once, by its range
    assert codec.decode({**params, "train.lr": 1e-3}, arch) == arch
    if group_count:
        counted = {}
        for i, layer in enumerate(arch.layers):
            counted |= codec.encode_layer(layer, (i,), group_count=True)
        assert codec.decode(counted, arch) == arch


def test_every_attention_kind_and_several_groups_round_trip() -> None:
    for kind in ATTENTION_KINDS:
        single = kind in ("mssa", "mixit")
        heads = (HeadGroup(2, 16), HeadGroup(4, 8)) if single else (
            HeadGroup(2, 8, 16), HeadGroup(4, 8), HeadGroup(1, 4, 16))
        latent = {"latent_dim": 20, "rope_dim": 4} if kind == "latent" else {}
        layer = LayerSpec(kind, heads, mlp_ratio=2.0, role="extract", eta=0.5,
                          tied_output=kind == "mssa", **latent)
        arch = ArchConfig(d_model=48, layers=(layer, layer), max_seq_len=8, vocab_size=11,
                          positional="rope" if latent else "learned")
        assert codec.decode(codec.encode(arch), arch) == arch
        assert codec.decode(codec.encode(arch, [(0, 1)]), arch) == arch


def test_names_and_their_parse() -> None:
    assert codec.layer_key((3,), "attention") == "L3.attention"
    assert codec.group_key((0, 1, 2, 3), 1, "qk_dim") == "L0-3.g1.qk_dim"
    assert codec.layer_key((2, 0, 5), "mlp_ratio") == "L0,2,5.mlp_ratio"
    assert codec.parse_key("L0-3.g1.qk_dim") == ((0, 1, 2, 3), 1, "qk_dim")
    assert codec.parse_key("L0,2,5.mlp_ratio") == ((0, 2, 5), None, "mlp_ratio")
    assert codec.parse_key("train.lr") is None


def test_bad_params_name_what_is_wrong() -> None:
    arch = ArchConfig(d_model=8, layers=(LayerSpec("mhsa", (HeadGroup(2, 4),)),),
                      max_seq_len=4, input_dim=2)
    params = codec.encode(arch)
    with pytest.raises(ConfigError, match="head groups"):
        codec.decode({**params, "L0.g2.count": 1}, arch)
    with pytest.raises(ConfigError, match="unknown key"):
        codec.decode({**params, "L0.colour": "red"}, arch)
    with pytest.raises(ConfigError, match="no fields for layers"):
        codec.decode({"L1.attention": "mhsa"}, arch)


MULTI = {"name": "multi", "budget": 256, "depth": 3,
         "layers": [{"layers": 0, "groups": {"max": 3}, "head_dim": [16, 32, 64],
                     "attention": ["mhsa", "mssa"], "qk_dim": "reduced"},
                    {"layers": "1-2", "shared": True, "heads": [2, 4], "mlp_ratio": [0, 2],
                     "role": "extract", "freeze_mlp": True}]}
SPACES = [p.name for p in shipped_spaces() if "allocator" not in p.read_text()]


@pytest.mark.parametrize("name", [*SPACES, "multi"])
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_every_name_a_space_suggests_decodes(name: str, seed: int) -> None:
    space = parse_space(MULTI) if name == "multi" else load_space(name)
    suggester = RandomSuggester(seed)
    arch, _ = space.sample(suggester, ModelIO(16, vocab_size=8))
    layer_keys = {k: v for k, v in suggester.params.items() if not k.startswith("train.")}
    assert all(codec.parse_key(key) is not None for key in layer_keys), layer_keys
    assert codec.decode(layer_keys, arch) == arch
    assert space.encode(arch) == layer_keys  # and the space's encode agrees
