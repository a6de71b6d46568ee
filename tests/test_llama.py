"""The Llama family read from folders saved by ``transformers`` itself (small random models built
here, nothing downloaded): logits equal to ``transformers``' for Llama (with and without
grouped-query attention), Qwen2 (query/key/value biases) and Mistral, sharded checkpoints read
one tensor at a time, every configuration we do not compute refused by name, and the stock
layout written back for a student with fewer RoPE pairs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from arch import param_count
from tests.helpers.llama import CASES, SEQ, SMALL, VOCAB, build, ids, saved, token_folder
from workers.checkpoints import CheckpointError, load
from workers.checkpoints.folder import INDEX, TensorFolder

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_equal_transformers(case: str, tmp_path: Path) -> None:
    kind, overrides = CASES[case]
    theirs = build(kind, **overrides)
    loaded = load(saved(theirs, tmp_path / case))
    x = ids()
    with torch.no_grad():
        expected = theirs(x).logits
        ours = loaded.model(x)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    assert loaded.layout == "llama" and loaded.family == kind
    built = sum(p.numel() for p in theirs.parameters())  # transformers counts tied ones once
    assert param_count(loaded.arch).total == built
    g = loaded.arch.layers[0].heads[0]
    assert (g.count, g.kv_heads) == (4, overrides["num_key_value_heads"])


def test_a_sharded_checkpoint_is_read_one_tensor_at_a_time(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    theirs = build("llama", num_key_value_heads=2)
    folder = saved(theirs, tmp_path / "sharded", max_shard_size="40KB")
    assert (folder / INDEX).is_file() and len(list(folder.glob("*.safetensors"))) > 2
    reads: list[str] = []
    original = TensorFolder.get

    def counted(self: TensorFolder, name: str, shape: tuple[int, ...],
                dtype: torch.dtype | None = torch.float32) -> torch.Tensor:
        reads.append(name)
        return original(self, name, shape, dtype)

    monkeypatch.setattr(TensorFolder, "get", counted)
    for module in ("safetensors.torch", "safetensors.numpy"):  # never a whole file at once
        monkeypatch.setattr(f"{module}.load_file", lambda *a, **k: pytest.fail("whole file"))
    loaded = load(folder)
    assert sorted(reads) == sorted(theirs.state_dict())  # each tensor read once, none twice
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids()), theirs(ids()).logits, atol=1e-5,
                                   rtol=1e-5)


def test_a_sliding_window_becomes_the_context(tmp_path: Path) -> None:
    """Within one window, Mistral's sliding-window attention is causal attention: the model is
    read with that context, and a longer input is refused, never computed differently."""
    theirs = build("mistral", num_key_value_heads=2, sliding_window=16)
    loaded = load(saved(theirs, tmp_path / "m"))
    assert loaded.arch.max_seq_len == 16
    x = ids()[:, :16]
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(x), theirs(x).logits, atol=1e-5, rtol=1e-5)
        with pytest.raises(ValueError, match="exceeds max_seq_len 16"):
            loaded.model(ids())


REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "rope_parameters": ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4,
                                             "factor": 8.0}}, "rope_type = 'yarn'"),
    "rope_scaling": ({"rope_parameters": None, "rope_scaling": {"type": "dynamic",
                                                                "factor": 2.0}},
                     "rope_type = 'dynamic'"),
    "partial_rotary_factor": ({"partial_rotary_factor": 0.5}, "partial_rotary_factor = 0.5"),
    "hidden_act": ({"hidden_act": "gelu"}, "hidden_act = 'gelu'"),
    "mlp_bias": ({"mlp_bias": True}, "mlp_bias = True"),
    "attention_bias": ({"attention_bias": True}, "attention_bias = True"),
    "use_sliding_window": ({"model_type": "qwen2", "use_sliding_window": True},
                           "use_sliding_window = True"),
    "layer_types": ({"layer_types": ["full_attention", "sliding_attention"]},
                    "layer_types = \\['full_attention', 'sliding_attention'\\]"),
    "model_type": ({"model_type": "gemma"}, "model_type = 'gemma' is not supported"),
    "num_key_value_heads": ({"num_key_value_heads": 3}, "num_key_value_heads = 3"),
    "vocab_size": ({"vocab_size": 10**12}, "vocab_size = 1000000000000"),
}


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return saved(build("llama", num_key_value_heads=2), tmp_path_factory.mktemp("llama") / "m")


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_each_field_we_do_not_compute_is_refused_by_name(
        field: str, llama_folder: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """One line naming the field and its value, exit 2, before any work (nothing written)."""
    from workers.profile import main

    change, message = REFUSED[field]
    folder = tmp_path / "m"
    folder.mkdir()
    for path in llama_folder.iterdir():
        (folder / path.name).symlink_to(path)
    (folder / "config.json").unlink()
    config = json.loads((llama_folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError, match=message):
        load(folder)
    out = tmp_path / "plan.yaml"
    assert main(["--checkpoint", str(folder), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field.split("_")[0] in err and not out.exists()


@pytest.mark.parametrize("case", ["llama-gqa", "qwen2", "llama3-rope"])
def test_a_rope_student_keeps_the_measured_pairs_and_stock_layout_reads_it(
        case: str, tmp_path: Path) -> None:
    """Profiling a GQA Llama ranks each key/value head's frequency pairs; the student that keeps
    the leading ones changes layer 0's attention weights by exactly the error the plan measured
    (nothing upstream differs), keeps every pair at full rank, and written back in the stock
    layout (cut pairs as zeros) stock transformers computes the student's logits."""
    from alloc.compression import plan_compression
    from workers.checkpoints import save_llama
    from workers.compression.measure import measure_model
    from workers.compression.recording import record_attention
    from workers.compression.students import build_student, pair_orders

    kind, overrides = CASES[case]  # Qwen2: biases on queries and keys; Llama 3.1 frequencies
    theirs = build(kind, **overrides)
    loaded = load(saved(theirs, tmp_path / "teacher"))
    x = ids()
    measured = measure_model(loaded.model, x, SEQ, 4, "ids")
    exact = plan_compression(measured, 0.0, "measured")
    assert not exact.reduces
    torch.testing.assert_close(build_student(loaded.model, exact.student, pair_orders(exact))(x),
                               loaded.model(x), atol=1e-6, rtol=1e-6)
    # the tolerance that lets layer 0 keep half its pairs
    tolerance = max(h.measured_errors[8] for h in measured.layers[0].heads
                    if h.measured_errors is not None)
    plan = plan_compression(measured, tolerance, "measured")
    group = plan.layers[0].groups[0]
    assert plan.reduces and group.reduced_qk_dim < group.qk_dim
    assert all(s.pairs for s in plan.layers[0].spectra)  # the ranking is in the plan
    student = build_student(loaded.model, plan.student, pair_orders(plan))
    with torch.no_grad():
        before = record_attention(loaded.model, x, lambda z: z).groups[0][0].softmax(-1)
        after = record_attention(student, x, lambda z: z).groups[0][0].softmax(-1)
    assert group.measured_error is not None
    assert (before - after).abs().max().item() == pytest.approx(group.measured_error, rel=1e-5)
    assert loaded.config is not None
    save_llama(student, loaded.config, tmp_path / "stock")
    stock = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "stock")
    with torch.no_grad():
        torch.testing.assert_close(stock(x).logits, student(x), atol=1e-5, rtol=1e-5)


