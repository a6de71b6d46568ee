"""Students as ``transformers`` folders: ``workers.hf.export.save_student`` writes a folder that
``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` loads with the
student's reduced shapes and its own RoPE frequencies, computing our model's logits (fp32, atol
1e-5), generating greedily the same with and without the key/value cache; models the modelling
file does not implement are refused in one line, and a failed export leaves no folder."""

from __future__ import annotations

import ast
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM
from transformers.cache_utils import DynamicCache

import workers.hf.export as export
from arch import ArchConfig, HeadGroup, LayerSpec, param_count
from tests.helpers.copies import copies, drifted
from workers.errors import ExportError
from workers.hf.export import save_student
from workers.models.model import Model, build_model

OURS = {"alloc", "arch", "common", "search_spaces", "studies", "userdata", "workers", "bench"}


pytestmark = pytest.mark.usefixtures("remote_code_cache")


def rope_layers(*layers: LayerSpec, **fields: Any) -> ArchConfig:
    return ArchConfig(d_model=16, layers=layers, max_seq_len=12, vocab_size=23, **fields)


# Each is a student shape the export must reproduce exactly.
ARCHS = {
    # Grouped-query groups with different qk/v dims per layer, RoPE, a frozen layer, eta != 1.
    "gqa_rope": rope_layers(
        LayerSpec("mhsa", (HeadGroup(4, 8, 16, 2), HeadGroup(2, 4, 4, 1)), mlp_ratio=2.0,
                  eta=0.5),
        LayerSpec("frozen_qk", (HeadGroup(2, 6, 8, 1),)),
        LayerSpec("mhsa", (HeadGroup(3, 2, 4),), mlp_ratio=1.0, eta=2.0),
        positional="rope"),
    # GPT-2's layout: learned positions, tanh GELU, biases, tied head; compressed qk dims.
    "gpt2_like": rope_layers(
        LayerSpec("mhsa", (HeadGroup(2, 2, 4), HeadGroup(2, 4)), mlp_ratio=4.0),
        LayerSpec("mhsa", (HeadGroup(1, 2, 4), HeadGroup(3, 4)), mlp_ratio=4.0),
        positional="learned", mlp="gelu_tanh", bias=True, tie_embeddings=True),
    # Qwen2's: SwiGLU, RMSNorm, query/key/value biases, grouped keys, its own theta and eps.
    "qwen_like": rope_layers(
        LayerSpec("mhsa", (HeadGroup(4, 4, 4, 2),), mlp_ratio=2.0),
        LayerSpec("mhsa", (HeadGroup(4, 2, 4, 1),), mlp_ratio=2.0, eta=0.7),
        positional="rope", mlp="swiglu", norm="rmsnorm", qkv_bias=True, rope_theta=500.0,
        norm_eps=1e-6),
    # Sinusoidal positions, exact GELU, frozen query/key maps with biases, tied head.
    "sinusoidal_frozen": rope_layers(
        LayerSpec("frozen_qk", (HeadGroup(2, 8), HeadGroup(4, 2, 2, 2)), mlp_ratio=1.0,
                  eta=1.5),
        positional="sinusoidal", bias=True, tie_embeddings=True),
    # Latent layers: decoupled RoPE parts (one group all RoPE), a turned latent part with no
    # RoPE part, grouped keys, query/key/value biases, beside an mhsa layer.
    "latent_rope": rope_layers(
        LayerSpec("latent", (HeadGroup(4, 8, 6, 2), HeadGroup(2, 4, 4, 1)), mlp_ratio=2.0,
                  latent_dim=10, rope_dim=4),
        LayerSpec("latent", (HeadGroup(4, 6, 4, 2),), latent_dim=7, rotate_latent=True,
                  eta=0.5),
        LayerSpec("mhsa", (HeadGroup(2, 4),), mlp_ratio=1.0),
        positional="rope", mlp="swiglu", norm="rmsnorm", qkv_bias=True),
    # A shared RoPE key per group (one key head read by every query head), grouped keys and
    # biases, two groups: what a RoRoPE student decodes with (workers.compression.rorope).
    "latent_shared_rope": rope_layers(
        LayerSpec("latent", (HeadGroup(4, 10, 6, 2), HeadGroup(2, 8, 4, 1)), mlp_ratio=2.0,
                  latent_dim=9, rope_dim=4, rope_shared=True),
        LayerSpec("mhsa", (HeadGroup(2, 4),), mlp_ratio=1.0),
        positional="rope", mlp="swiglu", norm="rmsnorm", qkv_bias=True),
    # A latent layer without RoPE: learned positions, biases everywhere, a tied head.
    "latent_learned": rope_layers(
        LayerSpec("latent", (HeadGroup(2, 8, 4), HeadGroup(2, 2, 6, 1)), mlp_ratio=1.0,
                  latent_dim=5),
        positional="learned", bias=True, tie_embeddings=True),
}


