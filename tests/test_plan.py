"""The per-layer plan and the allocator's JSON contract."""

from __future__ import annotations

import dataclasses
import re

import pytest

from alloc.errors import PlanError
from alloc.plan import make_plan, report
from alloc.settings import PlanSettings
from arch import ArchConfig, HeadGroup, attention_params


def test_default_plan() -> None:
    plan = make_plan(PlanSettings())
    layers = plan.arch.layers
    assert layers[0].heads == (HeadGroup(8, 64),) and layers[0].role == "extract"
    assert all(layer.heads == (HeadGroup(8, 8, 64),) for layer in layers[1:])
    assert all(layer.role == "process" and layer.mlp_ratio == 4 for layer in layers[1:])
    assert plan.arch.d_model == 512 and plan.arch.input_dim == 64


def test_json_contract() -> None:
    rep = report(make_plan(PlanSettings()))
    assert rep["budget"] == 512
    for row in rep["layers"]:
        assert {"index", "role", "attention", "heads", "width", "attention_params",
                "predicted_error", "reason"} <= set(row)
        assert all(set(h) == {"count", "qk_dim", "v_dim"} for h in row["heads"])
    assert {"objective", "groups"} <= set(rep["extract"]["exact"])
    assert all(set(g) == {"offset", "span", "count", "dim"}
               for g in rep["extract"]["exact"]["groups"])
    assert {"objective", "groups"} <= set(rep["extract"]["continuous"])
    assert {"objective", "count", "dim"} <= set(rep["extract"]["uniform"])
    arch = ArchConfig.from_dict(rep["arch"])
    assert [r["attention_params"] for r in rep["layers"]] == [
        attention_params(layer, 512).total for layer in arch.layers]
    base = 6 * attention_params(arch.layers[0], 512).total  # baseline 8x64 everywhere
    assert rep["totals"]["baseline_attention_params"] == base
    assert rep["totals"]["saving"] == pytest.approx(1 - rep["totals"]["attention_params"] / base)


@pytest.mark.parametrize("kind", ["mssa", "mixit"])
def test_single_width_kinds_keep_qk_equal_v(kind: str) -> None:
    plan = make_plan(PlanSettings(attention=kind, mlp_ratio=0))
    for layer in plan.arch.layers:
        assert layer.attention == kind and layer.mlp_ratio == 0
        assert all(g.qk_dim == g.v_dim for g in layer.heads)


def test_uniform_flag_and_extract_layers() -> None:
    plan = make_plan(PlanSettings(budget=256, uniform=True, layers=4, extract_layers=2,
                                  kernel="exp:0.5", input_dim=128))
    uni = plan.uniform
    assert [layer.role for layer in plan.arch.layers] == ["extract"] * 2 + ["process"] * 2
    assert plan.arch.layers[0].heads == (HeadGroup(uni.count, uni.dim),)
    assert plan.layer_errors[0]["total"] == pytest.approx(uni.objective)
    none = make_plan(PlanSettings(extract_layers=0))
    assert all(layer.role == "process" for layer in none.arch.layers)


def test_longer_sequences_never_need_larger_qk() -> None:
    dims = [make_plan(PlanSettings(seq_len=n, tolerance=0.01)).arch.layers[1].heads[0].qk_dim
            for n in (64, 128, 256, 512, 1024)]
    assert dims == sorted(dims, reverse=True) and dims[0] > dims[-1]


def test_token_model() -> None:
    plan = make_plan(PlanSettings(vocab_size=601))
    assert plan.arch.vocab_size == 601 and plan.arch.input_dim is None


def test_predicted_error_of_any_layer_is_the_brute_force_bound() -> None:
    """For one group of ``count`` heads of dim ``d``: the best spread of exactly those heads."""
    import itertools
    import math
    from dataclasses import replace

    import numpy as np

    from alloc.extract import ExtractProblem, GroupChoice, solve_brute_force
    from alloc.plan import predicted_error
    from arch import LayerSpec
    from arch.kernels import parse_kernel

    settings = PlanSettings(budget=64, input_dim=16, seq_len=4, kernel="poly:1", layers=1,
                            max_block=1)  # one offset per group: the enumeration below
    rho = parse_kernel(settings.kernel, settings.seq_len)
    problem = ExtractProblem(rho, 64, 1, settings.model)
    offsets = problem.offsets.tolist()
    for count, dim in [(1, 64), (2, 32), (4, 16), (8, 8), (3, 8), (5, 4)]:
        best = np.inf
        # Every way to give each offset 0..count heads, at most count in all.
        for split in itertools.product(range(count + 1), repeat=len(offsets)):
            if sum(split) <= count:
                groups = [GroupChoice(s, c, dim) for s, c in zip(offsets, split) if c]
                best = min(best, problem.evaluate(groups).objective)
        layer = LayerSpec("mhsa", (HeadGroup(count, dim),))
        assert predicted_error(settings, layer) == pytest.approx(best, rel=1e-12)
        # With blocks (the default), against the enumeration of blocks too.
        blocks = replace(settings, max_block=4)
        brute = solve_brute_force(ExtractProblem(rho, count * dim, math.gcd(dim, count * dim),
                                                 blocks.model, 4), np.array([dim]))
        assert predicted_error(blocks, layer) == pytest.approx(brute.objective, rel=1e-12)
    plan = make_plan(PlanSettings(budget=256, input_dim=64, kernel="ngram:4", seq_len=64,
                                  layers=1, uniform=True))
    assert predicted_error(plan.settings, plan.arch.layers[0]) == pytest.approx(
        plan.uniform.objective)


