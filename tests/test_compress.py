"""Checkpoint profiles and SVD students: a full-rank student is the teacher, the loss grows as
the rank shrinks, every head's attention error stays under the bound the plan predicted, and a
GPT-2 checkpoint written by ``transformers`` loads, profiles, compresses and loads back there."""

from __future__ import annotations

import functools
import itertools
import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from alloc.compression import CompressionError, CompressionPlan, MeasureRequest, plan_compression
from arch import ArchConfig, HeadGroup, LayerSpec, TrainConfig, param_count
from common.errors import UsageError
from common.files import dump_yaml
from userdata import DataSpec, TaskSpec
from workers.checkpoints import CheckpointError, gpt2_arch, load
from workers.compress import main as compress_main
from workers.compression.compressor import CompressRequest, compress
from workers.compression.heads import head_maps
from workers.compression.measure import measure_checkpoint, measure_model
from workers.compression.recording import record_attention
from workers.compression.students import build_student, svd_factors
from workers.models.attention import future_mask
from workers.models.model import Model, build_model
from workers.profile import main as profile_main
from workers.tasks import make_data_task
from workers.training.trainer import Trainer, evaluate


@functools.cache
def corpus(folder: str) -> Path:
    path = Path(folder) / "corpus"
    path.mkdir(parents=True, exist_ok=True)
    for source in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:20]:
        (path / f"{source.stem}.txt").write_text(source.read_text())
    return path


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> tuple[Model, Path, torch.Tensor]:
    """A small byte LM trained for a few hundred steps, its checkpoint and a data sample."""
    folder = tmp_path_factory.mktemp("teacher")
    task = make_data_task(DataSpec(str(corpus(str(folder)))), length=32)
    layer = LayerSpec("mhsa", (HeadGroup(4, 16),), mlp_ratio=2.0)
    arch = ArchConfig(d_model=64, layers=(layer, layer), max_seq_len=32, vocab_size=256)
    trainer = Trainer(arch, task, TrainConfig(steps=300, batch_size=32, lr=3e-3, eval_every=300,
                                              device="cpu"), checkpoint=folder / "lm.pt")
    trainer.run()
    return trainer.model.eval(), folder, task.batch("val", 0, 16).x


def uniform(arch: ArchConfig, rank: int) -> ArchConfig:
    layers = [LayerSpec("mhsa", (HeadGroup(4, rank, 16),), mlp_ratio=2.0)] * arch.n_layers
    return ArchConfig.from_dict({**arch.to_dict(), "layers": [x.to_dict() for x in layers]})


def test_a_full_rank_student_is_the_teacher(teacher: tuple[Model, Path, torch.Tensor]) -> None:
    """At full rank the SVD factors refactor each head's query-key map exactly, and a student
    that cuts nothing is the teacher."""
    model, _, x = teacher
    for head in head_maps(model):
        rank = head.a.shape[1]
        a, b = svd_factors(torch.from_numpy(head.a), torch.from_numpy(head.b), rank)
        torch.testing.assert_close(a @ b.T / rank ** 0.5, torch.from_numpy(head.matrix))
    student = build_student(model, model.arch)
    with torch.no_grad():
        assert torch.allclose(student(x), model(x), atol=1e-5)


def test_the_loss_grows_as_the_rank_shrinks(teacher: tuple[Model, Path, torch.Tensor]) -> None:
    model, folder, _ = teacher
    task = make_data_task(DataSpec(str(corpus(str(folder)))), length=32)
    config = TrainConfig(eval_batches=8, batch_size=32)
    losses = [evaluate(build_student(model, uniform(model.arch, r)), task, config, "cpu")[0]
              for r in (16, 12, 8, 4, 2, 1)]
    assert losses[0] == pytest.approx(evaluate(model, task, config, "cpu")[0], abs=1e-5)
    assert all(b >= a - 1e-4 for a, b in itertools.pairwise(losses)), losses
    assert losses[-1] > losses[0] + 0.01


def test_each_heads_attention_error_is_under_its_predicted_bound(
        teacher: tuple[Model, Path, torch.Tensor]) -> None:
    model, _, x = teacher
    plan = plan_compression(measure_model(model, x, 32, align=4, sample="sample"),
                            tolerance=0.02, rule="measured")
    reduced = plan.student
    assert reduced != model.arch  # the measured rule reduces something at this tolerance
    student = build_student(model, reduced)
    teacher_z = record_attention(model, x, reduce=lambda z: z).groups
    student_z = record_attention(student, x, reduce=lambda z: z).groups
    inputs = record_attention(model, x).inputs
    for i, layer in enumerate(plan.layers):
        (group,) = layer.groups
        r = group.reduced_qk_dim
        # The student's own model, layer by layer with the teacher's inputs: its change of
        # attention weights, head by head, against the bound the plan predicted.
        errors = []
        for h, head in enumerate(m for m in head_maps(model) if m.layer == i):
            mask = future_mask(x.shape[1])
            xd = inputs[i].double()
            u, s, vh = torch.linalg.svd(torch.from_numpy(head.matrix))
            z = xd @ (u[:, :r] * s[:r] @ vh[:r]) @ xd.transpose(-1, -2)
            low = torch.softmax(z.masked_fill(mask, float("-inf")), -1)
            full = torch.softmax(teacher_z[i][0][:, h].double(), -1)
            errors.append(float((full - low).abs().max()))
            assert errors[-1] <= group.error_bounds[r] + 1e-9
        assert group.measured_errors is not None
        assert max(errors) == pytest.approx(group.measured_errors[r], abs=1e-6)
        if i == 0:  # layer 0 sees the same input in the student model itself
            seen = (torch.softmax(student_z[0][0].double(), -1)
                    - torch.softmax(teacher_z[0][0].double(), -1)).abs().amax((0, 2, 3))
            assert float(seen.max()) <= group.error_bounds[r] + 1e-9


