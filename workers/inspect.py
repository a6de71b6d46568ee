"""What a trained model's attention uses (docs/theory.md §10): per layer and head, the singular
values of the query-key map ``M_h = W_Q,h W_K,h^T / sqrt(d_qk)`` (biases folded in by a
constant input coordinate, as in GPT-2's fused ``c_attn``), its effective rank, and, on a data
sample, the logit bound ``R`` the head reaches, the largest input norm, and the attention
entropy over ``log N``; then the per-layer plan of reduced ``qk_dim`` the saturation rule allows
with these measurements (``alloc.saturation``). ``python -m alloc.profile --checkpoint`` prints
and writes it; ``workers.compress`` builds the student it describes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from alloc.saturation import jacobian_bound
from common.cli import UsageError
from search_spaces import SINGLE_WIDTH_KINDS, ArchConfig, HeadGroup
from workers.attention import FrozenQKAttention, LogitRecorder, MultiHeadAttention
from workers.model import Model, build_model


@dataclass(frozen=True)
class HeadMap:
    """One head's query and key maps, biases folded in: logits are ``(x A)(x B)^T`` for
    ``x = [input, 1]`` (the ``1`` only with biases); ``A, B`` are ``(d [+ 1], qk_dim)``."""

    layer: int
    group: int
    head: int
    a: np.ndarray
    b: np.ndarray

    @property
    def matrix(self) -> np.ndarray:
        """``M = A B^T / sqrt(qk_dim)``, the scaled bilinear map of the logits."""
        return self.a @ self.b.T / math.sqrt(self.a.shape[1])

    def singular_values(self) -> np.ndarray:
        return np.linalg.svd(self.matrix, compute_uv=False)[: self.a.shape[1]]


def head_maps(model: Model) -> list[HeadMap]:
    """Every query-key head of the model (mhsa and frozen_qk layers; MSSA and MixiT heads have
    no separate query and key maps).

    Raises:
        UsageError: a RoPE model, whose logits are not ``x M y^T``: RoPE rotates queries and
            keys by their positions between the two maps, so no single matrix describes a head.
    """
    if model.arch.positional == "rope":
        raise UsageError("positional 'rope': a RoPE model's query-key map depends on the "
                         "positions, so its heads cannot be profiled or compressed by SVD here")
    out = []
    for i, layer in enumerate(model.arch.layers):
        if layer.attention in SINGLE_WIDTH_KINDS:
            continue
        attn = model.block(i).attn
        assert isinstance(attn, MultiHeadAttention)
        linear = attn.qk if isinstance(attn, FrozenQKAttention) else attn.qkv
        weight = linear.weight.detach().double()
        bias = None if linear.bias is None else linear.bias.detach().double()
        offset = 0
        for j, g in enumerate(layer.heads):
            for h in range(g.count):
                rows = slice(offset, offset + g.qk_dim)
                krows = slice(attn.qk_width + offset, attn.qk_width + offset + g.qk_dim)
                a, b = weight[rows].T, weight[krows].T  # (d, qk_dim)
                if bias is not None:
                    a, b = torch.cat([a, bias[rows][None]]), torch.cat([b, bias[krows][None]])
                out.append(HeadMap(i, j, h, a.numpy(), b.numpy()))
                offset += g.qk_dim
    return out


# Share of a head's spectrum (sum of singular values) that its effective rank may discard: a
# description of the spectrum, separate from the attention-error tolerance that sets the plan.
RANK_TAIL = 0.05


def effective_rank(sigma: np.ndarray, tolerance: float = RANK_TAIL) -> int:
    """Smallest r whose discarded singular values sum to at most ``tolerance`` of the total."""
    tail = np.concatenate([np.cumsum(sigma[::-1])[::-1], [0.0]])
    return int(np.argmax(tail <= tolerance * max(tail[0], 1e-300)))


@dataclass(frozen=True)
class Measured:
    """Per layer: per head group, what ``measure``'s ``reduce`` made of its logits (by default
    ``head_statistics``: each head's logit bound and mean normalised entropy); the attention's
    input ``(B, T, d [+ 1])`` (the constant 1 appended when the model has biases) and its
    largest norm."""

    groups: list[list[Any]]
    inputs: list[Tensor]
    norms: list[float]
    causal: bool = True


@torch.no_grad()
def measure(model: Model, x: Tensor,
            reduce: Callable[[Tensor], Any] | None = None) -> Measured:
    """Run ``model`` on ids or vectors ``x`` recording each head group's logits
    ``(B, H, T, T)`` (future entries -inf) reduced by ``reduce`` as they are computed (default
    ``head_statistics``; pass ``lambda z: z`` to keep them whole) and each attention's input."""
    recorder = LogitRecorder(head_statistics if reduce is None else reduce)
    twin = build_model(model.arch, kernel=recorder)
    twin.load_state_dict(model.state_dict())
    twin.eval()
    inputs: list[Tensor] = []
    hooks = [twin.block(i).attn_norm.register_forward_hook(
        lambda _m, _i, out: inputs.append(out)) for i in range(model.arch.n_layers)]
    twin(x)
    for hook in hooks:
        hook.remove()
    # MixiT layers compute no logits: every other layer calls the kernel once per head group.
    counts = [0 if layer.attention == "mixit" else len(layer.heads)
              for layer in model.arch.layers]
    groups, cursor = [], 0
    for count in counts:
        groups.append(recorder.logits[cursor:cursor + count])
        cursor += count
    if model.arch.bias:
        inputs = [torch.cat([x, x.new_ones(*x.shape[:-1], 1)], -1) for x in inputs]
    return Measured(groups, inputs, [float(x.double().norm(dim=-1).max()) for x in inputs],
                    model.arch.causal)