def test_a_candidate_s_own_mlp_does_not_change_its_bound() -> None:
    """The compression order is the target's, stated by the plan's MLP: an attention-only
    candidate layer is priced as its twin with an MLP (before, the lower order made every
    attention-only extraction layer look better, the opposite of the tables), and the same layer
    costs less when the plan itself is attention-only (order 1 loses less of a token)."""
    from alloc.plan import predicted_error
    from arch import LayerSpec

    settings = PlanSettings(budget=64, layers=2, seq_len=64, input_dim=64, kernel="poly:1",
                            mlp_ratio=2.0, align=4)
    for count, dim in [(1, 64), (4, 16), (16, 4)]:
        with_mlp = LayerSpec("mhsa", (HeadGroup(count, dim),), mlp_ratio=2.0)
        without = dataclasses.replace(with_mlp, mlp_ratio=0.0)
        assert predicted_error(settings, with_mlp) == predicted_error(settings, without)
    narrow = LayerSpec("mhsa", (HeadGroup(16, 4),), mlp_ratio=2.0)
    attention_only = dataclasses.replace(settings, mlp_ratio=0.0)
    assert predicted_error(attention_only, narrow) < predicted_error(settings, narrow)


def test_measured_logit_bounds_per_later_layer() -> None:
    """A later layer with a larger measured R keeps a larger qk_dim; the list with the global
    value everywhere is the global rule, and layers it omits fall back to it."""
    from dataclasses import replace

    base = PlanSettings(budget=256, layers=4, seq_len=128)
    plan = make_plan(replace(base, logit_bounds=(0.5, 2.0, 30.0)))
    qk = [max(g.qk_dim for g in layer.heads) for layer in plan.arch.layers[1:]]
    assert qk == sorted(qk) and qk[0] < qk[-1] == 64  # R = 30: the bound keeps the full dim
    assert make_plan(replace(base, logit_bounds=(1.0,) * 3)).arch == make_plan(base).arch
    short = make_plan(replace(base, logit_bounds=(30.0,)))
    assert short.arch.layers[2:] == make_plan(base).arch.layers[2:]


@pytest.mark.parametrize(("fields", "message"), [
    ({"align": 24}, "align 24: must divide budget 512"),
    ({"extract_layers": 7}, "extract_layers 7: must be <= layers 6"),
    ({"attention": "mixit", "positional": "rope"}, "positional rope: not offered"),
    ({"kernel": "gauss:2"}, "kernel: unknown kernel 'gauss:2'"),
    ({"budget": 0}, "budget = 0: must be an integer >= 1"),
    ({"alpha": 10.0}, "the bound's terms reach"),
])
def test_settings_validate_themselves(fields: dict[str, object], message: str) -> None:
    """Every caller (the command, the search's seeding, calibration from a study) gets the
    same rules: built from Python, broken settings are refused with the rule, in the
    library's words: each problem names the field, never a command's flag."""
    with pytest.raises(PlanError, match=re.escape(message)) as err:
        PlanSettings(**fields)  # type: ignore[arg-type]
    assert "--" not in str(err.value)
    assert {p.field for p in err.value.broken} <= {f.name for f in dataclasses.fields(
        PlanSettings)}


def test_settings_from_a_recorded_dict() -> None:
    settings = PlanSettings(budget=256, layers=2, kernel="ngram:4")
    assert PlanSettings.from_dict(dataclasses.asdict(settings)) == settings
    with pytest.raises(PlanError, match="unknown key 'budgett'; valid keys: budget, layers"):
        PlanSettings.from_dict({"budgett": 256})


@pytest.mark.parametrize("fields", [
    {}, {"kv_heads": 2}, {"max_block": 1, "patterns": (3.0,)},
    {"budget": 256, "layers": 3, "kernel": "exp:0.3", "mlp_ratio": 0.0},
])
def test_the_uniform_plan_from_a_plan_is_the_uniform_plan_made_anew(
        fields: dict[str, object]) -> None:
    """``uniform_plan`` reuses the plan's solved problem: its report (arch, per-layer rows,
    the extraction's choice, the inputs) is ``make_plan``'s with ``uniform`` set."""
    from alloc.plan import uniform_plan

    settings = dataclasses.replace(PlanSettings(), **fields)  # type: ignore[arg-type]
    made = make_plan(dataclasses.replace(settings, uniform=True))
    assert report(uniform_plan(make_plan(settings))) == report(made)
    assert uniform_plan(made) is made


def test_measured_inputs_become_settings_cut_to_the_plan_s_later_layers() -> None:
    """``AllocatorInputs.settings``: a deeper pilot's extra later layers go unused, the fields
    given win over the measured ones, and an explicit input dimension replaces the measured
    input spectrum."""
    from alloc.settings import AllocatorInputs

    inputs = AllocatorInputs(kernel="exp:0.5", input_dim=32, seq_len=16, spectrum="power:2",
                             input_spectrum=None, logit_bounds=(2.0, 3.0, 4.0),
                             patterns=(2.0, 4.0, 8.0))
    settings = inputs.settings(budget=64, layers=3)
    assert settings == PlanSettings(budget=64, layers=3, kernel="exp:0.5", input_dim=32,
                                    seq_len=16, spectrum="power:2", logit_bounds=(2.0, 3.0),
                                    patterns=(2.0, 4.0))
    assert inputs.settings(budget=64, layers=3, extract_layers=2).logit_bounds == (2.0,)
    one = inputs.settings(budget=64, layers=1)
    assert one.logit_bounds is None and one.patterns is None  # no later layer
    given = inputs.settings(budget=64, layers=4, seq_len=8, logit_bounds=(5.0,))
    assert (given.seq_len, given.logit_bounds, given.patterns) == (8, (5.0,), (2.0, 4.0, 8.0))
    with pytest.raises(PlanError, match="logit_bounds: 2 values for 1 later layer"):
        inputs.settings(budget=64, layers=2, logit_bounds=(5.0, 6.0))
