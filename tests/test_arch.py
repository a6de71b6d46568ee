"""ArchConfig: validation, lossless round-trips, stable ids."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import given, settings

from arch import ArchConfig, ConfigError, HeadGroup, LayerSpec
from tests.helpers.strategies import arch_configs


def small(**overrides: object) -> ArchConfig:
    kwargs: dict[str, object] = {
        "d_model": 64, "max_seq_len": 32, "input_dim": 8,
        "layers": (LayerSpec("mhsa", (HeadGroup(4, 16),), mlp_ratio=4),)}
    kwargs.update(overrides)
    return ArchConfig(**kwargs)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(arch_configs())
def test_round_trips_are_lossless(arch: ArchConfig) -> None:
    assert ArchConfig.from_dict(arch.to_dict()) == arch
    assert ArchConfig.from_json(arch.to_json()) == arch
    assert ArchConfig.from_yaml(arch.to_yaml()) == arch
    assert ArchConfig.from_yaml(arch.to_yaml()).arch_id == arch.arch_id
    assert ArchConfig.from_json(arch.to_json(indent=2)).to_json() == arch.to_json()


def test_arch_id_is_stable_and_depends_on_content() -> None:
    arch = small()
    # Frozen value: study records key on arch_id, so the canonical form must not drift.
    assert arch.arch_id == "3ef05e17416ce0a3"
    canonical = json.dumps(arch.to_dict(), sort_keys=True, separators=(",", ":"))
    assert arch.arch_id == hashlib.sha256(canonical.encode()).hexdigest()[:16]
    shuffled = dict(reversed(list(arch.to_dict().items())))
    assert ArchConfig.from_dict(shuffled).arch_id == arch.arch_id
    assert small(seed=1).arch_id != arch.arch_id
    assert len({small(d_model=d).arch_id for d in (64, 128, 256)}) == 3


def test_v_dim_defaults_to_qk_dim_and_shorthand_parses() -> None:
    assert HeadGroup(8, 64) == HeadGroup(8, 64, 64)
    assert HeadGroup.from_dict("8x64") == HeadGroup(8, 64, 64)
    assert HeadGroup.from_dict("4 x 16/64") == HeadGroup(4, 16, 64)
    assert str(HeadGroup(4, 16, 64)) == "4x16/64"
    layer = LayerSpec("mhsa", (HeadGroup(2, 64), HeadGroup(4, 16, 32)))
    assert layer.width == 2 * 64 + 4 * 32 and layer.n_heads == 6
    assert layer.heads_str == "2x64+4x16/32"


def test_unknown_keys_list_the_valid_ones() -> None:
    data = small().to_dict()
    data["dmodel"] = 3
    with pytest.raises(ConfigError, match=r"dmodel = 3: unknown key; valid keys: d_model, layers, "
                       r"max_seq_len, vocab_size"):
        ArchConfig.from_dict(data)
    data = small().to_dict()
    data["layers"][0]["heads"][0]["qk"] = 3
    with pytest.raises(ConfigError, match=r"layers\[0\]\.heads\[0\]\.qk = 3: unknown key; "
                       r"valid keys: count, qk_dim, v_dim"):
        ArchConfig.from_dict(data)


def test_every_problem_is_reported_at_once() -> None:
    data = {"d_model": 0, "max_seq_len": 8, "input_dim": 4, "vocab_size": 3, "norm": "batch",
            "layers": [{"attention": "linear", "heads": [{"count": 0, "qk_dim": 8}], "eta": 0},
                       {"attention": "mssa", "heads": ["2x8/16"], "mlp_ratio": -1}]}
    with pytest.raises(ConfigError) as err:
        ArchConfig.from_dict(data)
    problems = err.value.problems
    expected = ["layers[0].heads[0].count = 0", "layers[0].attention = 'linear'",
                "layers[0].eta = 0", "layers[1].heads[0] = 2x8/16: mssa heads have one width",
                "layers[1].mlp_ratio = -1", "d_model = 0", "norm = 'batch'",
                "vocab_size = 3, input_dim = 4: set exactly one"]
    for fragment in expected:
        assert any(p.startswith(fragment) for p in problems), (fragment, problems)
    assert "\n" not in str(err.value)  # one line for a CLI to print


@pytest.mark.parametrize(("change", "message"), [
    ({"positional": "rope", "layers": (LayerSpec("mixit", (HeadGroup(2, 8),)),)},
     "RoPE is not offered for mixit"),
    ({"positional": "rope", "layers": (LayerSpec("mhsa", (HeadGroup(2, 7),)),)},
     "RoPE needs even qk_dim"),
    ({"layers": (LayerSpec("mhsa", (HeadGroup(2, 8),), mlp_ratio=0.3),)},
     "must be a whole number of units"),
    ({"tie_embeddings": True}, "tie_embeddings = True: only for token inputs"),
    ({"schema_version": 99}, "schema_version = 99"),
])
def test_incompatible_options_are_rejected_at_build_time(change: dict[str, object],
                                                         message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        small(**change)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"attention": "mixit", "heads": (HeadGroup(2, 8, 16),)}, "qk_dim must equal v_dim"),
    ({"attention": "mhsa", "heads": (HeadGroup(2, 8),), "freeze_mlp": True}, "needs an MLP"),
    ({"attention": "mhsa", "heads": (HeadGroup(2, 8),), "tied_output": True},
     "only valid for mssa"),
    ({"attention": "mhsa", "heads": ()}, "non-empty"),
])
def test_layer_rules(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LayerSpec(**kwargs)  # type: ignore[arg-type]


def test_configs_are_frozen_and_hashable() -> None:
    arch = small()
    with pytest.raises(AttributeError):
        arch.d_model = 3  # type: ignore[misc]
    assert {arch: 1}[small()] == 1


def test_yaml_reads_an_allocator_report() -> None:
    arch = small()
    report = json.dumps({"budget": 64, "layers": [], "arch": arch.to_dict()})
    assert ArchConfig.from_yaml(report) == arch


def test_bad_yaml_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        ArchConfig.from_yaml("d_model: [1,")


def test_the_training_memory_estimate_counts_states_and_grows_with_the_batch() -> None:
    from arch import param_count
    from arch.memory import training_bytes

    layer = LayerSpec("mhsa", (HeadGroup(4, 16),), mlp_ratio=4.0)
    arch = ArchConfig(d_model=64, layers=(layer,) * 2, max_seq_len=32, vocab_size=100)
    states = 4 * 4 * param_count(arch).trainable  # weights, gradients, two AdamW moments
    assert training_bytes(arch, 1) > states
    assert training_bytes(arch, 1, "lion") == training_bytes(arch, 1) - 4 * param_count(
        arch).trainable
    assert training_bytes(arch, 16) > training_bytes(arch, 8) > training_bytes(arch, 1)
