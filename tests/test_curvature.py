"""The second-order latent plan (docs/theory.md §10.6): the curvature moments equal autograd's
on the whole model and on a folder streamed a layer at a time; the fitted maps are the best of
their rank in the curvature's norm and price each width by its spectrum's tail; the pairs left
unturned are the ones whose RoPE costs least; and on a small trained teacher the widths the
estimate picks end no worse than the widths one forward per layer and width picks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from tests.helpers.llama import build, ids, saved
from workers.checkpoints import load
from workers.checkpoints.stream import StreamedFolder, WholeModel
from workers.compression.curvature import layer_curvature
from workers.compression.latent_measure import width_losses
from workers.compression.latent_students import curvature_factors, curvature_spectrum
from workers.models.attention import MultiHeadAttention
from workers.models.model import Model

transformers = pytest.importorskip("transformers")

# SmolLM2-135M's config.json (bench.fixtures), without its weights
SMOLLM2 = {"model_type": "llama", "num_hidden_layers": 30, "max_position_embeddings": 8192,
           "hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
           "num_key_value_heads": 3, "rms_norm_eps": 1e-5, "vocab_size": 49152,
           "rope_theta": 100000.0, "tie_word_embeddings": True}


def brute_force(model: Model, x: torch.Tensor, targets: torch.Tensor
                ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's ``E[x x^T]`` and ``E[g g^T]`` by one autograd pass of the whole model with
    every layer's keys and values kept for their gradients."""
    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for i in range(model.arch.n_layers):
        attn = model.block(i).attn
        assert isinstance(attn, MultiHeadAttention)

        def project(inputs: torch.Tensor, attn: MultiHeadAttention = attn, i: int = i
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            q, k, v = MultiHeadAttention.project(attn, inputs)
            kv = torch.cat([k, v], -1)
            kv.retain_grad()
            seen[i] = (inputs, kv)
            return q, *kv.split([attn.k_width, attn.v_width], -1)

        attn.project = project  # type: ignore[method-assign]
    logits = model(x)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                                      reduction="sum").backward()
    out = {}
    for i, (inputs, kv) in seen.items():
        xs, gs = inputs.detach().flatten(0, 1).double(), kv.grad.flatten(0, 1).double()
        out[i] = (xs.T @ xs / len(xs), gs.T @ gs / len(gs))
        del model.block(i).attn.project
    return out


def assert_rounding(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal up to float32 rounding: entries within a millionth of the matrix's largest (a
    matrix multiplied on fewer rows rounds a little differently; entries that nearly cancel
    keep no relative precision)."""
    torch.testing.assert_close(got, expected, rtol=1e-5,
                               atol=1e-6 * float(expected.abs().max()))


def test_the_moments_are_autograds_whole_and_streamed(tmp_path: Path) -> None:
    folder = saved(build("llama", num_key_value_heads=2), tmp_path / "m")
    model = load(folder).model
    x = ids()
    targets = torch.roll(x, -1, dims=1)
    expected = brute_force(load(folder).model, x, targets)
    whole = layer_curvature(WholeModel(model), x, targets, windows=1)
    with StreamedFolder(folder, "test") as stream:
        streamed = layer_curvature(stream, x, targets, windows=2)
        # one window at a time, every other block's input recomputed, the MLP 5 rows at once
        pieces = layer_curvature(stream, x, targets, windows=1, segment=1, rows=5)
    for got in (whole, streamed, pieces):
        assert [m.index for m in got] == list(range(model.arch.n_layers))
        for m in got:
            inputs, grads = expected[m.index]
            assert m.tokens == x.numel()
            assert_rounding(m.inputs, inputs)
            assert_rounding(m.grads, grads)


def test_the_moments_do_not_depend_on_how_the_sample_is_cut(tmp_path: Path) -> None:
    """Chunks of windows, checkpointed segments and the MLP in pieces change what is held,
    never the moments (beyond float rounding): a deeper teacher on more windows, whole
    against one window at a time with every block's input but each third recomputed."""
    folder = saved(build("llama", num_key_value_heads=2, num_hidden_layers=5), tmp_path / "m")
    model = load(folder).model
    x = torch.randint(0, 97, (5, 24), generator=torch.Generator().manual_seed(2))
    targets = torch.roll(x, -1, dims=1)
    targets[1, :7] = -100  # positions that do not count stay out of the means
    whole = layer_curvature(WholeModel(model), x, targets, windows=5, segment=5, rows=10_000)
    for windows, segment, rows in ((1, 3, 7), (2, 2, 1), (4, 1, 24)):
        cut = layer_curvature(WholeModel(model), x, targets, windows, segment=segment, rows=rows)
        for a, b in zip(whole, cut, strict=True):
            assert (a.index, a.tokens) == (b.index, b.tokens)
            assert_rounding(b.inputs, a.inputs)
            assert_rounding(b.grads, a.grads)


def test_the_pass_plan_keeps_memory_bounded_whatever_the_sample() -> None:
    """The chunk's kept residual streams fit ``STREAM_BYTES`` at any sample; a window too long
    for every block's input to be kept keeps about sqrt(depth) of them; progress counts block
    passes, never more windows than the sample has."""
    from workers.checkpoints.llama import llama_arch
    from workers.compression.curvature import STREAM_BYTES, pass_plan

    arch = llama_arch(SMOLLM2)
    for windows in (4, 16, 1024):
        short = pass_plan(arch, windows, 512)
        assert short.segment == arch.n_layers
        assert short.windows * arch.n_layers * 512 * arch.d_model * 4 <= STREAM_BYTES
        long = pass_plan(arch, windows, 8192)
        assert (long.windows, long.segment) == (1, 6)  # 6 checkpoints + 5 recomputed of 30
    assert pass_plan(arch, 2, 16).windows == 2
    assert pass_plan(arch, 8, 512).windows == 3  # 3 + 3 + 2 (at most 3 fit), not 3 + 3 + 1 + 1
    assert pass_plan(arch, 7, 512).windows == 3  # 3 + 3 + 1
    assert pass_plan(arch, 1, 8192).block_passes(30) == 60 + 4 * 5