def random_arch(index: int) -> ArchConfig:
    """A small random exportable architecture (reproducible from ``index``)."""
    rng = random.Random(index)
    layers = []
    for _ in range(rng.randint(1, 3)):
        groups = []
        for _ in range(rng.randint(1, 3)):
            kv = rng.choice([1, 2])
            groups.append(HeadGroup(kv * rng.choice([1, 2]), rng.choice([2, 4, 6]),
                                    rng.choice([2, 4, 8]), kv))
        layers.append(LayerSpec(rng.choice(["mhsa", "frozen_qk"]), tuple(groups),
                                mlp_ratio=rng.choice([0.0, 1.0, 2.0]),
                                eta=rng.choice([0.5, 1.0, 1.25])))
    bias = rng.random() < 0.4
    return ArchConfig(d_model=rng.choice([8, 12, 16]), layers=tuple(layers),
                      max_seq_len=rng.randint(8, 16), vocab_size=rng.randint(5, 40),
                      positional=rng.choice(["learned", "sinusoidal", "rope"]),
                      norm=rng.choice(["layernorm", "rmsnorm"]),
                      mlp=rng.choice(["gelu", "gelu_tanh", "swiglu"]), bias=bias,
                      qkv_bias=not bias and rng.random() < 0.5,
                      tie_embeddings=rng.random() < 0.5,
                      rope_theta=rng.choice([10000.0, 100.0]))


ARCHS.update({f"random{i}": random_arch(i) for i in range(3)})


def trained_like(arch: ArchConfig, index: int = 0) -> Model:
    """A model of ``arch`` with non-zero biases and norm weights and, with RoPE, random positive
    frequencies per key/value head (which only the weights file can give the loaded model)."""
    torch.manual_seed(index)
    model = build_model(arch).eval()
    with torch.no_grad():
        for name, value in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                value.add_(0.1 * torch.randn_like(value))
        for name, buffer in model.named_buffers():
            if "inv_freq" in name:
                buffer.copy_(torch.rand_like(buffer) * 1.5 + 0.05)
    return model


def frequency_elements(arch: ArchConfig) -> int:
    """Elements of the RoPE buffers when RoPE is used: (kv_heads, qk_dim / 2) per group; in a
    latent layer (kv_heads, rope_dim / 2), and (kv_heads, (qk_dim - rope_dim) / 2) more when
    its latent part is turned."""
    if arch.positional != "rope":
        return 0
    total = 0
    for layer in arch.layers:
        for g in layer.heads:
            if layer.attention != "latent":
                total += g.kv_heads * g.qk_dim // 2
            else:
                turned = g.qk_dim if layer.rotate_latent else layer.rope_dim
                total += g.kv_heads * turned // 2
    return total


