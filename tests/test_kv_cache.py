"""The KV cache per token: counted from the architecture (one figure, the kind's
``arch.kinds.KindTraits.kv_units``, equal to what every kind's built module caches and to what
a ``transformers`` decode holds), recorded on every trial at the dtype it trained in, read back
for studies that never recorded it, and ``studies pareto --x kv_cache`` (the front of value vs
KV cache) equal to brute force."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import optuna
import pytest
import torch
from torch.autograd.functional import jacobian

from alloc.compression import GroupPlan, LayerPlan, form_of
from alloc.settings import PlanSettings
from arch import KINDS, ArchConfig, ConfigError, HeadGroup, LayerSpec, ModelIO
from arch.memory import dtype_bytes, kv_cache_bytes, training_dtype
from search_spaces import load_space
from studies import add_record, open_storage, query as q, records as rec, set_study_attrs
from studies.cli import main
from studies.trials import Direction
from workers.models.kinds import make_attention
from workers.models.model import build_model
from workers.search.searcher import StudySearcher
from workers.search.seeding import BoundPredictor, fit_layer

FROZEN = Path(__file__).resolve().parent / "data" / "study_v1.db"
optuna.logging.set_verbosity(optuna.logging.WARNING)


def arch_kv(count: int, kv: int, layers: int = 2) -> ArchConfig:
    """``layers`` mhsa layers of ``count`` heads of 8 (64 wide) reading ``kv`` key/value heads."""
    layer = LayerSpec("mhsa", (HeadGroup(count, 64 // count, kv_heads=kv),))
    return ArchConfig(d_model=64, layers=(layer,) * layers, max_seq_len=16, input_dim=8)


def test_kv_cache_is_the_hand_count() -> None:
    """Per layer and group: kv_heads x (qk_dim + v_dim) values; MSSA and MixiT layers cache
    their width (one projection serving as key and value, or values only); a latent layer its
    latent and its keys' RoPE parts."""
    layers = (LayerSpec("mhsa", (HeadGroup(8, 16, kv_heads=2), HeadGroup(4, 8, 16, 1))),
              LayerSpec("frozen_qk", (HeadGroup(4, 16),)),
              LayerSpec("mixit", (HeadGroup(2, 32),)),
              LayerSpec("mssa", (HeadGroup(2, 16), HeadGroup(1, 8)), tied_output=True),
              LayerSpec("latent", (HeadGroup(4, 16, 8, 2),), latent_dim=24))
    arch = ArchConfig(d_model=64, layers=layers, max_seq_len=8, input_dim=4)
    per_layer = [2 * (16 + 16) + 1 * (8 + 16), 4 * (16 + 16), 2 * 32, 2 * 16 + 8, 24]
    assert [layer.kv_width for layer in layers] == per_layer
    with_rope = LayerSpec("latent", (HeadGroup(4, 16, 8, 2),), latent_dim=24, rope_dim=4)
    assert with_rope.kv_width == 24 + 2 * 4  # and its 2 key/value heads' RoPE parts
    units = sum(per_layer)
    assert arch.kv_width == units
    assert kv_cache_bytes(arch) == 4 * units and kv_cache_bytes(arch, "bfloat16") == 2 * units
    assert kv_cache_bytes(arch, "float16") == 2 * units
    with pytest.raises(ConfigError, match="dtype = 'int8': must be one of float32"):
        dtype_bytes("int8")


def test_the_trainers_dtype_names_the_recorded_bytes() -> None:
    assert training_dtype("cuda") == "bfloat16" and training_dtype("cpu") == "float32"
    attrs = rec.trial_attrs(arch_kv(8, 2), kv_dtype="bfloat16")
    assert attrs[rec.KV_CACHE] == 2 * 2 * 2 * (8 + 8)  # bytes x layers x kv heads x (qk + v)
    assert attrs[rec.KV_CACHE_DTYPE] == "bfloat16"
    assert rec.trial_attrs(arch_kv(8, 8))[rec.KV_CACHE] == 4 * 2 * 8 * 16