def test_a_model_trained_here_is_written_as_a_llama_transformers_reads(tmp_path: Path) -> None:
    """``llama_config`` inverts ``llama_arch``: our RoPE/GQA/SwiGLU model saved in the stock
    layout is a ``LlamaForCausalLM`` with our logits, and reads back as the same arch."""
    from arch import ArchConfig, HeadGroup, LayerSpec
    from workers.checkpoints import llama_config, save_llama
    from workers.models.model import build_model

    layer = LayerSpec("mhsa", (HeadGroup(4, 8, kv_heads=2),), mlp_ratio=1.5)
    arch = ArchConfig(d_model=32, layers=(layer, layer), max_seq_len=SEQ, vocab_size=VOCAB,
                      positional="rope", norm="rmsnorm", mlp="swiglu", norm_eps=1e-6)
    torch.manual_seed(0)
    ours = build_model(arch).eval()
    save_llama(ours, llama_config(arch), tmp_path / "ours")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours")
    assert type(theirs).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids()).logits, ours(ids()), atol=1e-5, rtol=1e-5)
    assert load(tmp_path / "ours").arch == arch
    with pytest.raises(CheckpointError, match="not a Llama model"):
        llama_config(ArchConfig(d_model=32, layers=(layer,), max_seq_len=8, vocab_size=9))


