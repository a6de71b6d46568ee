"""Search spaces: every shipped YAML loads, samples are valid and inside the budget by
construction, ``encode`` inverts sampling (also through an enqueued Optuna trial), grids are
exhaustive, and bad files get one message naming the file, the key and the rule."""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path

import optuna
import pytest
import yaml
from hypothesis import given, settings, strategies as st

from arch import ArchConfig, ConfigError, HeadGroup, ModelIO, codec, merge_groups
from search_spaces import (
    FixedSuggester,
    RandomSuggester,
    SpaceError,
    load_space,
    parse_space,
    shipped_spaces,
)

IO = ModelIO(max_seq_len=16, vocab_size=32)  # a task's length and vocabulary
SHIPPED = [p.name for p in shipped_spaces() if "allocator" not in p.read_text()]
BASE = {"name": "t", "budget": 64, "depth": 2,
        "layers": [{"layers": "all", "attention": ["mhsa", "mixit"], "heads": [1, 2, 4]}]}


def test_the_issue_spaces_are_shipped() -> None:
    assert {"aot_vs_standard.yaml", "heads_vs_dim.yaml", "later_layer_reduction.yaml",
            "mixit_grid.yaml"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_samples_are_valid_in_budget_and_encode_back(name: str, seed: int) -> None:
    space = load_space(name)
    arch, train = space.sample(RandomSuggester(seed), IO)
    assert arch.d_model == space.budget and arch.n_layers == space.depth
    assert arch.with_io(IO) == arch  # the task's model, not a placeholder
    for i, layer in enumerate(arch.layers):
        rule = space.rule(i)
        assert layer.width <= rule.budget
        assert layer.attention in rule.attention and layer.mlp_ratio in rule.mlp_ratio
        assert all(g.qk_dim <= g.v_dim for g in layer.heads)
    assert set(train) >= {"steps", "eval_every"}
    params = space.encode(arch, train)
    again, train_again = space.sample(FixedSuggester(params, seed=seed + 1), IO)
    assert again == arch and train_again == train


@pytest.mark.parametrize("name", SHIPPED)
def test_encode_enqueues_through_optuna(name: str) -> None:
    """What the launcher does with the allocator's seeds: enqueue, ask, sample the same arch."""
    space = load_space(name)
    study = optuna.create_study()
    archs = [space.sample(RandomSuggester(seed), IO)[0] for seed in range(5)]
    for arch in archs:
        study.enqueue_trial(space.encode(arch))
    for arch in archs:
        assert space.sample(study.ask(), IO)[0] == arch


def test_later_layers_sample_a_reduced_qk_dim() -> None:
    space = load_space("later_layer_reduction")
    layers = [space.sample(RandomSuggester(s), IO)[0].layers for s in range(40)]
    assert all(ls[0].heads[0].qk_dim == ls[0].heads[0].v_dim for ls in layers)
    assert any(g.qk_dim < g.v_dim for ls in layers for layer in ls[1:] for g in layer.heads)


def test_grid_is_the_product_of_the_choices() -> None:
    space = load_space("mixit_grid")
    points = space.grid()
    kinds = {(p["L0.attention"], p["L1.attention"]) for p in points}
    assert len(points) == 9 and kinds == set(itertools.product(space.rule(0).attention,
                                                                repeat=2))
    tradeoff = load_space("heads_vs_dim").grid()
    assert len(tradeoff) == 7 * 2
    assert {(p["L0.g0.count"], p["L0.g0.v_dim"]) for p in tradeoff} == {
        (h, 256 // h) for h in (1, 2, 4, 8, 16, 32, 64)}


def test_shared_rule_samples_one_configuration_for_all_its_layers() -> None:
    space = load_space("attention_kinds")
    points = space.grid()
    # One param per field, named for both layers (arch.codec).
    assert [p["L0-1.attention"] for p in points] == ["mhsa", "frozen_qk", "mixit", "mssa"]
    assert not any(key.startswith(("L0.", "L1.")) for p in points for key in p)
    for seed in range(20):
        arch, train = space.sample(RandomSuggester(seed), IO)
        assert arch.layers[0] == arch.layers[1]
        again, _ = space.sample(FixedSuggester(space.encode(arch, train)), IO)
        assert again == arch
    import dataclasses
    other = dataclasses.replace(arch.layers[1], attention="mhsa" if arch.layers[0].attention
                                != "mhsa" else "mixit")
    with pytest.raises(SpaceError, match=r"layers\[1\] = .*shares layer 0's configuration"):
        space.encode(dataclasses.replace(arch, layers=(arch.layers[0], other)))


def test_budget_override_rescales_derived_dims() -> None:
    space = load_space("aot_vs_standard", budget=256)
    arch, _ = space.sample(RandomSuggester(3), IO)
    assert arch.d_model == 256 and all(layer.width == 256 for layer in arch.layers)
    assert space.hash != load_space("aot_vs_standard").hash


def test_encode_names_what_is_outside_the_space() -> None:
    space = parse_space(BASE)
    arch, _ = space.sample(RandomSuggester(0), IO)
    bigger = load_space("aot_vs_standard").sample(RandomSuggester(0), IO)[0]
    with pytest.raises(SpaceError, match="d_model = 128: the space's budget is 64"):
        space.encode(bigger)
    import dataclasses
    wrong = dataclasses.replace(arch.layers[0], attention="mssa")
    with pytest.raises(SpaceError, match=r"layers\[0\]\.attention = 'mssa': allowed"):
        space.encode(dataclasses.replace(arch, layers=(wrong, arch.layers[1])))


@pytest.mark.parametrize(("change", "message"), [
    ({"layerz": []}, "layerz = \\[\\]: unknown key; valid keys: name, description"),
    ({"layers": [{"attention": [], "heads": [1]}]}, r"layers\[0\]\.attention = \[\]: must not "
                                                     "be empty"),
    ({"layers": [{"attention": ["softmax"], "heads": [1]}]}, "'softmax'.*must be from"),
    ({"layers": [{"heads": [3]}]}, r"heads = 3: head_dim 'derived' needs the count to divide "
                                   "the budget 64"),
    ({"layers": [{"heads": [4], "head_dim": [32]}]}, "4 x 32 = 128 exceeds the width budget 64"),
    ({"layers": [{"layers": 0, "heads": [1]}]}, r"no rule covers layers \[1\]"),
    ({"layers": [{"heads": [1]}, {"layers": 1, "heads": [2]}]}, "layer 1 is already covered"),
    ({"layers": [{"layers": "0-5", "heads": [1]}]}, "layer indices must lie in 0..1"),
    ({"budget": 0}, "budget = 0: must be an integer between 1 and 65,536"),
    ({"train": {"steps": [10, 20]}}, "train.steps = \\[10, 20\\]: must be one value"),
    ({"train": {"lr": {"low": 0, "high": 1}}}, "train.lr = .*0 < low <= high"),
    ({"train": {"momentum": 0.9}}, "train.momentum = 0.9: unknown key"),
    ({"sampler": "grid", "train": {"lr": {"low": 1e-4, "high": 1e-3}}}, "grid.*train.lr"),
    ({"layers": [{"heads": [1], "mlp_ratio": [0.3]}]}, "mlp_ratio \\* d_model"),
    ({"model": {"positional": "rope"}}, "RoPE is not offered for mixit"),
    ({"layers": [{"heads": [1], "shared": "yes"}]}, r"layers\[0\]\.shared = 'yes': must be "
                                                    "true or false"),
])
def test_bad_spaces_name_file_key_and_rule(tmp_path: Path, change: dict[str, object],
                                           message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**BASE, **change}))
    with pytest.raises(SpaceError, match=message) as info:
        load_space(path)
    assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_unknown_space_lists_the_shipped_ones() -> None:
    with pytest.raises(SpaceError, match=r"aot_vs_standard\.yaml"):
        load_space("nope.yaml")


# --- several head groups per layer, and the allocator's neighbourhood ---------------------------

TWO_GROUPS = {"name": "two", "budget": 256, "depth": 2,
              "layers": [{"layers": "all", "groups": {"max": 2}, "head_dim": [8, 16, 32, 64],
                          "attention": ["mhsa", "frozen_qk", "mssa"], "qk_dim": "reduced"}]}


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_two_group_layers_fill_the_budget_with_aligned_dims(seed: int) -> None:
    space = parse_space(TWO_GROUPS)
    arch, _ = space.sample(RandomSuggester(seed), IO)
    for layer in arch.layers:
        assert 1 <= len(layer.heads) <= 2 and layer.width == 256
        for g in layer.heads:
            assert g.v_dim in (8, 16, 32, 64) and g.count >= 1
            assert g.qk_dim % 8 == 0 and g.qk_dim <= g.v_dim
    params = space.encode(arch)
    assert space.sample(FixedSuggester(params), IO)[0] == arch


def test_optuna_samples_the_dynamic_group_ranges() -> None:
    """TPE on the space's define-by-run ranges (they change with the dims drawn)."""
    space = parse_space(TWO_GROUPS)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=5))
    for _ in range(25):
        trial = study.ask()
        arch, _ = space.sample(trial, IO)
        assert all(layer.width == 256 for layer in arch.layers)
        study.tell(trial, float(arch.layers[0].n_heads))