def test_the_searcher_records_the_kv_cache_of_each_trial(tmp_path: Path) -> None:
    storage = open_storage(f"sqlite:///{tmp_path / 's.db'}")
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    searcher = StudySearcher(load_space("kv_heads"), io=ModelIO(3, vocab_size=14), study=study,
                             storage=storage, metric="acc", direction=Direction.MAXIMIZE, steps=10,
                             predict=BoundPredictor(PlanSettings(budget=128, layers=2, seq_len=3)),
                             kv_dtype="bfloat16")
    for key in ("a", "b", "c"):
        spec = searcher.ask(key)
        assert spec is not None
        arch = next(iter(spec.values())).arch
        attrs = searcher.trials[key].user_attrs
        assert attrs[rec.KV_CACHE] == 2 * arch.kv_width
        assert attrs[rec.KV_CACHE_DTYPE] == "bfloat16"


def old_record(study: optuna.Study, arch: ArchConfig, value: float) -> None:
    """A trial as a version without the KV cache recorded it."""
    attrs = rec.trial_attrs(arch, steps_reached=10)
    del attrs[rec.KV_CACHE], attrs[rec.KV_CACHE_DTYPE]
    params = {"x": 1}
    study.add_trial(optuna.trial.create_trial(
        value=value, params=params, distributions=rec.fixed_distributions(params),
        user_attrs=attrs))