@pytest.mark.usefixtures("remote_code_cache")
def test_profile_and_compress_a_llama_folder_into_a_smaller_student(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The practitioner's path: ``workers.profile --checkpoint LLAMA --data TOKENS --plot`` and
    ``workers.compress --out small/``; the student loads through ``AutoModelForCausalLM`` with
    ``trust_remote_code`` at its reduced shapes, with our student's logits, its safetensors
    smaller by the cut parameters, and a KV cache per token smaller by the cut key dims."""

    from alloc.compression import CompressionPlan
    from workers.compress import main as compress_main
    from workers.compression.students import build_student, pair_orders
    from workers.profile import main as profile_main

    teacher = load(saved(build("llama", num_key_value_heads=2), tmp_path / "llama"))
    token_folder(tmp_path / "tokens")
    paths = {k: str(tmp_path / k) for k in ("llama", "tokens", "plan.yaml", "heads.png", "small")}
    assert profile_main(["--checkpoint", paths["llama"], "--data", paths["tokens"], "--out",
                         paths["plan.yaml"], "--plot", paths["heads.png"], "--seq-len",
                         str(SEQ), "--vocab-size", str(VOCAB), "--tolerance", "0.1",
                         "--align", "4", "--sample-tokens", "4096"]) == 0
    capsys.readouterr()
    plan = CompressionPlan.from_yaml(Path(paths["plan.yaml"]).read_text())
    assert plan.reduces and Path(paths["heads.png"]).stat().st_size > 0
    assert compress_main(["--checkpoint", paths["llama"], "--plan", paths["plan.yaml"], "--data",
                          paths["tokens"], "--vocab-size", str(VOCAB), "--seq-len", str(SEQ),
                          "--out", paths["small"], "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    ours = build_student(teacher.model, plan.student, pair_orders(plan))
    small = transformers.AutoModelForCausalLM.from_pretrained(paths["small"],
                                                              trust_remote_code=True)
    with torch.no_grad():
        torch.testing.assert_close(small(ids()).logits, ours(ids()), atol=1e-5, rtol=1e-5)
    assert {k: v.shape for k, v in small.state_dict().items()} == {
        k: v.shape for k, v in ours.state_dict().items()}
    cut = param_count(teacher.arch).total - param_count(plan.student).total
    assert cut > 0 and report["params"]["student_total"] == param_count(plan.student).total
    shrink = report["files"]["teacher"] - report["files"]["student"]
    frequencies = sum(g.kv_heads * g.qk_dim // 2 for x in plan.student.layers for g in x.heads)
    assert abs(shrink - 4 * (cut - frequencies)) < 2_000  # float32; the student keeps its freqs
    assert report["kv_cache"]["student"] == 4 * plan.student.kv_width < report["kv_cache"][
        "teacher"] == 4 * teacher.arch.kv_width
    back = load(Path(paths["small"]))  # a student folder reads back as our model
    assert back.arch == plan.student
    torch.testing.assert_close(back.model(ids()), ours(ids()), atol=1e-6, rtol=1e-6)


def test_without_transformers_a_compact_folder_is_refused_before_work(
        llama_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``transformers`` is optional: without it, ``--out DIR`` says so in one line (exit 2)
    before measuring anything, and a ``.pt`` still works."""
    import sys

    from workers.compress import main as compress_main

    plan = tmp_path / "plan.yaml"
    from workers.profile import main as profile_main

    assert profile_main(["--checkpoint", str(llama_folder), "--out", str(plan)]) == 0
    capsys.readouterr()
    import workers.hf

    monkeypatch.setitem(sys.modules, "workers.hf.export", None)  # import fails as if absent
    monkeypatch.delattr(workers.hf, "export", raising=False)
    assert compress_main(["--checkpoint", str(llama_folder), "--plan", str(plan), "--out",
                          str(tmp_path / "small")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs the transformers package" in err
    assert not (tmp_path / "small").exists()


def test_pair_ranking_is_the_same_one_window_at_a_time(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    """The pair terms are formed in chunks of windows (a long sample must not hold every pair's
    T x T map): the ranking and the errors do not depend on the chunk."""
    import workers.chunks as chunks
    import workers.compression.measure as measure_module

    loaded = load(saved(build("llama", num_key_value_heads=2), tmp_path / "m"))
    whole = measure_module.measure_model(loaded.model, ids(), SEQ, 4, "ids")
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 1)  # one window per chunk
    chunked = measure_module.measure_model(loaded.model, ids(), SEQ, 4, "ids")
    for a, b in zip(whole.layers, chunked.layers):
        for x, y in zip(a.heads, b.heads):
            assert x.pairs == y.pairs and x.measured_errors is not None
            # float32 maps: a chunk's batched products may round differently, far below 1e-6
            assert y.measured_errors == pytest.approx(x.measured_errors, abs=1e-6)


def test_loss_rule_and_a_kv_cache_budget(llama_folder: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """``--rule loss`` records, per head group and candidate, the sample's loss increase of the
    student cut there alone (recomputed here by hand); ``--kv-cache F`` plans a student whose
    KV cache is at most F of the teacher's."""
    import dataclasses

    from alloc.compression import CompressionPlan
    from workers.compression.measure import measure_model
    from workers.compression.students import build_student, pair_orders
    from workers.profile import main as profile_main

    teacher = load(llama_folder)
    x = ids()
    targets = torch.roll(x, -1, dims=1)
    measured = measure_model(teacher.model, x, SEQ, 4, "ids", targets)
    layer = measured.layers[1]
    assert layer.loss_increases and layer.loss_increases[0][16] == 0.0
    plan = CompressionPlan.from_dict({**_plan_dict(measured)})
    spec = teacher.arch.layers[1]
    cut = dataclasses.replace(spec, heads=(dataclasses.replace(spec.heads[0], qk_dim=8),))
    arch = dataclasses.replace(teacher.arch, layers=(teacher.arch.layers[0], cut))
    student = build_student(teacher.model, arch, pair_orders(plan))
    with torch.no_grad():
        def loss(m: Any) -> float:
            logits = m(x)
            return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1),
                                                           targets.flatten()))
        assert layer.loss_increases[0][8] == pytest.approx(loss(student) - loss(teacher.model),
                                                           abs=1e-6)
    token_folder(tmp_path / "tokens")
    out = tmp_path / "plan.yaml"
    assert profile_main(["--checkpoint", str(llama_folder), "--data", str(tmp_path / "tokens"),
                         "--vocab-size", str(VOCAB), "--seq-len", str(SEQ), "--align", "4",
                         "--sample-tokens", "1024", "--rule", "loss", "--kv-cache", "0.8",
                         "--out", str(out)]) == 0
    budget = CompressionPlan.from_yaml(out.read_text())
    assert budget.kv_cache == 0.8 and budget.rule == "loss"
    assert budget.student.kv_width <= 0.8 * teacher.arch.kv_width
    assert "KV cache 0.8 of the teacher's" in capsys.readouterr().out
    assert profile_main(["--data", str(tmp_path / "tokens"), "--kv-cache", "0.8"]) == 2
    assert "--kv-cache: only with --checkpoint" in capsys.readouterr().err


def _plan_dict(measured: Any) -> dict[str, Any]:
    from alloc.compression import plan_compression

    return plan_compression(measured, 0.0, "loss").to_dict()


CONFIG_KEYS = ("model_type", "hidden_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "intermediate_size", "num_hidden_layers", "vocab_size",
               "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_parameters",
               "rope_scaling", "tie_word_embeddings", "attention_bias", "sliding_window",
               "layer_types", "hidden_act", "partial_rotary_factor", "use_sliding_window")


def test_any_config_json_loads_or_is_refused_in_one_line(llama_folder: Path,
                                                         tmp_path: Path) -> None:
    """Hostile config.json values (wrong types, zeros, negatives, huge sizes, NaN, nesting):
    the only outcomes are a model whose logits are finite, or a ``CheckpointError``."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    base = json.loads((llama_folder / "config.json").read_text())
    junk = st.one_of(st.none(), st.booleans(), st.integers(-3, 2 ** 70),
                     st.sampled_from([0, 1, 2, 4, 8, 16, 64, 97, 1e-6, 500.0]),
                     st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                     st.sampled_from(["llama", "qwen2", "mistral", "gpt2", "silu", "default",
                                      "full_attention"]),
                     st.lists(st.sampled_from(["full_attention", "sliding_attention", 1]),
                              max_size=3),
                     st.dictionaries(st.sampled_from(["rope_type", "rope_theta", "factor"]),
                                     st.sampled_from(["default", "llama3", 1e4, -1, None]),
                                     max_size=2))
    folder = tmp_path / "m"
    folder.mkdir()
    for path in llama_folder.iterdir():
        if path.name != "config.json":
            (folder / path.name).symlink_to(path)

    @settings(max_examples=120, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.dictionaries(st.sampled_from(CONFIG_KEYS), junk, min_size=1, max_size=3))
    def check(change: dict[str, Any]) -> None:
        (folder / "config.json").write_text(json.dumps({**base, **change}, default=str))
        try:
            loaded = load(folder)
        except CheckpointError as err:
            assert "\n" not in str(err)
            return
        with torch.no_grad():
            assert torch.isfinite(loaded.model(ids()[:, :loaded.arch.max_seq_len])).all()

    check()


@pytest.mark.parametrize("weight_map", [
    {"model.embed_tokens.weight": "../outside.safetensors"},
    {"model.embed_tokens.weight": "/etc/passwd"},
    {"model.embed_tokens.weight": "weights.bin"},
    {"model.embed_tokens.weight": "missing.safetensors"},
    ["not", "a", "map"],
])
def test_a_broken_shard_index_is_refused_by_name(llama_folder: Path, tmp_path: Path,
                                                 weight_map: Any) -> None:
    """An index may only name shards that are .safetensors files of the folder itself."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").symlink_to(llama_folder / "config.json")
    (folder / INDEX).write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=INDEX.replace(".", r"\.") + "|shard"):
        load(folder)