def test_a_grid_of_head_groups_holds_each_model_once() -> None:
    """Groups drawn in any order parametrise one model several ways (2x32 + 1x64 is 1x64 +
    2x32, 1x32 + 3x32 is 4x32): the grid keeps one point per model, and misses none."""
    space = parse_space({"name": "g", "budget": 128, "depth": 1,
                         "layers": [{"layers": "all", "groups": {"max": 2},
                                     "head_dim": [32, 64]}]})
    models = [space.sample(FixedSuggester(p), IO)[0].layers[0].heads for p in space.grid()]
    canonical = [merge_groups(heads) for heads in models]
    assert len(set(canonical)) == len(canonical)
    # brute force: every multiset of heads of dims 32/64 filling 128 with at most 2 dims
    assert set(canonical) == {(HeadGroup(2, 64),), (HeadGroup(4, 32),),
                              (HeadGroup(1, 64), HeadGroup(2, 32))}


def planner_for(**settings: object) -> object:
    from alloc.plan import make_plan
    from alloc.settings import PlanSettings

    def plan(budget: int, depth: int) -> ArchConfig:
        return make_plan(PlanSettings(budget=budget, layers=depth, **settings)).arch  # type: ignore[arg-type]

    return plan


@pytest.mark.parametrize("budget", [64, 128, 256, 512])
@pytest.mark.parametrize("kernel", ["ngram:4", "poly:1.0", "exp:0.1"])
def test_the_neighbourhood_contains_the_allocators_plan(budget: int, kernel: str) -> None:
    planner = planner_for(kernel=kernel, seq_len=64, input_dim=64)
    space = load_space("allocator_neighbourhood", budget, planner=planner)  # type: ignore[arg-type]
    plan = planner(budget, space.depth)  # type: ignore[operator]
    params = space.encode(plan)  # raises if the plan is not a point of the space
    again, _ = space.sample(FixedSuggester(params), ModelIO(plan.max_seq_len,
                                                            input_dim=plan.input_dim))
    assert again == plan
    for seed in range(20):  # and its neighbours are valid and fill the plan's widths
        arch, _ = space.sample(RandomSuggester(seed), IO)
        assert [x.width for x in arch.layers] == [x.width for x in plan.layers]
    rule = space.rule(0)  # its dims: listed, or derived from the head counts (one group)
    dims = set(rule.head_dim or ()) | {d for count in rule.heads for d in rule.v_dims(count)}
    assert {g.v_dim for x in plan.layers for g in x.heads} <= dims


