"""GGUF files read as the Llama family: a small random Llama written here with ``gguf``'s own
writer (llama.cpp's layout: interleaved query/key rows, its names, one tensor quantized to
Q8_0) is read with the logits ``transformers``' own GGUF loader computes (1e-4), loaded whole
or streamed a layer at a time alike, profiled and compressed from the file; what the file holds
that the model does not compute is refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.llama import SEQ, VOCAB, build, ids
from workers.checkpoints import CheckpointError, load, read_arch
from workers.checkpoints.gguf import permute, stock_to_gguf, unpermute

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

NAME = "tiny.gguf"


def write_gguf(model: Any, path: Path, quantize: str = "blk.0.ffn_up.weight",
               extra: dict[str, Any] | None = None) -> Path:
    """``model`` (a transformers Llama) as llama.cpp's converter writes it: its names, the
    query and key rows of each head interleaved, ``quantize`` stored as Q8_0."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    for key, value in (extra or {}).items():
        writer.add_float32(key, value)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        rows = tensor.detach().float()
        if ".q_proj." in name or ".k_proj." in name:
            heads = config.num_attention_heads if ".q_proj." in name else \
                config.num_key_value_heads
            rows = permute(rows, heads)
        target = stock_to_gguf(name)
        array = rows.numpy()
        if target == quantize:
            writer.add_tensor(target, gguf.quantize(array, gguf.GGMLQuantizationType.Q8_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(target, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_interleaving_is_undone_exactly() -> None:
    rows = torch.arange(2 * 8 * 3, dtype=torch.float32).view(16, 3)
    assert torch.equal(unpermute(permute(rows, 2), 2), rows)
    # llama.cpp's layout: pair i of a head at rows 2i, 2i + 1
    assert torch.equal(permute(rows, 2)[1], rows[4])


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_logits_equal_transformers_gguf_load(kv_heads: int, tmp_path: Path) -> None:
    from workers.checkpoints.stream import StreamedFolder

    theirs = build("llama", num_key_value_heads=kv_heads)
    path = write_gguf(theirs, tmp_path / NAME)
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=NAME)
    loaded = load(path)
    assert loaded.layout == "llama" and loaded.family == "llama"
    assert read_arch(path) == loaded.arch == read_arch(tmp_path)  # the file, or its folder
    assert loaded.arch.layers[0].heads[0].kv_heads == kv_heads
    with torch.no_grad():
        expected = reference(ids()).logits
        torch.testing.assert_close(loaded.model(ids()), expected, atol=1e-4, rtol=1e-4)
        # the quantized tensor is the file's, not the float model's: the GGUF load, not a copy
        assert not torch.allclose(expected, theirs(ids()).logits, atol=1e-6)
        with StreamedFolder(path, "gguf") as stream:
            h = stream.inputs(ids())
            for i in range(loaded.arch.n_layers):
                with stream.block(i) as block:
                    h = block(h)
            with stream.output() as output:
                torch.testing.assert_close(output(h), expected, atol=1e-4, rtol=1e-4)


def test_a_latent_student_of_a_gguf_file(tmp_path: Path) -> None:
    """Profiled and compressed from the file alone: the student folder computes what the
    in-memory student of the same plan computes, and carries no model hub."""
    from alloc.compression import CompressionPlan
    from tests.helpers.llama import token_folder
    from workers.compress import main as compress_main
    from workers.compression.fits import read_fits
    from workers.compression.students import build_student, pair_orders
    from workers.profile import main as profile_main

    path = write_gguf(build("llama", num_key_value_heads=2), tmp_path / NAME)
    token_folder(tmp_path / "tokens")
    data = ["--data", str(tmp_path / "tokens"), "--vocab-size", str(VOCAB), "--seq-len",
            str(SEQ)]
    assert profile_main(["--checkpoint", str(path), *data, "--align", "4", "--sample-tokens",
                         "1024", "--rule", "loss", "--latent", "--kv-cache", "0.5", "--out",
                         str(tmp_path / "plan.yaml"), "--quiet"]) == 0
    plan = CompressionPlan.from_yaml((tmp_path / "plan.yaml").read_text())
    assert compress_main(["--checkpoint", str(path), "--plan", str(tmp_path / "plan.yaml"),
                          "--out", str(tmp_path / "small"), "--quiet"]) == 0
    ours = build_student(load(path).model, plan.student, pair_orders(plan),
                         plan.input_scales(), read_fits(plan, tmp_path))
    small = load(tmp_path / "small")
    # written in bfloat16 (a quantized file's weights have fewer bits), the frequencies exact
    assert small.config is not None and small.config["dtype"] == "bfloat16"
    with torch.no_grad():
        for param in ours.parameters():
            param.copy_(param.bfloat16().float())
        torch.testing.assert_close(small.model(ids()), ours(ids()), atol=1e-5, rtol=1e-5)
    assert plan.student.kv_width <= 0.5 * load(path).arch.kv_width


def test_what_the_model_does_not_compute_is_refused(tmp_path: Path) -> None:
    model = build("llama", num_key_value_heads=2)
    path = write_gguf(model, tmp_path / NAME, extra={"llama.rope.scaling.factor": 4.0})
    with pytest.raises(CheckpointError, match=r"rope\.scaling\.factor"):
        load(path)
    (tmp_path / "junk.gguf").write_bytes(b"GGUF not really")
    with pytest.raises(CheckpointError, match="unreadable GGUF"):
        load(tmp_path / "junk.gguf")



@pytest.mark.parametrize("keep", ["tensors", "header"])
def test_a_truncated_file_is_refused_as_truncated(keep: str, tmp_path: Path) -> None:
    path = write_gguf(build("llama", num_key_value_heads=2), tmp_path / NAME)
    data = path.read_bytes()
    cut = len(data) - 100 if keep == "tensors" else 40  # in the last tensor, or in the header
    path.write_bytes(data[:cut])
    with pytest.raises(CheckpointError) as caught:
        load(path)
    said = str(caught.value)
    assert f"{NAME}: truncated GGUF file ({cut:,} bytes, " in said and "unreadable" not in said
    assert (f"the header's tensors need {len(data):,})" in said if keep == "tensors" else
            "its header goes on past the end" in said)