def load(folder: Path) -> Any:
    model: Any = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    return model.eval()


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_loaded_student_computes_our_logits(name: str, tmp_path: Path) -> None:
    arch = ARCHS[name]
    model = trained_like(arch)
    report = save_student(model, tmp_path / "student")
    student = load(tmp_path / "student")
    assert type(student).__name__ == "TransformerAllocForCausalLM"
    ids = torch.randint(0, arch.vocab_size or 1, (2, arch.max_seq_len),
                        generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(student(ids).logits, model(ids), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(student(ids[:, :3]).logits, model(ids[:, :3]),
                                   atol=1e-5, rtol=1e-5)
    # Reduced shapes and the file's frequencies, tensor for tensor.
    ours, theirs = model.state_dict(), student.state_dict()
    assert set(theirs) == set(ours)
    for key, value in ours.items():
        assert theirs[key].shape == value.shape, key
        assert torch.equal(theirs[key], value), key
    assert (student.head.weight is student.embed.weight) == arch.tie_embeddings
    # The file holds the parameters (a tied head once) and the RoPE frequencies, nothing else.
    with safe_open(str(tmp_path / "student" / "model.safetensors"), "pt") as handle:
        elements = sum(math.prod(handle.get_slice(k).get_shape())
                       for k in handle.keys())  # noqa: SIM118 (safe_open has no __iter__)
    assert elements == param_count(arch).total + frequency_elements(arch)
    assert (report.params, report.buffer_elements, report.elements) == (
        param_count(arch).total, frequency_elements(arch), elements)
    assert report.file_bytes == (tmp_path / "student" / "model.safetensors").stat().st_size


@pytest.mark.parametrize("name", ["gqa_rope", "gpt2_like", "random1", "latent_rope",
                                  "latent_learned", "latent_shared_rope"])
def test_cache_gives_the_logits_of_a_full_pass(name: str, tmp_path: Path) -> None:
    """Prefill, then a chunk, then one token at a time through a DynamicCache: the logits of
    the full sequence in one uncached pass."""
    arch = ARCHS[name]
    save_student(trained_like(arch), tmp_path / "student")
    student = load(tmp_path / "student")
    t = arch.max_seq_len
    ids = torch.randint(0, arch.vocab_size or 1, (2, t),
                        generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = student(ids, use_cache=False).logits
        cache = DynamicCache(config=student.config)
        parts = [student(ids[:, :3], past_key_values=cache, use_cache=True).logits,
                 student(ids[:, 3:6], past_key_values=cache, use_cache=True).logits]
        parts += [student(ids[:, i:i + 1], past_key_values=cache, use_cache=True).logits
                  for i in range(6, t)]
    assert cache.get_seq_length() == t
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["gpt2_like", "gqa_rope", "qwen_like", "sinusoidal_frozen",
                                  "latent_rope"])
def test_greedy_generation_with_and_without_cache(name: str, tmp_path: Path) -> None:
    """Every positional kind (learned, RoPE, sinusoidal) generates the same tokens with and
    without its cache, and the cache generate returns holds every position but the last: the
    model really decoded from it (a model that ignored the cache it was handed would decode
    each step at position 0 and return an empty one)."""
    arch = ARCHS[name]
    model = trained_like(arch)
    save_student(model, tmp_path / "student")
    student = load(tmp_path / "student")
    prompt = torch.randint(0, arch.vocab_size or 1, (2, 4),
                           generator=torch.Generator().manual_seed(3))
    new = arch.max_seq_len - 4
    with torch.no_grad():
        out = student.generate(prompt, max_new_tokens=new, do_sample=False, use_cache=True,
                               pad_token_id=0, return_dict_in_generate=True)
        uncached = student.generate(prompt, max_new_tokens=new, do_sample=False,
                                    use_cache=False, pad_token_id=0)
        cached = out.sequences
        assert cached.shape == (2, arch.max_seq_len)
        assert torch.equal(cached, uncached)
        # transformers names the returned cache ``cache`` from 5.24 on, before
        # ``past_key_values``.
        cache = out["cache"] if "cache" in out else out["past_key_values"]
        assert cache.get_seq_length() == arch.max_seq_len - 1
        # Our model's own greedy choices, one token at a time.
        ids = prompt
        for _ in range(new):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(cached, ids)


def test_two_folders_with_the_same_name_and_modelling_file(tmp_path: Path) -> None:
    """Both share one remote-code module; each loads its own architecture and weights."""
    first, second = ARCHS["gqa_rope"], ARCHS["qwen_like"]
    save_student(trained_like(first, 1), tmp_path / "a" / "student")
    save_student(trained_like(second, 2), tmp_path / "b" / "student")
    a, b = load(tmp_path / "a" / "student"), load(tmp_path / "b" / "student")
    assert type(a) is type(b)
    ids = torch.randint(0, 20, (1, 8), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(a(ids).logits, trained_like(first, 1)(ids), atol=1e-5,
                                   rtol=1e-5)
        torch.testing.assert_close(b(ids).logits, trained_like(second, 2)(ids), atol=1e-5,
                                   rtol=1e-5)


def test_config_json(tmp_path: Path) -> None:
    arch = ARCHS["gpt2_like"]
    model = trained_like(arch)
    save_student(model, tmp_path / "student")
    ids = torch.randint(0, 23, (2, 12), generator=torch.Generator().manual_seed(6))
    student = export.load_student(tmp_path / "student")  # this package's copy: no remote code
    with torch.no_grad():
        torch.testing.assert_close(student(ids, use_cache=False).logits, model(ids), atol=1e-5,
                                   rtol=1e-5)
    config = json.loads((tmp_path / "student" / "config.json").read_text())
    assert config["model_type"] == "transformer_alloc"
    assert config["architectures"] == ["TransformerAllocForCausalLM"]
    assert config["auto_map"] == {
        "AutoConfig": "modeling_transformer_alloc.TransformerAllocConfig",
        "AutoModelForCausalLM": "modeling_transformer_alloc.TransformerAllocForCausalLM"}
    assert ArchConfig.from_dict(config["arch"]) == arch
    assert (config["vocab_size"], config["hidden_size"], config["num_hidden_layers"],
            config["max_position_embeddings"], config["tie_word_embeddings"],
            config["dtype"]) == (23, 16, 2, 12, True, "float32")
    assert sorted(p.name for p in (tmp_path / "student").iterdir()) == [
        "attention_transformer_alloc.py", "config.json", "model.safetensors",
        "modeling_transformer_alloc.py"]


def test_loss_is_the_shifted_next_token_loss(tmp_path: Path) -> None:
    arch = ARCHS["qwen_like"]
    model = trained_like(arch)
    save_student(model, tmp_path / "student")
    student = load(tmp_path / "student")
    ids = torch.randint(0, 23, (2, 10), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        out = student(ids, labels=ids, attention_mask=torch.ones_like(ids))
        want = torch.nn.functional.cross_entropy(model(ids)[:, :-1].reshape(-1, 23),
                                                 ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="padding"):
        student(ids, attention_mask=torch.tensor([[1] * 10, [0] + [1] * 9]))


def test_bfloat16_export_keeps_float32_frequencies(tmp_path: Path) -> None:
    arch = ARCHS["gqa_rope"]
    model = trained_like(arch)
    report = save_student(model, tmp_path / "student", dtype=torch.bfloat16)
    assert report.dtype == "bfloat16"
    config = json.loads((tmp_path / "student" / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    with safe_open(str(tmp_path / "student" / "model.safetensors"), "pt") as handle:
        dtypes = {k: handle.get_tensor(k).dtype for k in handle.keys()}  # noqa: SIM118
    assert {d for k, d in dtypes.items() if "inv_freq" not in k} == {torch.bfloat16}
    assert {d for k, d in dtypes.items() if "inv_freq" in k} == {torch.float32}
    student = load(tmp_path / "student")
    assert torch.equal(student.blocks[0].attn.inv_freq0,
                       model.state_dict()["blocks.0.attn.inv_freq0"])


@pytest.mark.parametrize("source", export.REMOTE_CODE, ids=lambda p: p.name)
def test_remote_code_imports_only_torch_transformers_and_the_standard_library(
        source: Path) -> None:
    """The student folder's files import nothing of ours: only torch, transformers, the
    standard library and, relatively, each other (``transformers`` copies those)."""
    siblings = {p.stem for p in export.REMOTE_CODE}
    roots = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level:
            assert node.level == 1 and node.module in siblings, node.module  # copied beside it
        elif isinstance(node, ast.ImportFrom):
            assert node.module is not None
            roots.add(node.module.split(".")[0])
    assert not roots & OURS, roots
    assert roots - {"torch", "transformers"} <= set(sys.stdlib_module_names), roots


@pytest.mark.parametrize(("arch", "message"), [
    (ArchConfig(d_model=8, layers=(LayerSpec("mhsa", (HeadGroup(2, 4),)),
                                   LayerSpec("mssa", (HeadGroup(2, 4),))),
                max_seq_len=8, vocab_size=10), "layers[1].attention = 'mssa'"),
    (ArchConfig(d_model=8, layers=(LayerSpec("mhsa", (HeadGroup(2, 4),)),), max_seq_len=8,
                input_dim=3), "token models only"),
    (ArchConfig(d_model=8, layers=(LayerSpec("mhsa", (HeadGroup(2, 4),)),), max_seq_len=8,
                vocab_size=10, causal=False), "causal"),
])
def test_refused_in_one_line(arch: ArchConfig, message: str, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"^transformers export: .*") as err:
        save_student(build_model(arch), tmp_path / "student")
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not list(tmp_path.iterdir())


def test_failed_export_leaves_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    def broken(*_: Any) -> None:  # after the weights file is written
        raise OSError("disk full")

    monkeypatch.setattr(export, "student_config", broken)
    with pytest.raises(OSError, match="disk full"):
        save_student(trained_like(ARCHS["gpt2_like"]), tmp_path / "student")
    assert not list(tmp_path.iterdir())


def test_replaces_a_student_and_refuses_other_folders(tmp_path: Path) -> None:
    save_student(trained_like(ARCHS["gpt2_like"]), tmp_path / "student")
    save_student(trained_like(ARCHS["qwen_like"]), tmp_path / "student")
    config = json.loads((tmp_path / "student" / "config.json").read_text())
    assert config["arch"]["mlp"] == "swiglu"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["student"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match="not a transformers student folder"):
        save_student(trained_like(ARCHS["gpt2_like"]), tmp_path / "other")
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


def test_the_student_model_type_is_the_one_the_reader_knows() -> None:
    """The modelling file is standalone, so its ``model_type`` is written twice: here they meet."""
    from workers.checkpoints import STUDENT_TYPE

    assert export.MODEL_TYPE == STUDENT_TYPE


# What the modelling file repeats of workers.models.attention: the head split and merge, RoPE.
COPIED = {"split_heads", "merge_heads", "rope_frequencies", "rope_tables", "turn", "rotate"}


def test_the_modelling_files_copies_are_their_sources() -> None:
    """Each ``# Copied from workers.models.attention.NAME`` function of the standalone modelling
    file is its source, text for text (as ``transformers``' check_copies): a fix made on one side
    only fails here."""
    attention = export.REMOTE_CODE[1]
    assert {name for name, *_ in copies(attention.read_text())} >= COPIED
    assert all(drifted(source) == [] for source in export.REMOTE_CODE)


def test_a_copy_that_drifts_is_found(tmp_path: Path) -> None:
    text = export.REMOTE_CODE[1].read_text()
    changed = tmp_path / "changed.py"
    changed.write_text(text.replace("x1 * cos - x2 * sin", "x1 * cos + x2 * sin"))
    assert drifted(changed) == ["turn: differs from workers.models.attention.turn"]
    # ``with OLD->NEW`` renames in the source before comparing, as transformers' marks do
    renamed = tmp_path / "renamed.py"
    renamed.write_text("# Copied from workers.models.attention.merge_heads "
                       "with merge_heads->merge\n"
                       "def merge(x: Tensor) -> Tensor:\n"
                       '    """(B, H, T, dim) -> (B, T, H * dim)"""\n'
                       "    b, h, t, d = x.shape\n"
                       "    return x.transpose(1, 2).reshape(b, t, h * d)\n")
    assert drifted(renamed) == []
    renamed.write_text(renamed.read_text().replace("h * d", "d * h"))
    assert drifted(renamed) == ["merge: differs from workers.models.attention.merge_heads"]


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_decoding_reads_the_latent_cache_absorbed_as_it_rebuilds_it(qkv_bias: bool,
                                                                  tmp_path: Path) -> None:
    """A latent layer whose latent parts are not turned decodes in the absorbed form (queries
    mapped into the latent space, weighted latents mapped to values): equal to rebuilding every
    cached key and value, for one new token and for a chunk after a cached prefix, with and
    without biases, grouped queries and a group that is all RoPE part."""
    arch = rope_layers(
        LayerSpec("latent", (HeadGroup(4, 8, 6, 2), HeadGroup(2, 4, 4, 1)), mlp_ratio=2.0,
                  latent_dim=9, rope_dim=4),
        positional="rope", mlp="swiglu", norm="rmsnorm", qkv_bias=qkv_bias)
    save_student(trained_like(arch), tmp_path / "student")
    student = load(tmp_path / "student")
    attn = student.blocks[0].attn
    assert not attn.rotate_latent
    cache = DynamicCache(config=student.config)
    x = torch.randn(2, 11, arch.d_model, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        attn(x[:, :7], 0, cache)  # a cached prefix of 7 tokens
        latent, rope = cache.layers[0].keys[:, 0], cache.layers[0].values[:, 0]
        for new in (x[:, 7:8], x[:, 7:11]):
            start = 7
            latents = torch.cat([latent, attn.down(new)], dim=1)
            ropes = torch.cat([rope, attn.rope_keys(new, start)], dim=1)
            qs = attn.q(new).split([g.count * g.qk for g in attn.groups], dim=-1)
            for j, (qg, rg) in enumerate(zip(qs, ropes.split(attn.rope_widths, -1))):
                q = attn.head_queries(j, qg, start)
                torch.testing.assert_close(attn.absorbed(j, q, latents, rg),
                                           attn.rebuilt(j, q, latents, rg), atol=1e-5,
                                           rtol=1e-5)