def test_the_fit_is_the_best_of_its_rank_in_the_curvature_norm() -> None:
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(10, 7, generator=g, dtype=torch.float64)
    xs = torch.randn(300, 7, generator=g, dtype=torch.float64) @ torch.randn(
        7, 7, generator=g, dtype=torch.float64)
    gs = torch.randn(300, 10, generator=g, dtype=torch.float64)
    inputs, grads = xs.T @ xs / 300, gs.T @ gs / 300

    def cost(d: torch.Tensor) -> float:
        return 0.5 * float(torch.trace(grads @ d @ inputs @ d.T))

    spectrum = curvature_spectrum(rows, inputs, grads)
    losses = width_losses(spectrum, [1, 3, 7])
    for rank in (1, 3):
        up, down = curvature_factors(rows, inputs, grads, rank)
        assert cost(rows - up @ down) == pytest.approx(losses[rank], rel=1e-4)
        # no other map of that rank does better: perturbations only cost more
        for _ in range(5):
            a = up + 0.01 * torch.randn(up.shape, generator=g, dtype=torch.float64)
            b = down + 0.01 * torch.randn(down.shape, generator=g, dtype=torch.float64)
            assert cost(rows - a @ b) >= losses[rank] - 1e-9
    assert losses[7] == 0.0  # the full rank is the teacher
    up, down = curvature_factors(rows, inputs, grads, 7)
    torch.testing.assert_close(up @ down, rows, atol=1e-8, rtol=1e-8)


def test_the_pairs_left_unturned_cost_least_to_unturn(tmp_path: Path) -> None:
    """A pair whose frequency is ~0 turns nothing: unturning it is free, and it ranks last,
    however large its query and key norms."""
    from workers.compression.heads import layer_maps
    from workers.compression.pairs import derotation_order

    model = load(saved(build("llama", num_key_value_heads=2), tmp_path / "m")).model
    attn = model.block(0).attn
    with torch.no_grad():
        attn.inv_freq0[:, 0] = 1e-9  # pair 0: (almost) no rotation
        w = attn.qkv.weight
        half = attn.groups[0][1] // 2
        for rows in (slice(0, attn.qk_width), slice(attn.qk_width, attn.qk_width + attn.k_width)):
            block = w[rows].view(-1, 2 * half, w.shape[1])
            block[:, [0, half]] *= 20.0  # and the largest norms
    x = model.block(0).attn_norm(model.inputs(ids()))
    maps = layer_maps(attn, 0)
    readers = [m for m in maps if m.group == 0 and m.kv == 0]
    order = derotation_order(readers, x.detach(), causal=True)
    assert order[-1] == 0 and sorted(order) == list(range(half))


def test_the_estimated_widths_end_no_worse_than_measured_ones(tmp_path: Path) -> None:
    """On a small trained Llama at a quarter of its KV cache: the widths the curvature
    estimate picks (fitted by it) end with a held-out loss no worse than the widths of one
    forward per layer and width (fitted by the input-scaled SVD: the rule it replaces)."""
    from alloc.compression import plan_compression, plan_for_kv_cache
    from arch import TrainConfig
    from experiments.llama_compress import SMOKE, teacher_arch
    from userdata import DataSpec
    from userdata.corpora import write_code
    from workers.compression.latent_measure import curvature_latent
    from workers.compression.measure import SAMPLE_BATCH, measure_layers, measure_model
    from workers.compression.students import build_student, pair_orders
    from workers.tasks import make_data_task
    from workers.training.trainer import Trainer, evaluate

    sizes = dataclasses.replace(SMOKE, d_model=64, heads=4, kv_heads=2)
    task = make_data_task(DataSpec(str(write_code(tmp_path / "corpus", 0.3))),
                          length=32)
    trainer = Trainer(teacher_arch(sizes), task, TrainConfig(steps=300, batch_size=16, lr=3e-3,
                                                             eval_every=300, device="cpu"))
    trainer.run()
    teacher = trainer.model.eval()
    sample = task.batch("val", SAMPLE_BATCH, 16)
    x, targets = sample.x, sample.y
    forwards = plan_for_kv_cache(plan_compression(
        measure_model(teacher, x, 32, 4, "sample", targets, form="latent"), 1.0, "loss"), 0.25)
    spectra = measure_layers(WholeModel(teacher), None, 32, 4)
    measured, fits = curvature_latent(WholeModel(teacher), spectra, x, targets)
    estimated = plan_for_kv_cache(plan_compression(measured, 1.0, "loss"), 0.25)
    config = TrainConfig(eval_batches=32, batch_size=32, device="cpu")
    old = build_student(teacher, forwards.student, pair_orders(forwards),
                        forwards.input_scales())
    new = build_student(teacher, estimated.student, pair_orders(estimated),
                        estimated.input_scales(), fits)
    assert estimated.student.kv_width <= 0.25 * teacher.arch.kv_width
    new_loss = evaluate(new, task, config, "cpu")[0]
    old_loss = evaluate(old, task, config, "cpu")[0]
    assert new_loss <= old_loss + 1e-3  # measured: 2.2919 against 2.3016 (teacher 2.2909)