@pytest.mark.parametrize("direction", ["minimize", "maximize"])
def test_pareto_of_kv_cache_equals_brute_force(tmp_path: Path, direction: str) -> None:
    """Trials recorded at float32, bfloat16 and (older ones) not at all rank by key/value
    units, whatever their dtype: the front is what no other trial beats on both."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(storage=open_storage(url), study_name="kv", direction=direction)
    rng = random.Random(0)
    archs = {}
    for n in range(24):
        count = rng.choice([2, 4, 8])
        arch = arch_kv(count, rng.choice([k for k in (1, 2, 4, 8) if count % k == 0]),
                       layers=rng.choice([1, 2]))
        value = round(rng.random(), 2)
        archs[n] = (arch, value)
        if n % 3 == 2:
            old_record(study, arch, value)
        else:
            add_record(study, arch, value, steps_reached=10,
                       kv_dtype="bfloat16" if n % 3 else "float32")
    sign = 1 if direction == "minimize" else -1
    expected = {n for n, (a, v) in archs.items() if not any(
        sign * w <= sign * v and b.kv_width <= a.kv_width
        and (w, b.kv_width) != (v, a.kv_width) for b, w in archs.values())}
    # Ties on both: the earliest trial stands for them.
    ties = {n for n in expected if any(m < n and (archs[m][0].kv_width, archs[m][1]) ==
                                       (archs[n][0].kv_width, archs[n][1]) for m in expected)}
    _, front = q.pareto(open_storage(url).engine, "kv", "kv_cache")
    assert {t.number for t in front} == expected - ties
    for t in front:  # each as recorded, or (older trials) from its architecture at float32
        arch = archs[t.number][0]
        assert t.kv_cache == kv_cache_bytes(arch, t.kv_cache_dtype)
        assert t.kv_cache_dtype == ("bfloat16" if t.number % 3 == 1 else "float32")


def test_pareto_cli_on_the_kv_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(storage=open_storage(url), study_name="demo")
    set_study_attrs(study, task="ngram", metric="mse")
    for arch, value in ((arch_kv(8, 8), 0.1), (arch_kv(8, 2), 0.2), (arch_kv(8, 1), 0.3),
                        (arch_kv(4, 4), 0.25)):
        add_record(study, arch, value, steps_reached=10)
    plot = tmp_path / "front.png"
    assert main(["pareto", "--x", "kv_cache", "--storage", url, "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "KV cache per token (bytes, float32)" in out and "8x8kv2" in out
    assert plot.read_bytes()[:4] == b"\x89PNG"
    assert main(["pareto", "--x", "kv_cache", "--storage", url, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["number"], r["kv_cache"]) for r in rows] == [(2, 4 * 2 * 16), (1, 4 * 2 * 2 * 16),
                                                            (0, 4 * 2 * 8 * 16)]
    with pytest.raises(SystemExit) as bad:  # argparse's choices: exit code 2
        main(["pareto", "--x", "flops", "--storage", url])
    assert bad.value.code == 2
    assert "invalid choice: 'flops'" in capsys.readouterr().err


def test_a_study_that_never_recorded_the_kv_cache_still_answers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "study_v1.db"
    shutil.copy(FROZEN, db)  # never touch the committed file
    url = f"sqlite:///{db}"
    assert main(["pareto", "--x", "kv_cache", "--storage", url, "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(r["kv_cache"] == kv_cache_bytes(ArchConfig.from_dict(r["arch"]))
                        and r["kv_cache_dtype"] == "float32" for r in rows)
    assert main(["best", "--storage", url, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["kv_cache"] > 0


def test_seeds_keep_their_key_value_heads() -> None:
    """A template layer's shared key/value heads are kept when the rule allows them, moved to
    its nearest choice when it samples others, and never silently dropped."""
    space = load_space("kv_heads")
    layer = LayerSpec("mhsa", (HeadGroup(8, 16, kv_heads=2),), mlp_ratio=4)
    assert fit_layer(space, 0, layer).heads == (HeadGroup(8, 16, kv_heads=2),)
    odd = LayerSpec("mhsa", (HeadGroup(8, 16, kv_heads=8),), mlp_ratio=4)
    assert fit_layer(space, 0, odd).heads == (HeadGroup(8, 16, kv_heads=4),)
    plain = load_space("heads_vs_dim")
    kept = fit_layer(plain, 0, LayerSpec("mhsa", (HeadGroup(8, 32, kv_heads=2),)))
    assert kept.heads[0].kv_heads == 2  # not in that space: the seed is skipped, with a warning


def test_a_layers_groups_share_key_value_heads_in_proportion() -> None:
    from alloc.errors import PlanError
    from alloc.plan import share_kv_heads

    heads = (HeadGroup(4, 64), HeadGroup(2, 32))
    assert share_kv_heads(heads, 3) == (HeadGroup(4, 64, kv_heads=2), HeadGroup(2, 32, 0, 1))
    assert share_kv_heads(heads, 6) == heads  # one per query head: not grouped
    for n in (2, 4, 5, 12):  # 6 / n query heads per key/value head must divide 4 and 2
        with pytest.raises(PlanError, match=f"kv_heads {n}: the plan's layer has heads "
                                            r"4x64\+2x32 \(6 query heads\)") as err:
            share_kv_heads(heads, n)
        assert [p.field for p in err.value.broken] == ["kv_heads"]  # alloc.solve: --kv-heads


# --- one figure per kind, equal to what the built modules cache --------------------------------

D_MODEL, T = 80, 6  # wider than any layer's cache below, so its null space is not empty


def kind_layers(positional: str) -> list[LayerSpec]:
    """A few layers of every kind in ``arch.KINDS`` that ``positional`` allows: one group and
    several, grouped key/value heads and qk_dim != v_dim where the kind has separate keys and
    values, a tied and an untied output where it may tie, a latent with and without RoPE
    parts."""
    rope = positional == "rope"
    layers = []
    for name, kind in KINDS.items():
        if rope and not kind.queries_keys:
            continue
        shapes: list[tuple[HeadGroup, ...]] = [(HeadGroup(4, 8),)]
        shapes.append((HeadGroup(2, 8), HeadGroup(2, 4)) if kind.single_width else
                      (HeadGroup(4, 8, 4, kv_heads=2), HeadGroup(2, 4, 6, 1)))
        for heads in shapes:
            if kind.latent:
                layers += [LayerSpec(name, heads, latent_dim=10, rope_dim=2 if rope else 0),
                           LayerSpec(name, heads, latent_dim=7, rotate_latent=rope)]
            elif kind.ties_output:
                layers += [LayerSpec(name, heads, tied_output=tied) for tied in (False, True)]
            else:
                layers.append(LayerSpec(name, heads))
    return layers


CASES = [(positional, layer) for positional in ("learned", "rope")
         for layer in kind_layers(positional)]


def case_id(positional: str, layer: LayerSpec) -> str:
    """``rope-latent-4x8-c10r2``, ``learned-mssa-4x8-tied``: a case's test id."""
    latent = f"-c{layer.latent_dim}r{layer.rope_dim}" if layer.kind.latent else ""
    return (f"{positional}-{layer.attention}-{layer.heads_str}{latent}"
            + ("-tied" if layer.tied_output else "") + ("-rotated" if layer.rotate_latent else ""))


def one_layer(layer: LayerSpec, positional: str) -> ArchConfig:
    return ArchConfig(d_model=D_MODEL, layers=(layer,), max_seq_len=T, positional=positional,
                      input_dim=4)


def test_the_cases_cover_every_kind() -> None:
    assert {layer.attention for _, layer in CASES} == set(KINDS)