def test_the_neighbourhood_needs_a_planner() -> None:
    with pytest.raises(SpaceError, match="allocator's plan"):
        load_space("allocator_neighbourhood")


@pytest.mark.parametrize(("change", "message"), [
    ({"groups": {"max": 3}, "head_dim": [16, 32, 128]}, "need a width of 272 > budget 256"),
    ({"groups": {"max": 2}, "head_dim": [48]}, "head_dim 48 does not divide the layer budget"),
    ({"groups": {"max": 2}, "head_dim": [16], "heads": [2]}, "not used with groups.max > 1"),
    ({"groups": 2, "head_dim": [16]}, "must be {max: G}"),
])
def test_bad_group_rules(change: dict[str, object], message: str) -> None:
    data = {**TWO_GROUPS, "layers": [{**TWO_GROUPS["layers"][0], **change}]}  # type: ignore[dict-item]
    with pytest.raises(SpaceError, match=re.escape(message)):
        parse_space(data)


def test_yaml_aliases_are_refused_and_long_values_cut(tmp_path: Path) -> None:
    """Nested aliases expand exponentially ("billion laughs"): refused at once; a long value is
    shown as an excerpt, never whole."""
    laughs = "a: &a [" + ",".join(["lol"] * 9) + "]\n" + "".join(
        f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]\n"
        for p, c in zip("abcdefgh", "bcdefghi")) + "description: *i\n"
    (tmp_path / "laughs.yaml").write_text(laughs + "budget: 64\nlayers: [{heads: [2]}]\n")
    with pytest.raises(SpaceError, match=r"line 2: aliases \(\*name\) are not accepted"):
        load_space(tmp_path / "laughs.yaml")
    with pytest.raises(ConfigError, match="aliases"):
        ArchConfig.from_yaml("d_model: &d 8\ninput_dim: *d\nmax_seq_len: 4\nlayers: []\n")
    with pytest.raises(SpaceError) as err:
        parse_space({**BASE, "train": {"lr": "y" * 100_000}})
    assert len(str(err.value)) < 300 and "(100,002 characters)" in str(err.value)