def test_profile_and_compress_our_checkpoint(teacher: tuple[Model, Path, torch.Tensor],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    _, folder, _ = teacher
    data = str(corpus(str(folder)))
    assert profile_main(["--checkpoint", str(folder / "lm.pt"), "--data", data, "--align", "4",
                         "--tolerance", "0.02", "--out", str(folder / "plan.yaml"),
                         "--plot", str(folder / "heads.png")]) == 0
    assert "qk_dim plan" in capsys.readouterr().out
    assert compress_main(["--checkpoint", str(folder / "lm.pt"), "--plan",
                          str(folder / "plan.yaml"), "--data", data, "--out",
                          str(folder / "student.pt"), "--finetune-steps", "20",
                          "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["params"]["student"] < report["params"]["teacher"]
    assert {"teacher", "cut", "finetuned"} <= set(report)
    plan = yaml.safe_load((folder / "plan.yaml").read_text())
    loaded = load(folder / "student.pt")  # a workers.train checkpoint of the student
    assert loaded.arch.to_dict() == plan["student"]
    assert ArchConfig.from_yaml((folder / "student.arch.yaml").read_text()) == loaded.arch


def test_compress_from_python_is_the_command(teacher: tuple[Model, Path, torch.Tensor],
                                            tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``compress`` takes a typed request and returns a typed result, whose ``to_dict`` is the
    report ``python -m workers.compress --format json`` prints for the same flags; a request
    out of the flags' ranges is refused in one line naming every field."""
    _, folder, _ = teacher
    data = DataSpec(str(corpus(str(folder))))
    sample = TaskSpec(data=data)
    measured = measure_checkpoint(MeasureRequest(folder / "lm.pt", align=4, task=sample,
                                                 sample_tokens=2048, quiet=True))
    (tmp_path / "plan.yaml").write_text(plan_compression(measured, tolerance=0.02).to_yaml())
    out = tmp_path / "student.pt"
    result = compress(CompressRequest(folder / "lm.pt", tmp_path / "plan.yaml", out, task=sample,
                                      finetune_steps=2, quiet=True))
    assert result.reduces and result.params.student_total < result.params.teacher_total
    assert result.written == (out, out.with_suffix(".arch.yaml"))
    assert result.cut_eval is not None and result.finetuned_eval is not None
    assert load(out).arch == ArchConfig.from_yaml(out.with_suffix(".arch.yaml").read_text())
    assert compress_main(["--checkpoint", str(folder / "lm.pt"), "--plan",
                          str(tmp_path / "plan.yaml"), "--data", data.path, "--out", str(out),
                          "--finetune-steps", "2", "--force", "--quiet", "--format",
                          "json"]) == 0
    printed, returned = json.loads(capsys.readouterr().out), result.to_dict()
    for report in (printed, returned):  # the same but for the time the fine-tune took
        assert report["finetune"].pop("wall_s") > 0 and report["finetune"].pop("cpu_s") > 0
    assert printed == returned
    with pytest.raises(UsageError, match=r"finetune_steps = -1: .*; lr = 0\.0: must be a") as err:
        CompressRequest(folder / "lm.pt", tmp_path / "plan.yaml", out, finetune_steps=-1,
                        lr=0.0)
    assert "\n" not in str(err.value)


def test_token_files_take_the_checkpoints_vocabulary(
        teacher: tuple[Model, Path, torch.Tensor], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """nanoGPT .bin tokens without a meta file whose largest token is below the model's
    vocabulary feed the model as they are (its vocabulary is the obvious one), no
    --vocab-size needed; the result is the text corpus's."""
    _, folder, _ = teacher
    text = b"".join(f.read_bytes() for f in sorted(corpus(str(folder)).glob("*.txt")))
    raw = np.frombuffer(text, dtype=np.uint8).astype(np.uint16)
    assert raw.max() < 255
    bins = tmp_path / "tokens"
    bins.mkdir()
    cut = int(0.9 * len(raw))
    raw[:cut].tofile(bins / "train.bin")
    raw[cut:].tofile(bins / "val.bin")
    assert profile_main(["--checkpoint", str(folder / "lm.pt"), "--data", str(bins),
                         "--sample-tokens", "2048", "--align", "4", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["layers"]


def test_bad_inputs_are_one_line(teacher: tuple[Model, Path, torch.Tensor], tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    _, folder, _ = teacher
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    import datetime

    torch.save({"arch": {}, "model": {}, "when": datetime.datetime(2026, 1, 1)},
               tmp_path / "unsafe.pt")
    (tmp_path / "folder").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{")
    (tmp_path / "broken" / "model.safetensors").write_bytes(b"")
    other = plan_compression(measure_model(build_student(teacher[0], uniform(teacher[0].arch, 8)),
                                           None, 32, align=4), tolerance=0.05)
    (tmp_path / "other.yaml").write_text(other.to_yaml())
    measured = measure_checkpoint(MeasureRequest(folder / "lm.pt", align=4, quiet=True))
    plan = plan_compression(measured, tolerance=0.05).to_dict()
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    wider = LayerSpec("mhsa", (HeadGroup(2, 16, 32),), mlp_ratio=2.0)  # values changed too
    edited = {**plan, "student": {**plan["student"], "layers": [wider.to_dict()] * 2}}
    (tmp_path / "notaplan.yaml").write_text(yaml.safe_dump({**plan, "layers": "?"}))
    (tmp_path / "edited.yaml").write_text(dump_yaml(edited))
    ours = ["--checkpoint", str(folder / "lm.pt"), "--plan", str(tmp_path / "plan.yaml"),
            "--out", str(tmp_path / "s.pt")]
    nope = str(tmp_path / "nope.pt")  # the library names the field, the command its flag
    with pytest.raises(CheckpointError, match=r"^checkpoint '.*': no such file"):
        load(tmp_path / "nope.pt")
    cases = [(profile_main, ["--checkpoint", nope], f"--checkpoint {nope!r}: no such file"),
             (profile_main, ["--checkpoint", str(tmp_path / "junk.pt")], "unknown layout"),
             (profile_main, ["--checkpoint", str(tmp_path / "folder")], "unknown layout"),
             (profile_main, ["--checkpoint", str(tmp_path / "unsafe.pt")], "refused as unsafe"),
             (profile_main, ["--checkpoint", str(tmp_path / "broken")], "unreadable"),
             (compress_main, ["--checkpoint", str(folder / "lm.pt"), "--plan",
                              str(tmp_path / "other.yaml"), "--out", str(tmp_path / "s.pt")],
              "a plan for model"),
             (compress_main, [*ours[:3], str(tmp_path / "edited.yaml"), *ours[4:]],
              "a plan may only lower qk_dim"),
             (compress_main, [*ours[:3], str(tmp_path / "notaplan.yaml"), *ours[4:]],
              "not a checkpoint profile"),
             (profile_main, ["--checkpoint", str(folder / "lm.pt"), "--task", "nosuch"],
              "unknown task 'nosuch'"),
             (profile_main, ["--data", str(corpus(str(folder))), "--task", "lm"],
              "--task: only with --checkpoint"),
             (compress_main, [*ours, "--task", "modadd"],
              "--task modadd: vocab_size 600, the checkpoint's model has 256"),
             (compress_main, [*ours, "--data", str(corpus(str(folder))), "--seq-len", "16"],
              "windows of 16 tokens"),
             (compress_main, [*ours[:5], str(tmp_path / "missing" / "s.pt")],
              "does not exist")]
    for main, argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "s.pt").exists()


def test_gpt2_options_the_model_does_not_implement_are_refused() -> None:
    config = {"n_embd": 32, "n_head": 2, "n_layer": 1, "n_positions": 16, "vocab_size": 64}
    assert gpt2_arch(config).tie_embeddings
    for key, value in (("tie_word_embeddings", False), ("scale_attn_by_inverse_layer_idx", True),
                       ("layer_norm_epsilon", 1e-6)):
        with pytest.raises(CheckpointError, match=key):
            gpt2_arch({**config, key: value})


def test_a_rope_model_is_refused_not_mismeasured() -> None:
    """RoPE rotates queries and keys between the two maps: no single W_Q W_K^T describes a
    head, so profiling one by SVD would be wrong, not approximate."""
    layer = LayerSpec("mhsa", (HeadGroup(2, 16),))
    model = build_model(ArchConfig(d_model=32, layers=(layer,), max_seq_len=8, vocab_size=16,
                                   positional="rope"))
    with pytest.raises(CompressionError, match="rope"):
        head_maps(model)[0].singular_values()


@pytest.mark.usefixtures("remote_code_cache")
def test_a_gpt2_checkpoint_written_by_transformers(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A GPT-2 folder saved by transformers is read exactly, profiled and compressed; the
    student folder (default, compact) loads through ``AutoModelForCausalLM`` with
    ``trust_remote_code`` at its reduced shapes, its safetensors smaller by exactly the cut
    parameters; ``--layout stock`` loads in stock GPT-2 and says it is not smaller."""
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (pip install -e '.[test]')")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                     vocab_size=64, bos_token_id=0, eos_token_id=0)
    reference = transformers.GPT2LMHeadModel(config).eval()
    reference.save_pretrained(tmp_path / "gpt2")
    loaded = load(tmp_path / "gpt2")
    x = torch.randint(0, 64, (3, 40))
    with torch.no_grad():  # our forward of the loaded weights is GPT-2's
        assert torch.allclose(loaded.model(x), reference(x).logits, atol=1e-5)
    tokens = np.random.default_rng(0).integers(0, 64, 20_000, dtype=np.uint16)
    (tmp_path / "data").mkdir()
    tokens[:18_000].tofile(tmp_path / "data" / "train.bin")
    tokens[18_000:].tofile(tmp_path / "data" / "val.bin")
    data = str(tmp_path / "data")
    assert profile_main(["--checkpoint", str(tmp_path / "gpt2"), "--data", data, "--align", "2",
                         "--tolerance", "0.5", "--seq-len", "32", "--out",
                         str(tmp_path / "plan.yaml")]) == 0
    capsys.readouterr()
    common = ["--checkpoint", str(tmp_path / "gpt2"), "--plan", str(tmp_path / "plan.yaml"),
              "--data", data, "--vocab-size", "64", "--format", "json",
              "--seq-len", "32"]  # shorter than the model's positions: measured, not trained
    assert compress_main([*common, "--out", str(tmp_path / "student")]) == 0
    report = json.loads(capsys.readouterr().out)
    plan = yaml.safe_load((tmp_path / "plan.yaml").read_text())
    student_arch = ArchConfig.from_dict(plan["student"])
    assert student_arch != loaded.arch  # some head lost query-key rank
    ours = build_student(loaded.model, student_arch)
    compact = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "student",
                                                                trust_remote_code=True)
    with torch.no_grad():  # transformers runs the student we wrote, at its real shapes
        torch.testing.assert_close(compact(x).logits, ours(x), atol=1e-5, rtol=1e-5)
    shapes = {k: v.shape for k, v in compact.state_dict().items()}
    assert shapes == {k: v.shape for k, v in ours.state_dict().items()}
    assert any(shapes[f"blocks.{i}.attn.qkv.weight"][0] < 3 * 32 for i in range(2))
    cut = param_count(loaded.arch).total - param_count(student_arch).total
    assert report["params"]["teacher_total"] - report["params"]["student_total"] == cut > 0
    # float32 weights: the file shrinks by the cut parameters' bytes, give or take the headers
    shrink = report["files"]["teacher"] - report["files"]["student"]
    assert abs(shrink - 4 * cut) < 2_000
    assert compress_main([*common, "--out", str(tmp_path / "stock"), "--layout", "stock",
                          "--format", "table"]) == 0
    assert "NOT smaller" in capsys.readouterr().out
    back = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "stock").eval()
    with torch.no_grad():  # stock transformers runs the padded student exactly
        torch.testing.assert_close(back(x).logits, ours(x), atol=1e-5, rtol=1e-5)
    assert (tmp_path / "stock" / "model.safetensors").stat().st_size == (
        tmp_path / "gpt2" / "model.safetensors").stat().st_size
    # the student is the per-layer plan: each group's qk_dim is the one the profile chose
    assert [[g.qk_dim for g in layer.heads] for layer in student_arch.layers] == [
        [g["reduced_qk_dim"] for g in layer["groups"]] for layer in plan["layers"]]


def test_a_plan_round_trips_through_yaml(teacher: tuple[Model, Path, torch.Tensor]) -> None:
    model, _, x = teacher
    plan = plan_compression(measure_model(model, x, 32, align=4, sample="sample"),
                            tolerance=0.02, rule="measured")
    back = CompressionPlan.from_yaml(plan.to_yaml())
    assert back == plan and back.student == plan.student and back.reduces
    assert back.layers[0].groups[0].measured_error == plan.layers[0].groups[0].measured_error


def test_the_trainer_profile_and_compress_chain_on_a_task(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The commands a user chains share their task flags: a model trained on ``--task lm
    --smoke-test`` is profiled and compressed with the same flags, in windows of its length."""
    from alloc.solve import main as solve_main
    from workers.train import main as train_main

    arch, ckpt, plan, out = (str(tmp_path / n) for n in ("A", "c.pt", "plan.yaml", "s.pt"))
    # The attention-only rule's plan: four heads of 16 per layer, qk_dim 8 in later layers.
    assert solve_main(["--budget", "64", "--layers", "3", "--vocab-size", "64", "--out",
                       arch, "--product-order", "1"]) == 0
    task = ["--task", "lm", "--smoke-test"]
    assert train_main(["--arch", arch, *task, "--out", ckpt, "--quiet"]) == 0
    assert profile_main(["--checkpoint", ckpt, *task, "--out", plan]) == 0
    assert "sample: --task lm" in capsys.readouterr().out
    assert compress_main(["--checkpoint", ckpt, "--plan", plan, *task, "--out", out,
                          "--format", "json"]) == 0
    printed = capsys.readouterr()
    report = json.loads(printed.out)
    assert report["task"] == "lm" and "cut" in report
    assert report["plan"]["reduces"] and "as large as the teacher" not in printed.err
    # Weights are compared with weights: the teacher's .pt also holds AdamW's state (twice its
    # weights), which must not count, so bytes shrink as the parameters do.
    files, params = report["files"], report["params"]
    assert files["student"] / files["teacher"] == pytest.approx(
        params["student_total"] / params["teacher_total"], rel=0.01)
    assert f"workers.compress: wrote {out}" in printed.err
    # Without a sample, the profile says in one line that it can plan no reduction (also with
    # --quiet, which silences only the progress), and compress says that the student is not
    # smaller.
    assert profile_main(["--checkpoint", ckpt, "--out", plan, "--format", "json",
                         "--quiet"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "no reduction can be planned without data" in err[0]
    assert err[1] == f"workers.profile: wrote {plan}"
    assert compress_main(["--checkpoint", ckpt, "--plan", plan, *task, "--out", out]) == 2
    assert "exists; pass --force to overwrite it" in capsys.readouterr().err  # a checkpoint
    with pytest.raises(UsageError, match=r"^out '.*: exists; pass force to overwrite it"):
        compress(CompressRequest(Path(ckpt), Path(plan), Path(out)))  # the library's fields
    assert compress_main(["--checkpoint", ckpt, "--plan", plan, *task, "--out", out,
                          "--force"]) == 0
    assert "the student is as large as the teacher" in capsys.readouterr().err


@pytest.mark.parametrize("rule", ["loss", "measured"])
def test_a_kv_cache_budget_plan_is_the_brute_force_optimum(rule: str) -> None:
    """``plan_for_kv_cache`` picks, per head group, the candidate qk_dims that fit the budget
    and minimise the sum of loss increases (``loss``) or the largest error (otherwise, ties by
    the sum): equal to trying every combination."""
    from alloc.compression import GroupPlan, LayerPlan, plan_for_kv_cache

    rng = np.random.default_rng(0)
    teacher = ArchConfig(d_model=32, max_seq_len=8, vocab_size=16, layers=tuple(
        LayerSpec("mhsa", (HeadGroup(4, 16, kv_heads=kv),)) for kv in (1, 2, 4)))
    for _trial in range(20):
        layers = []
        for i, spec in enumerate(teacher.layers):
            g = spec.heads[0]
            errors = dict(zip((4, 8, 12, 16), [*sorted(rng.random(3), reverse=True), 0.0]))
            layers.append(LayerPlan(i, "mhsa", spec.heads_str, 1.0, (GroupPlan(
                4, 16, 16, 16, errors, errors if rule == "measured" else None,
                errors if rule == "loss" else None, g.kv_heads),)))
        plan = CompressionPlan("x", 8, 0.1, 4, rule, tuple(layers),  # type: ignore[arg-type]
                               teacher)
        fraction = float(rng.uniform(0.65, 1.0))
        chosen = plan_for_kv_cache(plan, fraction)
        units = [g.key_heads * (16 + 16) for layer in layers for g in layer.groups]
        budget = int(fraction * sum(units))
        best = None
        for dims in itertools.product((4, 8, 12, 16), repeat=3):
            kv = sum(k * (d + 16) for k, d in zip((1, 2, 4), dims))
            if kv > budget:
                continue
            errs = [layers[i].groups[0].error_bounds[d] for i, d in enumerate(dims)]
            key = (sum(errs),) if rule == "loss" else (max(errs), sum(errs))
            best = key if best is None or key < best else best
        got = [layer.groups[0].reduced_qk_dim for layer in chosen.layers]
        errs = [layers[i].groups[0].error_bounds[d] for i, d in enumerate(got)]
        assert sum(k * (d + 16) for k, d in zip((1, 2, 4), got)) <= budget
        assert ((sum(errs),) if rule == "loss" else (max(errs), sum(errs))) == pytest.approx(best)
        assert [g.qk_dim for x in chosen.student.layers for g in x.heads] == got
        assert chosen.kv_cache == fraction


def test_a_kv_cache_budget_counts_the_layers_it_cannot_cut() -> None:
    """An mssa layer's cache is part of the teacher's and of every student's: the student of
    ``--kv-cache F`` caches at most F of the teacher's whole KV cache; a model with nothing to
    cut is refused in one line."""
    from alloc.compression import GroupPlan, LayerPlan, plan_for_kv_cache

    mhsa = LayerSpec("mhsa", (HeadGroup(4, 16, kv_heads=2),))
    mssa = LayerSpec("mssa", (HeadGroup(2, 16),))
    teacher = ArchConfig(d_model=32, max_seq_len=8, vocab_size=16, layers=(mhsa, mssa))
    errors = {4: 0.5, 8: 0.2, 12: 0.1, 16: 0.0}
    layers = (LayerPlan(0, "mhsa", "4x16kv2", 1.0, (GroupPlan(4, 16, 16, 16, errors, None,
                                                              errors, 2),)),
              LayerPlan(1, "mssa", "2x16", 1.0))
    plan = CompressionPlan("x", 8, 0.1, 4, "loss", layers, teacher)
    for fraction in (0.8, 0.9, 1.0):
        student = plan_for_kv_cache(plan, fraction).student
        assert student.kv_width <= fraction * teacher.kv_width
    with pytest.raises(CompressionError, match="must be in") as err:
        plan_for_kv_cache(plan, 0.5)
    # the library names the plan's field; workers.profile shows it as --kv-cache (below)
    assert [p.field for p in err.value.broken] == ["kv_cache"]
    assert str(err.value).startswith("kv_cache 0.5: must be in") and "--" not in str(err.value)
    only = ArchConfig(d_model=32, max_seq_len=8, vocab_size=16, layers=(mssa,))
    nothing = CompressionPlan("x", 8, 0.1, 4, "loss", (LayerPlan(0, "mssa", "2x16", 1.0),), only)
    with pytest.raises(CompressionError, match="no query-key heads"):
        plan_for_kv_cache(nothing, 0.9)


def test_the_kv_cache_floor_follows_from_the_architecture() -> None:
    """``kv_cache_floor(teacher, align)`` is the least budget a plan accepts: exactly at the
    floor a plan is made, just below it both the plan and the preflight refuse."""
    from alloc.compression import (
        GroupPlan,
        LayerPlan,
        check_kv_cache,
        kv_cache_floor,
        plan_for_kv_cache,
    )

    mhsa = LayerSpec("mhsa", (HeadGroup(4, 16, kv_heads=2),))
    mssa = LayerSpec("mssa", (HeadGroup(2, 16),))
    teacher = ArchConfig(d_model=32, max_seq_len=8, vocab_size=16, layers=(mhsa, mssa))
    errors = {4: 0.5, 8: 0.2, 12: 0.1, 16: 0.0}
    plan = CompressionPlan("x", 8, 0.1, 4, "loss", (
        LayerPlan(0, "mhsa", "4x16kv2", 1.0, (GroupPlan(4, 16, 16, 16, errors, None, errors,
                                                        2),)),
        LayerPlan(1, "mssa", "2x16", 1.0)), teacher)
    floor = kv_cache_floor(teacher, 4)
    # the values (2 x 16) and the mssa layer (2 x 16) stay; keys go from 2 x 16 to 2 x 4
    assert floor == (2 * 16 + 2 * 16 + 2 * 4) / (2 * 32 + 2 * 16)
    assert plan_for_kv_cache(plan, floor).student.kv_width == round(floor * teacher.kv_width)
    check_kv_cache(teacher, 4, floor)
    for refuse in (lambda f: plan_for_kv_cache(plan, f), lambda f: check_kv_cache(teacher, 4, f)):
        with pytest.raises(CompressionError, match=f"must be in \\[{floor:.3g}, 1\\]"):
            refuse(floor - 0.01)


def test_a_kv_cache_below_the_floor_is_refused_before_measuring(
        teacher: tuple[Model, Path, torch.Tensor], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import workers.compression.measure

    _, folder, _ = teacher

    def measured(*_: object) -> None:
        raise AssertionError("measured before the budget was checked")

    monkeypatch.setattr(workers.compression.measure, "measure_for_plan", measured)
    argv = ["--checkpoint", str(folder / "lm.pt"), "--task", "lm", "--smoke-test",
            "--rule", "loss", "--align", "4", "--kv-cache"]
    # the loss rule cuts keys and values: 4 heads x (4 + 4) of 4 x (16 + 16) units per layer
    assert profile_main([*argv, "0.2"]) == 2
    err = capsys.readouterr().err
    assert "--kv-cache 0.2: must be in [0.25, 1]" in err and err.count("\n") == 1
    measured_rule = [a if a != "loss" else "measured" for a in argv]  # keys only
    assert profile_main([*measured_rule, "0.5"]) == 2
    assert "must be in [0.625, 1]" in capsys.readouterr().err
    with pytest.raises(AssertionError, match="measured before"):
        profile_main([*argv, "0.7"])  # within the floor: on to the measurement


def test_the_values_svd_is_the_best_rank_r_map_of_the_weighted_product() -> None:
    """``value_factors``: ``C F E Y`` is the truncated SVD of ``C Y`` (its error the tail of
    the singular values, Eckart-Young), and at full rank ``F E`` is the identity; a value
    dim the sample never excites (scale 0) costs nothing to drop."""
    from workers.compression.students import value_factors

    g = torch.Generator().manual_seed(0)
    v, d = 8, 20
    values = torch.randn(v, d + 1, generator=g, dtype=torch.float64)
    outputs = [torch.randn(d, v, generator=g, dtype=torch.float64) for _ in range(3)]
    scale = torch.rand(d + 1, generator=g, dtype=torch.float64) + 0.1
    product = torch.cat(outputs) @ (values * scale)
    sigma = torch.linalg.svdvals(product)
    for rank in range(1, v + 1):
        e, f = value_factors(values, outputs, scale, rank)
        error = torch.linalg.matrix_norm(product - torch.cat(outputs) @ f @ e @ (values * scale))
        assert float(error) == pytest.approx(float(sigma[rank:].pow(2).sum().sqrt()), abs=1e-9)
    e, f = value_factors(values, outputs, scale, v)
    torch.testing.assert_close(f @ e, torch.eye(v, dtype=torch.float64))
    silent = torch.cat([values[:, :4], torch.zeros(v, d - 3, dtype=torch.float64)], dim=1)
    e, f = value_factors(silent, outputs, None, 4)  # rank 4: what the inputs reach
    torch.testing.assert_close(torch.cat(outputs) @ f @ e @ silent, torch.cat(outputs) @ silent)


def test_one_kv_budget_for_keys_and_values_is_the_brute_force_optimum() -> None:
    """With the loss rule and measured values, ``plan_for_kv_cache`` picks every group's
    ``qk_dim`` and ``v_dim`` together: the least sum of loss increases within the budget, equal
    to trying every combination."""
    from alloc.compression import GroupPlan, LayerPlan, plan_for_kv_cache

    rng = np.random.default_rng(1)
    dims = (4, 8, 12, 16)
    teacher = ArchConfig(d_model=32, max_seq_len=8, vocab_size=16, layers=tuple(
        LayerSpec("mhsa", (HeadGroup(4, 16, kv_heads=kv),)) for kv in (1, 2)))
    for _trial in range(20):
        layers = []
        for i, spec in enumerate(teacher.layers):
            keys, values = ({d: float(e) for d, e in zip(dims, [*sorted(rng.random(3),
                                                                       reverse=True), 0.0])}
                            for _ in range(2))
            layers.append(LayerPlan(i, "mhsa", spec.heads_str, 1.0, (GroupPlan(
                4, 16, 16, 16, keys, None, keys, spec.heads[0].kv_heads, 16, values),)))
        plan = CompressionPlan("x", 8, 0.1, 4, "loss", tuple(layers), teacher)
        fraction = float(rng.uniform(0.3, 1.0))
        chosen = plan_for_kv_cache(plan, fraction)
        budget = int(fraction * teacher.kv_width)
        best = min(
            sum(layers[i].groups[0].error_bounds[q] + (layers[i].groups[0].value_losses or {})[v]
                for i, (q, v) in enumerate(pairs))
            for pairs in itertools.product(itertools.product(dims, dims), repeat=2)
            if sum(kv * (q + v) for kv, (q, v) in zip((1, 2), pairs)) <= budget)
        got = [(g.reduced_qk_dim, g.student_v_dim) for x in chosen.layers for g in x.groups]
        assert sum(g.loss_increase + g.value_loss for x in chosen.layers  # type: ignore[operator]
                   for g in x.groups) == pytest.approx(best)
        assert chosen.student.kv_width <= budget
        assert [(g.qk_dim, g.v_dim) for x in chosen.student.layers for g in x.heads] == got


def test_the_loss_rules_plot_draws_its_tolerance_on_the_loss_axis(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With ``--rule loss`` the errors' panel is in nats per token, and the tolerance (in nats)
    is drawn there, on the axis of the loss increases, not of attention weights."""
    import alloc.compression.render as render
    from alloc.compression import GroupPlan, LayerPlan

    drawn: list[object] = []
    monkeypatch.setattr(render, "write_figure", lambda fig, _path: drawn.append(fig))
    teacher = ArchConfig(d_model=32, max_seq_len=8, vocab_size=16,
                         layers=(LayerSpec("mhsa", (HeadGroup(4, 16),)),))
    losses = {4: 0.3, 8: 0.05, 12: 0.01, 16: 0.0}
    plan = CompressionPlan("x", 8, 0.02, 4, "loss", (LayerPlan(0, "mhsa", "4x16", 1.0, (
        GroupPlan(4, 16, 16, 12, {r: 0.9 for r in losses}, None, losses),)),), teacher)
    render.plot_plan(plan, tmp_path / "heads.png")
    errors = drawn[0].axes[2]  # type: ignore[attr-defined]
    assert errors.get_ylabel() == "sample loss increase (nats per token)"
    lines = {line.get_label(): line for line in errors.get_lines()}
    assert list(lines["tolerance 0.02"].get_ydata()) == [0.02, 0.02]
    assert max(lines["layer 0"].get_ydata()) == 0.3  # the loss increases, not the bounds


def test_head_statistics_are_the_float64_definition() -> None:
    """Each head's logit bound and mean entropy over ``ln N`` (rows with at least two keys),
    computed in float32 from log-probabilities, equal the float64 definition to 1e-6, from
    flat to sharp (logits up to 1e3) attention."""
    from workers.compression.recording import head_statistics
    from workers.models.attention import future_mask

    gen = torch.Generator().manual_seed(0)
    scales = torch.tensor([0.01, 1.0, 30.0, 1000.0])[None, :, None, None]
    z = torch.randn(3, 4, 40, 40, generator=gen) * scales
    z = z.masked_fill(future_mask(40), float("-inf"))
    bound, entropy = head_statistics(z)
    p = torch.softmax(z.double(), -1)
    h = -(p * p.clamp_min(1e-300).log()).sum(-1)  # (B, H, T)
    keys = torch.arange(1, 41, dtype=torch.float64)
    expected = (h[..., 1:] / keys[1:].log()).mean(dim=(0, 2))  # row 0 sees one key
    assert entropy == pytest.approx(expected.numpy(), abs=1e-6)
    assert bound == pytest.approx(z.masked_fill(z.isinf(), 0).abs().amax((0, 2, 3)).numpy())


def scored_windows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The windows each chunk the trainer's ``measure`` scores holds, as it scores them."""
    from workers.training import trainer

    seen: list[int] = []
    score = trainer._score

    def counting(model: torch.nn.Module, task: object, part: object, device: str
                 ) -> tuple[float, int, float, int]:
        seen.append(len(part.x))  # type: ignore[attr-defined]
        return score(model, task, part, device)  # type: ignore[arg-type]

    monkeypatch.setattr(trainer, "_score", counting)
    return seen


def test_compress_scores_a_bounded_sample_by_default(
        teacher: tuple[Model, Path, torch.Tensor], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Each evaluation scores ``ceil(EVAL_TOKENS / seq_len)`` windows of the eval batches, not
    every one of them; ``--eval-tokens`` changes the count (``all``: every window)."""
    from workers.compression import EVAL_TOKENS

    _, folder, _ = teacher
    data = DataSpec(str(corpus(str(folder))))
    measured = measure_checkpoint(MeasureRequest(folder / "lm.pt", align=4,
                                                 task=TaskSpec(data=data), sample_tokens=1024,
                                                 quiet=True))
    (tmp_path / "plan.yaml").write_text(plan_compression(measured, tolerance=0.02).to_yaml())
    seen = scored_windows(monkeypatch)
    out = tmp_path / "student"
    result = compress(CompressRequest(folder / "lm.pt", tmp_path / "plan.yaml", out,
                                      task=TaskSpec(data=data), batch_size=256, quiet=True))
    windows = -(-EVAL_TOKENS // 32)  # 256 of the 8 x 256 the batches hold
    assert sum(seen) == 2 * windows  # the teacher and the student as cut
    assert (result.eval_windows, result.eval_seq_len) == (windows, 32)
    assert result.to_dict()["evaluated"] == {"windows": windows, "seq_len": 32,
                                             "tokens": windows * 32}
    base = ["--checkpoint", str(folder / "lm.pt"), "--plan", str(tmp_path / "plan.yaml"),
            "--data", data.path, "--out", str(out), "--force", "--quiet"]
    for flag, expected in (("64", 2), ("all", 8 * 32), ("0", 8 * 32), ("100000", 8 * 32)):
        seen.clear()
        assert compress_main([*base, "--eval-tokens", flag]) == 0
        assert sum(seen) == 2 * expected, flag
        assert f"scored on {expected:,} validation window(s) of 32 tokens" in \
            capsys.readouterr().out
    with pytest.raises(SystemExit):  # argparse's usage error
        compress_main([*base, "--eval-tokens", "-1"])


def test_long_windows_are_scored_a_few_positions_at_a_time(
        teacher: tuple[Model, Path, torch.Tensor], monkeypatch: pytest.MonkeyPatch) -> None:
    """Where one window's logits would not fit the chunk's bytes, a text model's logits are
    formed ``HEAD_TOKENS`` positions at a time: the same loss as the whole window's."""
    from workers import chunks
    from workers.training import trainer

    model, folder, _ = teacher
    task = make_data_task(DataSpec(str(corpus(str(folder)))), length=32)
    config = TrainConfig(eval_batches=2, batch_size=4)
    whole = trainer.measure(model, task, config, "cpu")
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 1)
    monkeypatch.setattr(trainer, "HEAD_TOKENS", 5)
    pieces = trainer.measure(model, task, config, "cpu")
    assert pieces.loss == pytest.approx(whole.loss, rel=1e-5)
    assert pieces.metric == pytest.approx(whole.metric, rel=1e-5)
    assert trainer.measure(model, task, config, "cpu", windows=3).loss != pieces.loss