@pytest.mark.parametrize(("positional", "layer"), CASES, ids=[case_id(*c) for c in CASES])
def test_every_kinds_module_caches_the_one_figure(positional: str, layer: LayerSpec) -> None:
    """The built module's cache per token has ``LayerSpec.kv_width`` units (= ``ArchConfig``'s,
    = the kind's ``kv_units``, = the KV cache bytes over 4): no unit repeats another (its map
    from a token has full rank: MSSA's projection counted as key and as value would not), and
    none is missing (moving earlier tokens where their cache does not see leaves the last
    token's output as it is, while moving them elsewhere changes it)."""
    torch.manual_seed(0)
    arch = one_layer(layer, positional)
    attn = make_attention(arch, layer, 0).double()
    figure = layer.kind.kv_units(layer.heads, layer.latent_dim, layer.rope_dim)
    assert layer.kv_width == arch.kv_width == figure == kv_cache_bytes(arch) // 4 < D_MODEL
    x = torch.randn(1, T, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        cache, out = attn.cached(x), attn(x)
    assert cache.shape == (1, T, figure)
    # each token's cache is an affine map of that token alone: its linear part (units, d)
    maps = jacobian(lambda token: attn.cached(token[None, None])[0, 0], x[0, 0])
    assert int(torch.linalg.matrix_rank(maps)) == figure
    unseen = torch.linalg.svd(maps).Vh[figure:]  # (d - units, d): directions the cache ignores
    moved = x.clone()
    moved[0, :-1] += torch.randn(T - 1, len(unseen), dtype=torch.float64) @ unseen
    elsewhere = x.clone()
    elsewhere[0, :-1] += torch.randn(T - 1, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(attn.cached(moved), cache)
        torch.testing.assert_close(attn(moved)[0, -1], out[0, -1], atol=1e-10, rtol=1e-10)
        assert not torch.allclose(attn(elsewhere)[0, -1], out[0, -1], atol=1e-6)


@pytest.mark.usefixtures("remote_code_cache")
@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_a_transformers_decode_caches_the_one_figure(positional: str, tmp_path: Path) -> None:
    """Every exportable kind's layers in one exported model: after a prompt of T tokens, each
    layer's ``DynamicCache`` holds ``T`` tokens of ``LayerSpec.kv_width`` units."""
    from transformers import AutoModelForCausalLM
    from transformers.cache_utils import DynamicCache

    from workers.hf.export import save_student
    from workers.hf.modeling_transformer_alloc import ATTENTION_KINDS as EXPORTED

    layers = tuple(x for x in kind_layers(positional) if x.attention in EXPORTED)
    arch = ArchConfig(d_model=D_MODEL, layers=layers, max_seq_len=T, positional=positional,
                      vocab_size=11)
    save_student(build_model(arch), tmp_path / "student")
    student = AutoModelForCausalLM.from_pretrained(tmp_path / "student", trust_remote_code=True)
    cache = DynamicCache(config=student.config)
    with torch.no_grad():
        student(torch.arange(T)[None] % 11, past_key_values=cache, use_cache=True)
    held = [(x.keys.shape[:3], x.keys.shape[-1] + x.values.shape[-1]) for x in cache.layers]
    assert held == [((1, 1, T), layer.kv_width) for layer in layers]
    assert sum(x.keys.numel() + x.values.numel() for x in cache.layers) == T * arch.kv_width


@pytest.mark.parametrize(("positional", "layer"), [c for c in CASES if c[1].kind.cut_keys],
                         ids=[case_id(*c) for c in CASES if c[1].kind.cut_keys])
def test_the_compression_plans_count_the_one_figure(positional: str, layer: LayerSpec) -> None:
    """A plan's teacher and student units per layer are ``LayerSpec.kv_width`` of the teacher's
    and the student's layers; a latent student's, its latent and RoPE parts."""
    groups = tuple(GroupPlan(g.count, g.qk_dim, g.v_dim, g.qk_dim // 2, {}, kv_heads=g.kv_heads,
                             reduced_v_dim=g.v_dim - 2 if layer.kind.cut_values else 0)
                   for g in layer.heads)
    plan = LayerPlan(0, layer.attention, layer.heads_str, 1.0, groups)
    student = LayerSpec(layer.attention, tuple(g.student for g in groups))
    assert plan.teacher_kv_units == layer.kv_width
    assert plan.student_kv_units == student.kv_width < layer.kv_width
    if layer.kind.to_latent:
        rope = 2 if positional == "rope" else 0
        latent = form_of(True, rope).layer_spec(layer, 5, positional, rope)
        assert latent.kv_width == 5 + layer.kv_heads * rope