def test_the_largest_architecture_bounds_what_the_space_samples() -> None:
    """What the search's memory check is against: at least every sampled model's parameters
    and heads, for one-group and several-group rules, with any positional encoding."""
    from arch import param_count

    for data in ({"budget": 64, "depth": 2, "model": {"positional": "rope"},
                  "layers": [{"layers": "all", "heads": [1, 2, 4], "mlp_ratio": [0, 4]}]},
                 {"budget": 64, "depth": 1, "model": {"positional": "rope"},
                  "layers": [{"groups": {"max": 2}, "head_dim": [16, 32]}]}):
        space = parse_space(data)
        largest = space.largest(IO)
        for seed in range(20):
            arch, _ = space.sample(RandomSuggester(seed), IO)
            assert param_count(arch).total <= param_count(largest).total
            for big, small in zip(largest.layers, arch.layers):
                assert sum(g.count for g in small.heads) <= sum(g.count for g in big.heads)
        assert sum(g.count for g in largest.layers[0].heads) <= 64 // 8  # not one head per unit


# --- key/value heads (grouped-query attention) ----------------------------------------------

KV = {"name": "kv", "budget": 128, "depth": 2,
      "layers": [{"layers": 0, "heads": [4, 8, 16], "kv_heads": [1, 2, 4],
                  "attention": ["mhsa", "frozen_qk"]},
                 {"layers": 1, "groups": {"max": 2}, "head_dim": [16, 32],
                  "kv_heads": [1, 2], "qk_dim": "reduced"}]}


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_kv_heads_spaces_sample_valid_groups_that_round_trip(seed: int) -> None:
    """Every group reads one of the rule's key/value head counts (which divides its query
    heads), the sampled params are the codec's names and decode to the model, and ``encode``
    gives them back."""
    space = parse_space(KV)
    suggester = RandomSuggester(seed)
    arch, _ = space.sample(suggester, IO)
    for i, layer in enumerate(arch.layers):
        for j, g in enumerate(layer.heads):
            assert g.kv_heads in space.rule(i).kv_heads and g.count % g.kv_heads == 0  # type: ignore[operator]
            assert suggester.params[f"L{i}.g{j}.kv_heads"] == g.kv_heads
    assert codec.decode(suggester.params, arch) == arch
    assert codec.decode(codec.encode(arch), arch) == arch
    params = space.encode(arch)
    assert params == suggester.params
    assert space.sample(FixedSuggester(params), IO)[0] == arch


