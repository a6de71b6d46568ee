"""workers.models.model: exact parameter counts, reference parity, frozen weights, causality,
I/O."""

from __future__ import annotations

import io
import math

import pytest
import torch
from hypothesis import given, settings
from torch import Tensor

from arch import ArchConfig, HeadGroup, LayerSpec, param_count
from tests.helpers.strategies import arch_configs
from workers.models.attention import FrozenQKAttention, MultiHeadAttention, SubspaceAttention
from workers.models.model import build_model, count_params
from workers.tasks import DATA_TASKS, TASKS, fit_arch, make_task

KINDS = ["mhsa", "frozen_qk", "mssa", "mixit", "latent"]


def arch_of(kind: str, causal: bool = True, positional: str = "learned", tokens: bool = False,
            heads: tuple[HeadGroup, ...] = (HeadGroup(2, 8), HeadGroup(3, 4)),
            mlp_ratio: float = 2.0, **layer: object) -> ArchConfig:
    if kind == "latent":
        layer.setdefault("latent_dim", 12)
    spec = LayerSpec(kind, heads, mlp_ratio=mlp_ratio, **layer)  # type: ignore[arg-type]
    io_kwargs: dict[str, object] = {"vocab_size": 17} if tokens else {"input_dim": 5}
    return ArchConfig(d_model=24, layers=(spec, spec), max_seq_len=12, causal=causal,
                      positional=positional, **io_kwargs)  # type: ignore[arg-type]


def inputs(arch: ArchConfig, batch: int = 2, t: int | None = None, seed: int = 0) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    t = t or arch.max_seq_len
    if arch.vocab_size is not None:
        return torch.randint(0, arch.vocab_size, (batch, t), generator=g)
    assert arch.input_dim is not None
    return torch.randn(batch, t, arch.input_dim, generator=g)


@settings(max_examples=120, deadline=None)
@given(arch_configs())
def test_parameter_count_equals_the_analytic_count(arch: ArchConfig) -> None:
    model = build_model(arch)
    expected = param_count(arch)
    assert count_params(model) == (expected.trainable, expected.total)
    out = model(inputs(arch, batch=1))
    assert out.shape[-1] == (arch.vocab_size or arch.output_dim)


@pytest.mark.parametrize("task_name", sorted(set(TASKS) - set(DATA_TASKS)))
@pytest.mark.parametrize("kind", KINDS)
def test_task_fitted_count_equals_the_built_model(kind: str, task_name: str) -> None:
    """What a study records for a trial (the analytic count of the task-fitted architecture) is
    the count of the model that trains, for every attention kind on every task."""
    arch = fit_arch(arch_of(kind, heads=(HeadGroup(2, 8),)), make_task(task_name, "smoke"))
    count = param_count(arch)
    assert count_params(build_model(arch)) == (count.trainable, count.total)