@pytest.mark.parametrize(("flags", "message"), [
    (["--rule", "loss"], "--rule loss: measures on a sample"),
    (["--rule", "measured"], "--rule measured: measures on a sample"),
    (["--kv-cache", "0.9", "--tolerance", "0.1", "--task", "lm"], "give one"),
])
def test_profile_flags_that_cannot_work_are_refused_before_measuring(
        llama_folder: Path, flags: list[str], message: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    from workers.profile import main as profile_main

    assert profile_main(["--checkpoint", str(llama_folder), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_logit_statistics_are_the_same_one_window_at_a_time(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The statistics pass runs a long sample a few windows at a time (every head's T x T map
    of a whole sample would not fit): bounds, entropies, inputs and norms do not change."""
    import workers.chunks as chunks
    import workers.compression.recording as recording

    loaded = load(saved(build("llama", num_key_value_heads=2), tmp_path / "m"))
    whole = recording.record_attention(loaded.model, ids())
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 1)  # one window per chunk
    chunked = recording.record_attention(loaded.model, ids())
    for layer_a, layer_b in zip(whole.groups, chunked.groups):
        for (bound_a, entropy_a), (bound_b, entropy_b) in zip(layer_a, layer_b):
            np.testing.assert_allclose(bound_b, bound_a, rtol=1e-6)
            np.testing.assert_allclose(entropy_b, entropy_a, rtol=1e-9)
    for a, b in zip(whole.inputs, chunked.inputs):
        torch.testing.assert_close(a, b)
    assert chunked.norms == pytest.approx(whole.norms)


def test_a_stock_student_of_a_bfloat16_teacher_is_its_size(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    """``--layout stock`` writes the teacher's dtype: the file is the teacher's size (and
    ``--layout compact`` smaller), never a float32 copy of a bfloat16 model."""
    from workers.compress import main as compress_main
    from workers.profile import main as profile_main

    teacher = build("llama", num_key_value_heads=2).to(torch.bfloat16)
    folder = saved(teacher, tmp_path / "bf16")
    token_folder(tmp_path / "tokens")
    plan = tmp_path / "plan.yaml"
    assert profile_main(["--checkpoint", str(folder), "--data", str(tmp_path / "tokens"),
                         "--vocab-size", str(VOCAB), "--seq-len", str(SEQ), "--align", "4",
                         "--sample-tokens", "1024", "--tolerance", "1", "--out", str(plan)]) == 0
    for layout in ("stock", "compact"):
        assert compress_main(["--checkpoint", str(folder), "--plan", str(plan), "--out",
                              str(tmp_path / layout), "--layout", layout]) == 0
    capsys.readouterr()
    size = {name: sum(f.stat().st_size for f in (tmp_path / name).glob("*.safetensors"))
            for name in ("bf16", "stock", "compact")}  # compact: streamed, one shard a layer
    assert size["stock"] == size["bf16"] > size["compact"]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("row_block", [5, 32])  # blocks of query rows, or the whole window
def test_the_pair_ranking_equals_its_definition(causal: bool, row_block: int, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``rank_pairs`` orders a key/value head's RoPE pairs by the summed squared logit term of
    each pair over its query heads, windows and allowed positions, errs at each candidate by
    the largest attention-weight change of keeping the leading pairs, and gives each query
    head's largest |logit| and mean normalised entropy (``head_statistics``' definition):
    computed here the direct way, one (T, T) term per pair."""
    from workers.compression import pairs as pairs_module
    from workers.compression.heads import head_maps
    from workers.compression.pairs import rank_pairs
    from workers.compression.recording import head_statistics
    from workers.models.attention import future_mask, rotate

    monkeypatch.setattr(pairs_module, "ROW_BLOCK", row_block)

    loaded = load(saved(build("llama", num_key_value_heads=2), tmp_path / "m"))
    maps = [m for m in head_maps(loaded.model) if m.layer == 0 and m.kv == 1]
    x = torch.randn(3, SEQ, SMALL["hidden_size"], dtype=torch.float64,
                    generator=torch.Generator().manual_seed(2))
    pairs = maps[0].a.shape[1] // 2
    ranks = list(range(2, 2 * pairs + 1, 4))
    got = rank_pairs(maps, x, ranks, causal)

    hidden = future_mask(SEQ) if causal else torch.zeros(SEQ, SEQ, dtype=torch.bool)
    terms = {}  # (head, pair) -> (B, T, T) scaled logit term
    for m in maps:
        freqs = torch.from_numpy(m.freqs)[None]
        q = rotate((x @ torch.from_numpy(m.a))[:, None], freqs)[:, 0]
        k = rotate((x @ torch.from_numpy(m.b))[:, None], freqs)[:, 0]
        for p in range(pairs):
            cols = [p, p + pairs]
            terms[m.head, p] = q[..., cols] @ k[..., cols].transpose(1, 2) / (2 * pairs) ** 0.5
    score = [sum(float(terms[m.head, p].masked_fill(hidden, 0).pow(2).sum()) for m in maps)
             for p in range(pairs)]
    assert got.order == tuple(int(i) for i in np.argsort(-np.array(score), kind="stable"))
    assert got.errors is not None
    def weights(head: int, kept: Sequence[int]) -> torch.Tensor:
        logits = sum(terms[head, p] for p in kept)
        return torch.softmax(logits.masked_fill(hidden, float("-inf")), dim=-1)

    assert got.stats is not None
    for m in maps:
        full = weights(m.head, range(pairs))
        for r in ranks:
            expected = float((full - weights(m.head, got.order[:r // 2])).abs().max())
            assert got.errors[m.head][r] == pytest.approx(expected, abs=1e-6)  # float32 maps
        logits = sum(terms[m.head, p] for p in range(pairs)).masked_fill(hidden, float("-inf"))
        bound, entropy = head_statistics(logits[:, None])
        assert got.stats[m.head].logit_bound == pytest.approx(float(bound[0]), rel=1e-5)
        assert got.stats[m.head].entropy == pytest.approx(float(entropy[0]), abs=1e-6)


@pytest.mark.usefixtures("remote_code_cache")
@pytest.mark.parametrize("case", ["llama-gqa", "qwen2"])
def test_values_are_cut_with_the_keys_under_one_kv_budget(case: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    """``--rule loss`` measures each group's values cut alone too (the student built by hand
    here gives the same loss increase); ``--kv-cache 0.5``, below what keys alone can reach,
    cuts values; the compact student loads through ``transformers`` with our logits, and its
    KV cache per token and parameters are the built modules'."""
    import dataclasses

    from alloc.compression import CompressionPlan
    from workers.compress import main as compress_main
    from workers.compression.measure import measure_model
    from workers.compression.students import build_student, pair_orders
    from workers.models.model import count_params
    from workers.profile import main as profile_main

    kind, overrides = CASES[case]
    teacher = load(saved(build(kind, **overrides), tmp_path / "teacher"))
    x = ids()
    targets = torch.roll(x, -1, dims=1)
    layer = measure_model(teacher.model, x, SEQ, 4, "ids", targets).layers[1]
    spec = teacher.arch.layers[1]
    assert layer.value_losses[0][spec.heads[0].v_dim] == 0.0
    cut = dataclasses.replace(spec, heads=(dataclasses.replace(spec.heads[0], v_dim=8),))
    arch = dataclasses.replace(teacher.arch, layers=(teacher.arch.layers[0], cut))
    student = build_student(teacher.model, arch, {}, {1: layer.input_scale})
    with torch.no_grad():
        def loss(m: Any) -> float:
            return float(torch.nn.functional.cross_entropy(m(x).flatten(0, 1),
                                                           targets.flatten()))
        assert layer.value_losses[0][8] == pytest.approx(loss(student) - loss(teacher.model),
                                                         abs=1e-6)

    token_folder(tmp_path / "tokens")
    paths = {k: str(tmp_path / k) for k in ("teacher", "tokens", "plan.yaml", "small")}
    data = ["--data", paths["tokens"], "--vocab-size", str(VOCAB), "--seq-len", str(SEQ)]
    assert profile_main(["--checkpoint", paths["teacher"], *data, "--align", "4",
                         "--sample-tokens", "1024", "--rule", "loss", "--kv-cache", "0.5",
                         "--out", paths["plan.yaml"]]) == 0
    plan = CompressionPlan.from_yaml(Path(paths["plan.yaml"]).read_text())
    assert plan.student.kv_width <= 0.5 * teacher.arch.kv_width
    assert any(g.v_dim < 16 for x in plan.student.layers for g in x.heads)
    assert " v 16->" in capsys.readouterr().out
    assert compress_main(["--checkpoint", paths["teacher"], "--plan", paths["plan.yaml"], *data,
                          "--out", paths["small"], "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["family"] == kind  # the teacher named by its model_type, not its reader
    ours = build_student(teacher.model, plan.student, pair_orders(plan), plan.input_scales())
    small = transformers.AutoModelForCausalLM.from_pretrained(paths["small"],
                                                              trust_remote_code=True)
    with torch.no_grad():
        torch.testing.assert_close(small(ids()).logits, ours(ids()), atol=1e-5, rtol=1e-5)
    modules = [ours.block(i).attn for i in range(ours.arch.n_layers)]
    cached = sum(m.k_width + m.v_width for m in modules)  # key and value units per token
    assert report["kv_cache"]["student"] == 4 * cached == 4 * plan.student.kv_width
    assert report["params"]["student_total"] == count_params(ours)[1]
    assert report["cut"]["loss"] >= report["teacher"]["loss"] - 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_streamed_profile_equals_the_whole_models(dtype: torch.dtype, tmp_path: Path) -> None:
    """A Llama folder measured one decoder layer at a time, read from its memory-mapped
    safetensors (``StreamedFolder``), gives the measurement of the whole float32 model in
    memory, and holds one block's weights at a time, in the dtype the file stores."""
    from workers.checkpoints.stream import StreamedFolder, WholeModel
    from workers.compression.measure import measure_layers

    folder = saved(build("qwen2", num_key_value_heads=2).to(dtype), tmp_path / "m")
    x = ids()
    whole = measure_layers(WholeModel(load(folder).model), x, SEQ, 4, "ids")
    with StreamedFolder(folder, "test") as stream:
        streamed = measure_layers(stream, x, SEQ, 4, "ids")
        for i in range(stream.arch.n_layers):
            with stream.block(i):
                held = {n: p.dtype for n, p in stream.model.named_parameters()
                        if not p.is_meta}
                assert held and all(n.startswith(f"blocks.{i}.") for n in held)
                assert set(held.values()) == {dtype}  # as stored: bf16 is never widened
        assert all(p.is_meta for p in stream.model.parameters())
    assert streamed.arch == whole.arch
    for a, b in zip(whole.layers, streamed.layers):
        assert a.token_norm == pytest.approx(b.token_norm, rel=1e-6)
        assert [s.logit_bound for s in a.head_stats] == pytest.approx(
            [s.logit_bound for s in b.head_stats], rel=1e-6)
        for p, q in zip(a.heads, b.heads):
            assert p.pairs == q.pairs and p.sigma == pytest.approx(q.sigma, rel=1e-9)
            assert p.measured_errors == pytest.approx(q.measured_errors, abs=1e-6)


@pytest.mark.usefixtures("remote_code_cache")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_streamed_compress_writes_the_whole_models_student(dtype: torch.dtype,
                                                             tmp_path: Path) -> None:
    """Without data to evaluate on, ``workers.compress`` of a Llama folder builds and writes
    the student one decoder layer at a time (shards listed by an index): our reader and
    ``transformers`` read it back with the logits of the student built from the whole model,
    keys and values cut (a bfloat16 teacher's student in bfloat16, built from the same
    float32 arithmetic)."""
    from alloc.compression import CompressionPlan
    from workers.compress import main as compress_main
    from workers.compression.students import build_student, pair_orders
    from workers.profile import main as profile_main

    teacher = load(saved(build("llama", num_key_value_heads=2).to(dtype), tmp_path / "teacher"))
    token_folder(tmp_path / "tokens")
    plan_path, out = tmp_path / "plan.yaml", tmp_path / "small"
    assert profile_main(["--checkpoint", str(tmp_path / "teacher"), "--data",
                         str(tmp_path / "tokens"), "--vocab-size", str(VOCAB), "--seq-len",
                         str(SEQ), "--align", "4", "--sample-tokens", "1024", "--rule", "loss",
                         "--kv-cache", "0.5", "--out", str(plan_path), "--quiet"]) == 0
    plan = CompressionPlan.from_yaml(plan_path.read_text())
    assert compress_main(["--checkpoint", str(tmp_path / "teacher"), "--plan", str(plan_path),
                          "--out", str(out), "--quiet"]) == 0
    io = 2 if teacher.arch.tie_embeddings else 3  # embedding, final norm (and head)
    assert (out / INDEX).is_file() and len(list(out.glob("*.safetensors"))) == io + 2  # blocks
    ours = build_student(teacher.model, plan.student, pair_orders(plan), plan.input_scales())
    with torch.no_grad():  # written in the teacher's dtype
        for p in ours.parameters():
            p.copy_(p.to(dtype))
    back = load(out)
    assert back.arch == plan.student
    block = load_file(out / "model-00004.safetensors")  # RoPE's frequencies stay float32
    assert {t.dtype for k, t in block.items() if "inv_freq" not in k} == {dtype}
    small = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True,
                                                              dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(back.model(ids()), ours(ids()), atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(small(ids()).logits, ours(ids()), atol=1e-5, rtol=1e-5)