@torch.no_grad()
def measured_errors(head: HeadMap, x: Tensor, ranks: Sequence[int], causal: bool
                    ) -> dict[int, float]:
    """Per rank: the largest change of an attention weight on the inputs ``x`` (B, T, d [+ 1])
    when the head's query-key map is truncated to that rank (everything upstream unchanged)."""
    from workers.attention import future_mask

    xd = x.double()
    matrix = torch.from_numpy(head.matrix)
    u, s, vh = torch.linalg.svd(matrix)

    def attention(m: Tensor) -> Tensor:
        z = xd @ m @ xd.transpose(-1, -2)
        if causal:
            z = z.masked_fill(future_mask(z.shape[-1], z.device), float("-inf"))
        return torch.softmax(z, dim=-1)

    full = attention(matrix)  # the teacher's weights, once for every rank
    return {r: float((full - attention(u[:, :r] * s[:r] @ vh[:r])).abs().max()) for r in ranks}


def head_statistics(logits: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per head: the largest |logit| over allowed pairs, and the mean over rows (with at least
    two keys) of the attention entropy over ``ln N_row``. ``logits``: (B, H, T, T)."""
    allowed = torch.isfinite(logits)
    bound = logits.masked_fill(~allowed, 0).abs().amax(dim=(0, 2, 3))
    p = torch.softmax(logits.double(), dim=-1)
    entropy = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)  # (B, H, T)
    keys = allowed.sum(-1).double()  # (B?, H?, T)
    rows = keys >= 2
    normalised = torch.where(rows, entropy / keys.clamp_min(2).log(), torch.zeros(()))
    mean = normalised.sum(dim=(0, 2)) / rows.sum(dim=(0, 2)).clamp_min(1)
    return bound.numpy(), mean.numpy()


# --- the plan --------------------------------------------------------------------------------


def predicted_error(sigma: np.ndarray, rank: int, seq_len: int, logit_bound: float,
                    norm: float) -> float:
    """Bound on the largest attention-weight change of a rank-``rank`` student of this head:
    ``||J|| * max |delta logit|`` with ``||J|| <= min(1/2, 2 e^{2R'} / N)``, ``R'`` bounding the
    teacher's and the student's logits, and ``|delta logit| <= norm^2 sum_{i>r} sigma_i``
    (docs/theory.md §4, §10)."""
    delta = norm * norm * float(sigma[rank:].sum())
    return jacobian_bound(seq_len, logit_bound + delta) * delta


RULES = ("bound", "measured")


def candidate_dims(qk_dim: int, align: int) -> list[int]:
    """The ``qk_dim`` a head group of ``qk_dim`` may be reduced to: multiples of ``align``
    below it, and itself."""
    return sorted({*range(align, qk_dim, align), qk_dim})


def group_plan(sigmas: Sequence[np.ndarray], group: HeadGroup, seq_len: int,
               logit_bound: float, norm: float, tolerance: float, align: int,
               measured: Sequence[dict[int, float]] | None = None, rule: str = "bound"
               ) -> dict[str, Any]:
    """The smallest aligned ``qk_dim`` of the group whose error stays within ``tolerance`` for
    every head: the bound's (``rule="bound"``, docs/theory.md §4) or the error measured on the
    data sample (``"measured"``); each candidate's bound and measured error are reported.
    ``measured``: per head, the measured error of each candidate."""
    candidates = candidate_dims(group.qk_dim, align)
    bound = {r: max(predicted_error(s, r, seq_len, logit_bound, norm) for s in sigmas)
             for r in candidates}
    seen = ({r: max(m[r] for m in measured) for r in candidates} if measured is not None
            else None)
    decide = seen if rule == "measured" and seen is not None else bound
    chosen = next(r for r in candidates if decide[r] <= tolerance or r == group.qk_dim)
    return {"count": group.count, "qk_dim": group.qk_dim, "v_dim": group.v_dim,
            "reduced_qk_dim": chosen, "predicted_error": bound[chosen],
            "measured_error": None if seen is None else seen[chosen],
            "errors": {int(r): float(e) for r, e in bound.items()},
            "measured_errors": None if seen is None else {int(r): float(e)
                                                          for r, e in seen.items()}}


def student_arch(arch: ArchConfig, plan: Sequence[dict[str, Any]]) -> ArchConfig:
    """``arch`` with each planned group's ``qk_dim`` reduced (``plan``: the profile's layers)."""
    layers = list(arch.layers)
    for entry in plan:
        i = entry["index"]
        if entry.get("groups"):
            heads = tuple(HeadGroup(g["count"], g["reduced_qk_dim"], g["v_dim"])
                          for g in entry["groups"])
            layers[i] = dataclasses.replace(layers[i], heads=heads)
    return ArchConfig.from_dict({**arch.to_dict(), "layers": [x.to_dict() for x in layers]})


def norm_bound(model: Model, index: int) -> float:
    """Without data: a bound on the attention input's norm from the layer's norm parameters,
    ``sqrt(d) max|gamma| + ||beta||`` (a normalised vector has norm ``sqrt(d)``)."""
    params = dict(model.block(index).attn_norm.named_parameters())
    gamma = params["weight"].detach().abs().max().item()
    beta = params["bias"].detach().norm().item() if "bias" in params else 0.0
    bound = math.sqrt(model.arch.d_model) * gamma + beta
    return math.sqrt(bound * bound + 1) if model.arch.bias else bound


def profile_checkpoint(model: Model, x: Tensor | None, seq_len: int, tolerance: float,
                       align: int, logit_bound: float | None = None,
                       rule: str = "bound") -> dict[str, Any]:
    """The per-layer profile and plan of ``model`` (a YAML-able dict; docs/theory.md §10).

    Args:
        model: the trained model.
        x: a data sample (ids or vectors, ``(B, T)`` / ``(B, T, d)``), or None.
        seq_len: N of the saturation rule (the sample's length when measured).
        tolerance: allowed attention error per head.
        align: candidate ``qk_dim`` are multiples of it.
        logit_bound: assumed R without data (None: any logits, ``||J|| <= 1/2``).
        rule: ``bound`` (the saturation rule's guarantee) or ``measured`` (the error measured
            on ``x``; needs it) decides each ``qk_dim``.
    """
    maps = head_maps(model)
    measured = measure(model, x) if x is not None else None
    layers = []
    for i, layer in enumerate(model.arch.layers):
        entry: dict[str, Any] = {"index": i, "attention": layer.attention,
                                 "heads": layer.heads_str, "groups": [], "head_stats": []}
        if measured is not None and measured.groups[i]:
            stats = measured.groups[i]
            bounds = np.concatenate([b for b, _ in stats])
            entropy = np.concatenate([e for _, e in stats])
            entry |= {"logit_bound": float(bounds.max()), "token_norm": measured.norms[i],
                      "entropy": float(entropy.mean()),
                      "head_stats": [{"logit_bound": float(b), "entropy": float(e)}
                                     for b, e in zip(bounds, entropy)]}
        norm = entry.get("token_norm") or norm_bound(model, i)
        r_bound = entry.get("logit_bound", logit_bound if logit_bound is not None else math.inf)
        mine = [m for m in maps if m.layer == i]
        spectra = {(m.group, m.head): m.singular_values() for m in mine}
        entry["spectra"] = [{"group": g, "head": h, "sigma": [float(v) for v in sigma],
                             "effective_rank": effective_rank(sigma)}
                            for (g, h), sigma in spectra.items()]
        if mine:
            entry["groups"] = [_plan(j, group, mine, spectra, measured, (seq_len, r_bound, norm),
                                     tolerance, align, rule)
                               for j, group in enumerate(layer.heads)]
        layers.append(entry)
    student = student_arch(model.arch, layers)
    return {"arch_id": model.arch.arch_id, "seq_len": seq_len, "tolerance": tolerance,
            "align": align, "rule": rule, "measured": x is not None, "layers": layers,
            "student": student.to_dict()}


def _plan(j: int, group: HeadGroup, maps: list[HeadMap],
          spectra: dict[tuple[int, int], np.ndarray], measured: Measured | None,
          setting: tuple[int, float, float], tolerance: float, align: int, rule: str
          ) -> dict[str, Any]:
    """``group_plan`` of group ``j`` of a layer, its heads' errors measured when there is data."""
    heads = [m for m in maps if m.group == j]
    errors = None
    if measured is not None:
        x = measured.inputs[heads[0].layer]
        errors = [measured_errors(h, x, candidate_dims(group.qk_dim, align), measured.causal)
                  for h in heads]
    return group_plan([spectra[(h.group, h.head)] for h in heads], group, *setting, tolerance,
                      align, errors, rule)


# --- python -m alloc.profile --checkpoint ---------------------------------------------------


WINDOW_TOKENS = 32 * 1024  # default checkpoint sample: 32 windows of 1,024 tokens

# Validation batches from this index on are the profile's sample: ``workers.compress`` and the
# trainer evaluate on batches 0, 1, ..., so a plan is never chosen on the windows it is scored on.
SAMPLE_BATCH = 1 << 20


def sample(model: Model, data: Any, seq_len: int | None, count: int = 32,
           seed: int = 0) -> tuple[Tensor, int]:
    """``count`` validation windows of the user's data (``DataSpec``) for ``model``, and their
    length (at most the model's ``max_seq_len``); drawn apart from the evaluation batches."""
    from workers.tasks import make_data_task

    length = min(seq_len or model.arch.max_seq_len, model.arch.max_seq_len)
    task = make_data_task(data, length=length, seed=seed)
    batch = task.batch("val", SAMPLE_BATCH, count)
    if model.arch.vocab_size is not None and int(batch.x.max()) >= model.arch.vocab_size:
        raise ValueError(f"--data {data.path!r}: token {int(batch.x.max())} is outside the "
                         f"model's vocabulary of {model.arch.vocab_size}")
    return batch.x, task.seq_len


def render(profile: dict[str, Any]) -> str:
    from common.cli import render_table

    rows = []
    for layer in profile["layers"]:
        plan = "  ".join(f"{g['count']}x{g['qk_dim']}->{g['reduced_qk_dim']} (bound "
                         f"{g['predicted_error']:.3g}" + (f", measured {g['measured_error']:.3g}"
                                                          if g["measured_error"] is not None
                                                          else "") + ")"
                         for g in layer["groups"]) or "-"
        ranks = ",".join(str(s["effective_rank"]) for s in layer["spectra"]) or "-"
        rows.append([layer["index"], layer["attention"], layer["heads"],
                     _fmt(layer.get("logit_bound")), _fmt(layer.get("token_norm")),
                     _fmt(layer.get("entropy")), ranks, plan])
    head = (f"checkpoint profile: N = {profile['seq_len']}, tolerance {profile['tolerance']:g} "
            f"on the {profile['rule']} error"
            f"{'' if profile['measured'] else ' (no data: ||J|| <= 1/2, norms from the norms)'}")
    table = render_table(["layer", "attention", "heads", "R", "max |x|", "entropy/ln N",
                          "effective ranks", "qk_dim plan (attention error)"], rows,
                         right=[True, False, False, True, True, True, False, False])
    return f"{head}\n{table}"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def plot(profile: dict[str, Any], path: Any) -> None:
    from common.plots import new_figure, write_figure

    fig, axes = new_figure(2, (11, 4.2))
    for layer in profile["layers"]:
        for k, spectrum in enumerate(layer["spectra"]):
            sigma = np.array(spectrum["sigma"])
            axes[0].semilogy(np.arange(1, len(sigma) + 1), np.maximum(sigma, 1e-12),
                             color=f"C{layer['index'] % 10}", alpha=0.6,
                             label=f"layer {layer['index']}" if k == 0 else None)
    axes[0].set_xlabel("singular value index i")
    axes[0].set_ylabel("sigma_i of W_Q,h W_K,h^T / sqrt(d_qk) (floor 1e-12)")
    axes[0].set_title("query-key spectrum of every head")
    axes[0].legend(fontsize=8)
    measured = [x for x in profile["layers"] if x.get("entropy") is not None]
    if measured:
        axes[1].plot([x["index"] for x in measured], [x["entropy"] for x in measured], "o-",
                     label="entropy / ln N (1: uniform attention)")
        axes[1].plot([x["index"] for x in measured],
                     [min(1.0, 1 / max(x["logit_bound"], 1e-9)) for x in measured], "s--",
                     label="1 / R (R: largest |logit|)")
        axes[1].legend(fontsize=8)
    axes[1].set_xlabel("layer")
    axes[1].set_ylabel("mean over heads and rows")
    axes[1].set_title("how saturated the softmax is, per layer")
    write_figure(fig, path)


def main_checkpoint(args: Any) -> int:
    """``python -m alloc.profile --checkpoint PATH [--data PATH]`` (``args`` parsed there)."""
    import sys

    import yaml

    from common.cli import check_writable, dump, fail
    from common.files import write_atomic
    from search_spaces.data import DataError, DataSpec
    from workers.checkpoints import CheckpointError, load

    prog = "alloc.profile"
    try:
        for flag, path in (("--out", args.out), ("--plot", args.plot)):
            if path is not None:
                check_writable(flag, path)
        loaded = load(args.checkpoint)
        x, seq_len = (None, args.seq_len or loaded.arch.max_seq_len)
        if args.data is not None:
            spec = DataSpec(str(args.data), args.data_format, args.data_dtype, args.vocab_size)
            length = min(args.seq_len or loaded.arch.max_seq_len, loaded.arch.max_seq_len)
            windows = max(1, (args.sample_tokens or WINDOW_TOKENS) // length)
            x, seq_len = sample(loaded.model, spec, args.seq_len, windows, args.seed)
    except (CheckpointError, DataError, UsageError, ValueError) as err:
        return fail(prog, str(err))
    rule = args.rule or ("measured" if x is not None else "bound")
    if rule == "measured" and x is None:
        return fail(prog, "--rule measured: needs --data (the sample the errors are measured on)")
    profile = profile_checkpoint(loaded.model, x, seq_len, args.tolerance, args.align,
                                 args.logit_bound, rule)
    profile = {"checkpoint": str(args.checkpoint), "layout": loaded.layout,
               "data": None if args.data is None else str(args.data), **profile}
    if args.out is not None:
        write_atomic(args.out, yaml.safe_dump(profile, sort_keys=False))
    if args.plot is not None:
        plot(profile, args.plot)
    print(render(profile) if args.format == "table" else dump(profile, args.format),
          file=sys.stdout)
    return 0
