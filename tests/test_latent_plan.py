"""A latent student as the product builds it: ``workers.profile --rule loss --latent`` measures
what making each mhsa layer latent costs the sample's loss at each width (the student of that
cut alone, rebuilt here by hand) and chooses the widths under ``--kv-cache`` (the least summed
increase, checked by brute force); ``workers.compress`` writes the latent student, whole or
streamed, which ``transformers`` loads with our logits and whose KV cache and parameters are
the built modules'. Flags and plans that cannot work are refused in one line, before any
measuring."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from alloc.compression import (
    FORMS,
    CompressionPlan,
    GroupPlan,
    LayerPlan,
    plan_compression,
    plan_for_kv_cache,
    student_arch,
)
from arch import ArchConfig
from tests.helpers.llama import CASES, SEQ, VOCAB, build, ids, saved, token_folder
from workers.checkpoints import load
from workers.models.model import Model, count_params

transformers = pytest.importorskip("transformers")


def loss(model: Any, x: torch.Tensor, targets: torch.Tensor) -> float:
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(x).flatten(0, 1),
                                                       targets.flatten()))


def latent_at(arch: ArchConfig, i: int, width: int) -> ArchConfig:
    """``arch`` with layer ``i`` alone latent at ``width`` (keys turned after they are
    rebuilt)."""
    layers = list(arch.layers)
    layers[i] = dataclasses.replace(layers[i], attention="latent", latent_dim=width,
                                    rotate_latent=True)
    return dataclasses.replace(arch, layers=tuple(layers))


def test_each_layers_latent_losses_are_its_latent_students(tmp_path: Path) -> None:
    from workers.compression.measure import measure_model
    from workers.compression.students import build_student

    teacher = load(saved(build("llama", num_key_value_heads=2), tmp_path / "m"))
    x = ids()
    targets = torch.roll(x, -1, dims=1)
    measured = measure_model(teacher.model, x, SEQ, 4, "ids", targets, form="latent")
    base = loss(teacher.model, x, targets)
    for layer in measured.layers:
        widths = FORMS["latent"].widths(teacher.arch.layers[layer.index], teacher.arch.d_model, 4)
        assert layer.latent_losses is not None and sorted(layer.latent_losses) == widths
        assert layer.latent_losses[widths[-1]] == 0.0 and not layer.loss_increases
        scales = {layer.index: layer.input_scale}
        for width in (4, 24):
            student = build_student(teacher.model, latent_at(teacher.arch, layer.index, width),
                                    {}, scales)
            assert layer.latent_losses[width] == pytest.approx(
                loss(student, x, targets) - base, abs=1e-6)
    # the swapped attention went back: the teacher computes what it computed
    assert loss(teacher.model, x, targets) == base


def test_a_latent_plan_under_a_kv_budget_is_the_least_summed_increase() -> None:
    """The widths of ``plan_for_kv_cache`` on a latent plan equal the brute-force best: the
    least summed loss increase of widths whose cache fits the budget (non-latent layers
    whole)."""
    import numpy as np

    rng = np.random.default_rng(3)
    teacher = ArchConfig.from_dict({
        "d_model": 32, "vocab_size": 50, "max_seq_len": 16, "positional": "rope",
        "layers": [{"attention": kind, "heads": ["4x8"]}
                   for kind in ("mhsa", "mssa", "mhsa", "mhsa")]})
    for _ in range(20):
        measured_layers = []
        for i, spec in enumerate(teacher.layers):
            losses = None
            if spec.attention == "mhsa":
                widths = FORMS["latent"].widths(spec, teacher.d_model, 8)
                falls = np.sort(rng.random(len(widths)))[::-1] * rng.random()
                losses = {w: float(e) for w, e in zip(widths, falls)}
                losses[widths[-1]] = 0.0
            groups = tuple(GroupPlan(g.count, g.qk_dim, g.v_dim, g.qk_dim, {g.qk_dim: 0.0},
                                     kv_heads=g.kv_heads) for g in spec.heads)
            measured_layers.append(LayerPlan(i, spec.attention, spec.heads_str, 1.0, groups,
                                             latent_dim=max(losses) if losses else 0,
                                             latent_losses=losses))
        plan = CompressionPlan(teacher.arch_id, 16, 0.0, 8, "loss", tuple(measured_layers),
                               student_arch(teacher, measured_layers))
        fraction = float(rng.uniform(0.3, 1.0))
        got = plan_for_kv_cache(plan, fraction)
        latent = [p for p in plan.layers if p.latent_losses]
        fixed = teacher.kv_width - sum(x.kv_width for x in teacher.layers if x.attention == "mhsa")
        budget = int(fraction * teacher.kv_width + 1e-9) - fixed
        best = min(sum(p.latent_losses[w] for p, w in zip(latent, ws))  # type: ignore[index]
                   for ws in itertools.product(*(sorted(p.latent_losses or {}) for p in latent))
                   if sum(ws) <= budget)
        chosen = [p for p in got.layers if p.latent_dim]
        assert sum(p.latent_loss or 0.0 for p in chosen) == pytest.approx(best)
        assert got.student.kv_width <= fraction * teacher.kv_width + 1e-9
        assert got.student.layers[1] == teacher.layers[1]
        assert [x.latent_dim for x in got.student.layers if x.attention == "latent"] == [
            p.latent_dim for p in chosen]


@pytest.mark.usefixtures("remote_code_cache")
@pytest.mark.parametrize("case", ["llama-gqa", "qwen2"])
def test_profile_and_compress_a_latent_student(case: str, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from workers.compress import main as compress_main
    from workers.compression.fits import read_fits
    from workers.compression.students import build_student, pair_orders
    from workers.profile import main as profile_main

    kind, overrides = CASES[case]
    teacher = load(saved(build(kind, **overrides), tmp_path / "teacher"))
    token_folder(tmp_path / "tokens")
    paths = {k: str(tmp_path / k) for k in ("teacher", "tokens", "plan.yaml", "small", "flow")}
    data = ["--data", paths["tokens"], "--vocab-size", str(VOCAB), "--seq-len", str(SEQ)]
    assert profile_main(["--checkpoint", paths["teacher"], *data, "--align", "4",
                         "--sample-tokens", "1024", "--rule", "loss", "--latent",
                         "--kv-cache", "0.25", "--out", paths["plan.yaml"]]) == 0
    plan = CompressionPlan.from_yaml(Path(paths["plan.yaml"]).read_text())
    assert plan.form.latent and plan.reduces and plan.kv_cache == 0.25
    # fitted to second order by default, the maps beside the plan at the planned widths
    assert plan.latent_fit == "curvature" and plan.factors == "plan.factors.safetensors"
    fits = read_fits(plan, tmp_path)
    assert {i: up.shape[1] for i, (up, _) in fits.items()} == {
        layer.index: layer.latent_dim for layer in plan.layers if layer.latent_dim}
    assert all(x.attention == "latent" for x in plan.student.layers)
    assert plan.student.kv_width <= 0.25 * teacher.arch.kv_width
    assert "latent 64->" in capsys.readouterr().out
    assert compress_main(["--checkpoint", paths["teacher"], "--plan", paths["plan.yaml"], *data,
                          "--out", paths["small"], "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    ours = build_student(teacher.model, plan.student, pair_orders(plan), plan.input_scales(),
                         fits)
    small = transformers.AutoModelForCausalLM.from_pretrained(paths["small"],
                                                              trust_remote_code=True)
    with torch.no_grad():
        torch.testing.assert_close(small(ids()).logits, ours(ids()), atol=1e-5, rtol=1e-5)
    cached = sum(ours.block(i).attn.down.out_features for i in range(ours.arch.n_layers))
    assert report["kv_cache"]["student"] == 4 * cached == 4 * plan.student.kv_width
    assert report["params"]["student_total"] == count_params(ours)[1]
    assert report["qk_dims"][0]["student"].endswith(f"latent {plan.student.layers[0].latent_dim}")
    # evaluated after the cut on the held-out batches: no better than the teacher, to noise
    assert report["cut"]["loss"] >= report["teacher"]["loss"] - 1e-3
    # without data, the student is built and written one decoder layer at a time: the same
    assert compress_main(["--checkpoint", paths["teacher"], "--plan", paths["plan.yaml"],
                          "--out", paths["flow"], "--quiet"]) == 0
    streamed: Model = load(Path(paths["flow"])).model
    with torch.no_grad():
        torch.testing.assert_close(streamed(ids()), ours(ids()), atol=1e-5, rtol=1e-5)


def test_latent_flags_and_plans_that_cannot_work_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workers.compress import main as compress_main
    from workers.compression.measure import measure_model
    from workers.profile import main as profile_main

    folder = saved(build("llama", num_key_value_heads=2), tmp_path / "teacher")
    token_folder(tmp_path / "tokens")
    data = ["--data", str(tmp_path / "tokens"), "--vocab-size", str(VOCAB), "--seq-len",
            str(SEQ), "--align", "4"]
    capsys.readouterr()  # transformers' own progress of the save

    def refused(argv: list[str], main: Any = profile_main) -> str:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        return err

    assert "--latent: its widths are chosen by the loss rule; use --rule loss or leave --rule " \
        "out (got --rule measured)" in refused(["--checkpoint", str(folder), *data, "--latent",
                                                "--rule", "measured"])
    # 2 layers of 64 units at the smallest width 4: 8 of 128; refused before measuring
    assert "--kv-cache 0.05: must be in [0.0625, 1]: the smallest latent widths" in refused(
        ["--checkpoint", str(folder), *data, "--rule", "loss", "--latent", "--kv-cache", "0.05"])
    teacher = load(folder)
    x = ids()
    plan = plan_compression(measure_model(teacher.model, x, SEQ, 4, "ids",
                                          torch.roll(x, -1, dims=1), form="latent"), -1.0, "loss")
    assert [x.latent_dim for x in plan.student.layers] == [64, 64]  # no cut within -1
    path = tmp_path / "plan.yaml"
    path.write_text(plan.to_yaml())
    assert "the teacher's stock layout cannot hold" in refused(
        ["--checkpoint", str(folder), "--plan", str(path), "--out", str(tmp_path / "s"),
         "--layout", "stock"], compress_main)
    wide = dataclasses.replace(plan, student=latent_at(teacher.arch, 0, 72))
    path.write_text(wide.to_yaml())
    assert "layer 0 caches a latent of 72, above the rank of its keys and values (64)" in \
        refused(["--checkpoint", str(folder), "--plan", str(path), "--out",
                 str(tmp_path / "s")], compress_main)
    assert not (tmp_path / "s").exists()