def reference_attention(x: Tensor, wq: Tensor, wk: Tensor, wv: Tensor, wo: Tensor,
                        heads: int, causal: bool) -> Tensor:
    """Textbook multi-head attention, one head at a time, explicit mask and softmax."""
    t = x.shape[1]
    dq, dv = wq.shape[0] // heads, wv.shape[0] // heads
    outs = []
    for h in range(heads):
        q = x @ wq[h * dq:(h + 1) * dq].T
        k = x @ wk[h * dq:(h + 1) * dq].T
        v = x @ wv[h * dv:(h + 1) * dv].T
        scores = q @ k.transpose(1, 2) / math.sqrt(dq)
        if causal:
            scores = scores.masked_fill(torch.ones(t, t).triu(1).bool(), float("-inf"))
        outs.append(torch.softmax(scores, dim=-1) @ v)
    return torch.cat(outs, dim=-1) @ wo.T


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kind", ["mhsa", "frozen_qk"])
def test_uniform_group_matches_reference(kind: str, causal: bool) -> None:
    arch = arch_of(kind, causal=causal, heads=(HeadGroup(3, 8, 6),))
    attn = build_model(arch).blocks[0].attn
    x = torch.randn(2, 12, 24)
    if isinstance(attn, FrozenQKAttention):
        wq, wk = attn.qk.weight.chunk(2)
        wv = attn.v.weight
    else:
        assert isinstance(attn, MultiHeadAttention)
        wq, wk, wv = attn.qkv.weight.split([24, 24, 18])
    expected = reference_attention(x, wq, wk, wv, attn.out.weight, 3, causal)
    torch.testing.assert_close(attn(x), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tied", [True, False])
def test_mssa_matches_its_formula(tied: bool) -> None:
    arch = arch_of("mssa", heads=(HeadGroup(3, 4),), tied_output=tied, causal=False)
    attn = build_model(arch).blocks[0].attn
    assert isinstance(attn, SubspaceAttention)
    u = attn.basis.weight.T  # (d_model, heads * dim) = [U_1 .. U_K]
    x = torch.randn(1, 12, 24)
    heads_out = []
    for h in range(3):
        p = x @ u[:, 4 * h:4 * h + 4]  # (1, T, 4)
        a = torch.softmax(p @ p.transpose(1, 2) / 2.0, dim=-1)
        heads_out.append(a @ p)
    o = torch.cat(heads_out, dim=-1)
    expected = o @ u.T if tied else attn.out(o)  # type: ignore[misc]
    torch.testing.assert_close(attn(x), expected, rtol=1e-5, atol=1e-6)


def test_groups_of_different_dims_equal_separate_layers() -> None:
    # A two-group layer is the sum of two one-group layers sharing its weights.
    arch = arch_of("mhsa", heads=(HeadGroup(2, 8), HeadGroup(3, 4, 6)))
    attn = build_model(arch).blocks[0].attn
    assert isinstance(attn, MultiHeadAttention)
    x = torch.randn(2, 12, 24)
    wq, wk, wv = attn.qkv.weight.split([28, 28, 34])
    wo = attn.out.weight
    first = reference_attention(x, wq[:16], wk[:16], wv[:16], wo[:, :16], 2, True)
    second = reference_attention(x, wq[16:], wk[16:], wv[16:], wo[:, 16:], 3, True)
    torch.testing.assert_close(attn(x), first + second, rtol=1e-5, atol=1e-6)


def frozen_tensors(model: torch.nn.Module) -> dict[str, Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}


@pytest.mark.parametrize(("kind", "freeze_mlp"), [("frozen_qk", False), ("mhsa", True),
                                                  ("frozen_qk", True)])
def test_frozen_weights_do_not_move(kind: str, freeze_mlp: bool) -> None:
    model = build_model(arch_of(kind, freeze_mlp=freeze_mlp))
    before = frozen_tensors(model)
    trained = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert before, "nothing frozen"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        loss = model(inputs(model.arch)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = dict(model.named_parameters())
    assert all(torch.equal(after[n], t) and not after[n].requires_grad
               for n, t in before.items())
    assert all(not torch.equal(after[n], t) for n, t in trained.items())
    assert set(before) <= set(model.state_dict())  # frozen weights are still checkpointed


# RoPE is rejected for mixit when the config is built (test_arch).
VALID_POSITIONS = [(kind, pos) for kind in KINDS for pos in ("learned", "sinusoidal", "rope")
                   if (kind, pos) != ("mixit", "rope")]


@pytest.mark.parametrize(("kind", "positional"), VALID_POSITIONS)
def test_causal_models_never_see_the_future(kind: str, positional: str) -> None:
    for tokens in (False, True):
        model = build_model(arch_of(kind, positional=positional, tokens=tokens))
        x = inputs(model.arch)
        y = x.clone()
        cut = 7
        y[:, cut] = (y[:, cut] + 3) % 17 if tokens else y[:, cut] + 3.0
        a, b = model(x), model(y)
        torch.testing.assert_close(a[:, :cut], b[:, :cut], rtol=0, atol=1e-6)
        assert not torch.allclose(a[:, cut:], b[:, cut:])


def test_bidirectional_models_see_everything() -> None:
    model = build_model(arch_of("mhsa", causal=False))
    x = inputs(model.arch)
    y = x.clone()
    y[:, -1] += 3.0
    assert not torch.allclose(model(x)[:, 0], model(y)[:, 0])


def test_checkpoint_round_trip_and_tied_embeddings() -> None:
    arch = ArchConfig(d_model=24, vocab_size=17, max_seq_len=12, tie_embeddings=True,
                      layers=(LayerSpec("mixit", (HeadGroup(2, 12),)),
                              LayerSpec("frozen_qk", (HeadGroup(2, 12),), mlp_ratio=1)))
    model = build_model(arch)
    assert model.head.weight is model.embed.weight
    state = model.state_dict()
    assert not any("mix" in key for key in state)  # MixiT matrices are regenerated, not saved
    buffer = io.BytesIO()
    torch.save(state, buffer)
    torch.manual_seed(123)  # a different global RNG state must not change the rebuilt model
    clone = build_model(arch)
    clone.load_state_dict(torch.load(io.BytesIO(buffer.getvalue())))
    x = inputs(arch)
    torch.testing.assert_close(clone(x), model(x), rtol=0, atol=0)


def test_shorter_sequences_and_too_long_ones() -> None:
    model = build_model(arch_of("mhsa"))
    assert model(inputs(model.arch, t=5)).shape == (2, 5, 5)
    with pytest.raises(ValueError, match="exceeds max_seq_len 12"):
        model(inputs(model.arch, t=13))


@pytest.mark.parametrize("kind", KINDS)
def test_bf16_autocast_gives_the_float32_outputs_and_gradients(kind: str) -> None:
    """Under bf16 autocast every kind computes what it computes in float32, to bf16's precision
    (8 bits of mantissa; over 20 seeds at most 1.0% of the largest output and 0.74% of the
    gradient's norm, so 3% fails a real difference), forward and backward, and every
    trainable weight gets a gradient."""
    model = build_model(arch_of(kind, positional="sinusoidal"))
    x = inputs(model.arch)
    expected = model(x)
    expected.pow(2).mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    assert out.dtype == torch.bfloat16  # autocast really ran the matmuls in bf16
    out.float().pow(2).mean().backward()
    scale = expected.detach().abs().max()
    torch.testing.assert_close(out.detach().float(), expected.detach(), rtol=0,
                               atol=0.03 * float(scale))
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {n for n, p in model.named_parameters() if p.grad is not None} == trained == set(grads)
    # The whole gradient, as the optimiser sees it: bf16 rounding of it, not another gradient
    # (one small map's own direction, e.g. a query map's near a saturated softmax, can turn more).
    got = torch.cat([p.grad.flatten() for n, p in model.named_parameters() if n in grads])
    want = torch.cat([grads[n].flatten() for n, _ in model.named_parameters() if n in grads])
    assert float((got - want).norm() / want.norm()) < 0.03  # 20 seeds: at most 0.0074


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", KINDS)
def test_cuda_matches_cpu(kind: str) -> None:
    model = build_model(arch_of(kind))
    x = inputs(model.arch)
    expected = model(x)
    model.cuda()
    torch.testing.assert_close(model(x.cuda()).cpu(), expected, rtol=1e-4, atol=1e-4)