def test_a_grid_with_kv_heads_is_every_count_times_every_choice() -> None:
    space = parse_space({"name": "g", "budget": 64, "depth": 1, "sampler": "grid",
                         "layers": [{"layers": "all", "heads": [4, 8], "kv_heads": [1, 2, 4]}]})
    heads = {space.sample(FixedSuggester(p), IO)[0].layers[0].heads[0] for p in space.grid()}
    assert heads == {HeadGroup(c, 64 // c, kv_heads=k) for c in (4, 8) for k in (1, 2, 4)}


def test_spaces_without_kv_heads_sample_and_record_what_they_did() -> None:
    """No key: one key/value head per query head, and no kv_heads param (studies recorded
    before the key existed keep their params); a grouped model is outside such a space."""
    space = load_space("heads_vs_dim")
    suggester = RandomSuggester(0)
    arch, _ = space.sample(suggester, IO)
    assert not any(g.grouped for x in arch.layers for g in x.heads)
    assert not any(k.endswith("kv_heads") for k in suggester.params)
    grouped = ArchConfig.from_dict({**arch.to_dict(), "layers": [
        {**arch.layers[0].to_dict(), "heads": ["8x32kv2"]}]})
    with pytest.raises(SpaceError, match=r"kv_heads = 2: the space gives every query head"):
        space.encode(grouped)


@pytest.mark.parametrize(("rule", "message"), [
    ({"heads": [2, 4], "kv_heads": [4]},
     "layers[0].kv_heads = 4: must divide every head count the rule samples (heads = 2)"),
    ({"heads": [4], "kv_heads": [2], "attention": ["mhsa", "mixit"]},
     "layers[0].kv_heads = [2]: grouped key/value heads are for mhsa, frozen_qk and latent "
     "layers; attention also allows mixit"),
    ({"heads": [4], "kv_heads": [0]}, "layers[0].kv_heads = 0: must be key/value head counts"),
    ({"groups": {"max": 2}, "head_dim": [32], "kv_heads": [2]},
     "head_dim 32 x 2 (the kv_heads choices' least common multiple) does not divide"),
])
def test_bad_kv_heads_rules_are_one_line(rule: dict[str, object], message: str) -> None:
    data = {"name": "t", "budget": 96, "depth": 1, "layers": [{"layers": "all", **rule}]}
    with pytest.raises(SpaceError) as err:
        parse_space(data)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_neighbourhood_of_a_grouped_plan_keeps_its_key_value_heads() -> None:
    """A plan whose layers share key/value heads: its neighbourhood samples them too, and the
    plan itself is one of its points."""
    planner = planner_for(kernel="poly:1.0", seq_len=64, input_dim=64, kv_heads=2)
    space = load_space("allocator_neighbourhood", 512, planner=planner)  # type: ignore[arg-type]
    plan = planner(512, space.depth)  # type: ignore[operator]
    assert all(g.kv_heads == 2 for x in plan.layers for g in x.heads)
    assert all(rule.kv_heads == (2,) for rule in space.rules)
    params = space.encode(plan)
    again, _ = space.sample(FixedSuggester(params), ModelIO(plan.max_seq_len,
                                                            input_dim=plan.input_dim))
    assert again == plan
    for seed in range(20):
        arch, _ = space.sample(RandomSuggester(seed), IO)
        assert all(g.kv_heads == 2 for x in arch.layers for g in x.heads)


# --- latent layers --------------------------------------------------------------------------

LATENT = {"name": "latent", "budget": 64, "depth": 2, "model": {"positional": "rope"},
          "layers": [{"layers": "all", "attention": ["mhsa", "latent"], "heads": [4, 8],
                      "kv_heads": [1, 2], "latent_dim": [8, 16], "rope_dim": [0, 4]}]}


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_latent_spaces_sample_their_widths_and_round_trip(seed: int) -> None:
    space = parse_space(LATENT)
    suggester = RandomSuggester(seed)
    arch, _ = space.sample(suggester, IO)
    for i, layer in enumerate(arch.layers):
        if layer.attention == "latent":
            assert layer.latent_dim in (8, 16) and layer.rope_dim in (0, 4)
            assert suggester.params[f"L{i}.rope_dim"] == layer.rope_dim  # even at 0
        else:
            assert layer.latent_dim == 0 and f"L{i}.latent_dim" not in suggester.params
    assert codec.decode(suggester.params, arch) == arch
    params = space.encode(arch)
    assert params == suggester.params
    assert space.sample(FixedSuggester(params), IO)[0] == arch


def test_a_latent_grid_is_every_kind_with_its_own_choices() -> None:
    """mhsa: 2 counts x 2 key/value heads; latent: those x 2 widths x 2 RoPE parts."""
    space = parse_space({**LATENT, "depth": 1, "sampler": "grid"})
    layers = [space.sample(FixedSuggester(p), IO)[0].layers[0] for p in space.grid()]
    assert len(layers) == len(set(layers)) == 4 + 16
    outside = ArchConfig.from_dict({**space.sample(FixedSuggester(space.grid()[-1]), IO)[0]
                                    .to_dict(), "layers": [{
                                        "attention": "latent", "heads": ["8x8kv2"],
                                        "latent_dim": 12}]})
    with pytest.raises(SpaceError, match=r"latent_dim = 12: allowed \[8, 16\]"):
        space.encode(outside)


@pytest.mark.parametrize(("change", "message"), [
    ({"attention": ["mhsa"]}, "layers[0].latent_dim = [8, 16]: only with attention latent"),
    ({"latent_dim": None}, "layers[0].latent_dim = None: must be latent widths"),
    ({"rope_dim": [3]}, "layers[0].rope_dim = 3: must be even integers"),
    ({"rope_dim": [16]}, "layers[0].rope_dim = 16: exceeds the narrowest qk_dim the rule "
                         "samples (8)"),
])
def test_bad_latent_rules_are_one_line(change: dict[str, object], message: str) -> None:
    rule = {**LATENT["layers"][0], **change}  # type: ignore[index]
    with pytest.raises(SpaceError) as err:
        parse_space({**LATENT, "layers": [{k: v for k, v in rule.items() if v is not None}]})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_rope_parts_need_a_rope_model() -> None:
    with pytest.raises(SpaceError, match=r"rope_dim = 4: needs model positional: rope"):
        parse_space({**LATENT, "model": {"positional": "learned"}})


@pytest.mark.parametrize("name", SHIPPED)
def test_the_plan_s_mlp_is_known_before_the_space_loads(name: str) -> None:
    """``SpaceFile.plan_mlp_ratio`` (what a space's ``allocator`` placeholders are planned
    with) is the largest MLP ratio the loaded space's layer 0 allows."""
    from search_spaces import SpaceFile

    file = SpaceFile.read(name)
    assert file.plan_mlp_ratio() == max(file.load().rule(0).mlp_ratio)


def test_the_plan_s_mlp_is_layer_0_s_where_a_later_layer_allows_a_wider_one() -> None:
    from search_spaces import SpaceFile

    later_wider = SpaceFile({"budget": 64, "depth": 3, "layers": [
        {"layers": "1-2", "mlp_ratio": [4], "heads": [1, 2]},
        {"layers": 0, "mlp_ratio": [0, 2], "heads": [1, 2]}]}, "<t>")
    assert later_wider.plan_mlp_ratio() == 2.0 == max(later_wider.load().rule(0).mlp_ratio)
    assert later_wider.shape() == (64, 3, 4.0)  # the data's pilot: the widest MLP
    assert SpaceFile({"budget": 64, "depth": "3", "layers": []}, "<t>").plan_mlp_ratio() is None


def test_the_promise_space_trains_the_printed_plan_and_its_uniform_twin() -> None:
    """``promise_256.yaml``'s grid is ``alloc.solve --budget 256 --layers 4``'s plan as printed
    and the same model with heads of 64 everywhere, at three seeds each (if the allocator's
    default changes, this names the space as stale)."""
    from alloc import PlanSettings, make_plan

    space = load_space("promise_256.yaml")
    plan = make_plan(PlanSettings(budget=256, layers=4)).arch.with_io(IO)
    uniform = dataclasses.replace(plan, layers=tuple(
        dataclasses.replace(x, heads=(HeadGroup(4, 64),)) for x in plan.layers))
    built = [space.sample(FixedSuggester(point), IO) for point in space.grid()]
    keys = [(arch.layers, train["seed"]) for arch, train in built]
    assert keys == [(m.layers, s) for m in (plan, uniform) for s in (0, 1, 2)]
    assert plan.layers[1].heads == (HeadGroup(4, 8, 64),)  # the printed 4x8/64


HEAD_SETS = {"name": "sets", "budget": 32, "depth": 2, "sampler": "random",
             "layers": [{"layers": 0, "role": "extract", "mlp_ratio": [2],
                         "heads": ["1x32", "4x8", "2x8+1x16"]},
                        {"layers": 1, "mlp_ratio": [2], "heads": ["1x8/32", "4x8"]}],
             "train": {"seed": [0, 1]}}


def test_explicit_head_sets_are_points_that_encode_back() -> None:
    """``heads: ["2x8+1x16", ...]``: each set is one choice of ``L{i}.heads``, taken as given
    (its qk_dim too), and ``encode`` of any sampled point gives that point's params back."""
    space = parse_space(HEAD_SETS)
    grid = space.grid(limit=100)
    assert len(grid) == 3 * 2 * 2
    seen = set()
    for params in grid:
        arch, train = space.sample(FixedSuggester(params), IO)
        assert space.encode(arch, {"seed": train["seed"]}) == params
        assert codec.decode(params, arch) == arch
        seen.add(tuple(layer.heads_str for layer in arch.layers))
    assert ("2x8+1x16", "1x8/32") in seen and len(seen) == 6
    other = dataclasses.replace(arch, layers=(arch.layers[0], dataclasses.replace(
        arch.layers[1], heads=(HeadGroup(2, 16),))))
    with pytest.raises(SpaceError, match=r"layers\[1\].heads = 2x16: allowed"):
        space.encode(other)


@pytest.mark.parametrize(("rule", "message"), [
    ({"heads": ["4x8", "3y8"]}, r"layers\[0\].heads = '3y8': must be head groups"),
    ({"heads": ["8x8"]}, r"width 64 exceeds the layer budget 32"),
    ({"heads": ["4x8"], "qk_dim": "reduced"}, r"qk_dim = 'reduced': not used with explicit"),
])
def test_bad_head_sets_are_named(rule: dict[str, object], message: str) -> None:
    with pytest.raises(SpaceError, match=message):
        parse_space({**HEAD_SETS, "layers": [{"layers": "all", **rule}]})
