"""The keys of a search space's YAML (docs/guide/search.md), how a rule's ``layers`` key reads,
and what the allocator's plan is to a space: a ``Planner`` of (budget, depth)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arch import ArchConfig, TrainConfig
from arch.checks import add, is_int

SPACES_DIR = Path(__file__).resolve().parent
TRAIN_KEYS = TrainConfig.experiment_fields()
FIXED_TRAIN_KEYS = ("steps", "eval_every")  # the scheduler needs one budget per study
MODEL_KEYS = ("positional", "norm", "mlp", "causal", "tie_embeddings", "seed")


@dataclass(frozen=True)
class SamplerTraits:
    """What a search's sampler (``sampler:`` in a space, ``workers.search --sampler``) does
    before and beside sampling; its Optuna sampler is ``workers.search.study.SAMPLERS``.

    Attributes:
        name: the sampler's registry name.
        summary: how it proposes points.
        enumerates: every point of the space is a trial (the space must be finite), its points
            enqueued in order.
        seeded: the allocator's plan (and its neighbours) is enqueued first; the prior instead
            proposes the plan itself, as its prior's mode.
    """

    name: str
    summary: str
    enumerates: bool = False
    seeded: bool = True


SAMPLER_KINDS: Mapping[str, SamplerTraits] = {s.name: s for s in (
    SamplerTraits("tpe", "Optuna's TPE, after the allocator's seeds"),
    SamplerTraits("grid", "every point of the space in order, then TPE", enumerates=True),
    SamplerTraits("random", "uniform over the space, after the allocator's seeds"),
    SamplerTraits("prior", "the allocator's bound as a prior whose weight follows the evidence",
                  seeded=False),
)}
SAMPLERS = tuple(SAMPLER_KINDS)
REDUCED = {"min": 8, "step": 8}
ALLOCATOR = "allocator"
TOP_KEYS = ("name", "description", "budget", "depth", "model", "layers", "train", "sampler",
             "data")
DATA_KEYS = ("path", "format", "dtype", "vocab_size")
RULE_KEYS = ("layers", "attention", "mlp_ratio", "heads", "head_dim", "qk_dim", "budget",
              "role", "eta", "freeze_mlp", "shared", "groups", "kv_heads", "latent_dim",
              "rope_dim")
# The allocator's plan for (budget, depth): what resolves ``allocator`` placeholders.
Planner = Callable[[int, int], ArchConfig]


def layer_indices(problems: list[str], key: str, value: Any, depth: int) -> tuple[int, ...]:
    if value in (None, "all"):
        return tuple(range(depth))
    if is_int(value):
        value = [value]
    elif isinstance(value, str) and "-" in value:
        first, _, last = value.partition("-")
        if first.strip().isdigit() and last.strip().isdigit():
            value = list(range(int(first), int(last) + 1))
    if not isinstance(value, list) or not value or not all(is_int(v) for v in value):
        add(problems, key, value,
            "must be 'all', a layer index, a range 'a-b' or a list of indices")
        return ()
    outside = [v for v in value if not 0 <= v < depth]
    if outside:
        add(problems, key, value, f"layer indices must lie in 0..{depth - 1} (depth {depth})")
        return ()
    return tuple(value)
