"""Search spaces over the students of a pretrained checkpoint (``search_spaces/students/``):
per layer the latent width and the RoPE part of a latent student, sampled around the
allocator's curvature plan, under the KV cache budget as a hard constraint.

A point of the space is, per layer ``i``, ``L{i}.latent_dim`` (one of the plan's width times
``width_scales``) and ``L{i}.rope_dim`` (the plan's RoPE part per key/value head times
``rope_scales``, even; none in the ``latent`` form, which turns its keys after it rebuilds
them), and the study-wide ``kv_cache`` (the budget times one of
``kv_shares``): the fraction of the teacher's KV cache the student may spend. A point is
repaired into an ``Allocation`` that spends exactly what its ``kv_cache`` allows
(``fit_allocation``): the RoPE parts scaled down if they leave less than one latent unit per
layer, then the latent widths scaled, in proportion to the sampled ones, to the units left
(largest remainders, each within ``[1, its full rank]``). The sampled widths are the relative
shares the search learns; the repaired ones the student it measures.

The space names no teacher: the teacher, the calibration data, the held-out data and the
budget are the command's (``workers.search --space student_kv.yaml --teacher DIR --data
tokens/ --eval tokens/ --kv-cache 0.25``). Student forms are ``alloc.compression.FORMS``'
names; this package checks only that one is given (the search checks the name).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from arch.checks import is_int, is_number
from common.files import read_yaml
from search_spaces.errors import SpaceError
from search_spaces.loader import raise_if_any
from search_spaces.schema import SAMPLER_KINDS, SPACES_DIR
from search_spaces.suggest import Suggester

STUDENT_SPACES_DIR = SPACES_DIR / "students"
STUDENT_KEYS = ("name", "description", "form", "width_scales", "rope_scales", "kv_shares",
                "seq_len", "sample_tokens", "eval_tokens", "eval_chunks", "distil_steps",
                "align", "sampler", "trials", "refit_after")
STUDENT_SAMPLERS = ("tpe", "random", "prior")  # no grid: the space is per layer
KV_CACHE = "kv_cache"  # the point's budget share, as a fraction of the teacher's KV cache


def latent_name(i: int) -> str:
    """Layer ``i``'s latent width, as an Optuna parameter (``LayerSpec.latent_dim``)."""
    return f"L{i}.latent_dim"


def rope_name(i: int) -> str:
    """Layer ``i``'s RoPE part per key/value head (``LayerSpec.rope_dim``)."""
    return f"L{i}.rope_dim"


@dataclass(frozen=True)
class Allocation:
    """A student's per-layer allocation: what it may spend (``kv_cache``, a fraction of the
    teacher's KV cache), each layer's latent width and RoPE part per key/value head."""

    kv_cache: float
    latent_dims: tuple[int, ...]
    rope_dims: tuple[int, ...]

    def units(self, kv_heads: Sequence[int]) -> int:
        """KV cache units per token (each layer's latent and its key/value heads' RoPE parts)."""
        return sum(c + h * r for c, r, h in zip(self.latent_dims, self.rope_dims, kv_heads))

    def params(self) -> dict[str, Any]:
        """The allocation as the space's Optuna parameters (a layer without a RoPE part has
        no ``rope_dim`` to choose)."""
        point: dict[str, Any] = {KV_CACHE: self.kv_cache}
        for i, (c, r) in enumerate(zip(self.latent_dims, self.rope_dims)):
            point[latent_name(i)] = c
            if r:
                point[rope_name(i)] = r
        return point

    def key(self) -> str:
        """A content address of the allocation (its student's folder name)."""
        text = json.dumps([self.kv_cache, self.latent_dims, self.rope_dims])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        """Per layer ``c24+r8``: the latent width and the RoPE part per key/value head
        (``c24`` without one)."""
        return " ".join(f"c{c}+r{r}" if r else f"c{c}"
                        for c, r in zip(self.latent_dims, self.rope_dims))

    def to_dict(self) -> dict[str, Any]:
        return {"kv_cache": self.kv_cache, "latent_dims": list(self.latent_dims),
                "rope_dims": list(self.rope_dims)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Allocation:
        return cls(float(data["kv_cache"]), tuple(int(c) for c in data["latent_dims"]),
                   tuple(int(r) for r in data["rope_dims"]))


@dataclass(frozen=True)
class TeacherShape:
    """What the space needs of the teacher: per layer its key/value heads, the widest RoPE
    part a head can keep (its ``qk_dim``), the full rank of its latent at each RoPE part
    (``full_rank(i, r)``: every key row but the RoPE part, and every value row, at most
    ``d_model``), and its KV cache units per token."""

    kv_heads: tuple[int, ...]
    qk_dims: tuple[int, ...]
    v_dims: tuple[int, ...]
    d_model: int
    teacher_units: int

    def full_rank(self, i: int, rope_dim: int) -> int:
        h = self.kv_heads[i]
        return min(self.d_model, h * (self.qk_dims[i] - rope_dim + self.v_dims[i]))

    def allowed(self, kv_cache: float) -> int:
        """The units per token ``kv_cache`` of the teacher's allows."""
        return math.floor(kv_cache * self.teacher_units + 1e-9)


@dataclass(frozen=True)
class StudentSpace:
    """A student search space, validated (``read_student_space``)."""

    name: str
    description: str
    form: str
    width_scales: tuple[float, ...]
    rope_scales: tuple[float, ...]
    kv_shares: tuple[float, ...]
    seq_len: int
    sample_tokens: int
    eval_tokens: int
    eval_chunks: int
    distil_steps: int
    align: int
    sampler: str
    trials: int
    refit_after: int  # students measured (earlier studies' too) before the refit (0: never)
    data: Mapping[str, Any]  # the validated YAML content (hashed)

    @property
    def hash(self) -> str:
        text = json.dumps(dict(self.data), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def smoke(self) -> StudentSpace:
        """The space at smoke size: a few short windows (``--smoke-test``)."""
        return dataclasses.replace(self, seq_len=min(self.seq_len, 32),
                                   sample_tokens=min(self.sample_tokens, 256),
                                   eval_tokens=min(self.eval_tokens, 256),
                                   eval_chunks=min(self.eval_chunks, 2))

    def kv_choices(self, budget: float) -> list[float]:
        """The ``kv_cache`` fractions a point may spend: the budget times each share."""
        return sorted({round(budget * s, 6) for s in self.kv_shares})

    def latent_choices(self, mode: int, cap: int) -> list[int]:
        """A layer's latent widths: the plan's ``mode`` times each scale, within ``[1, cap]``."""
        return sorted({min(cap, max(1, round(mode * s))) for s in self.width_scales} | {mode})

    def rope_choices(self, mode: int, widest: int) -> list[int]:
        """A layer's RoPE parts: the plan's ``mode`` times each scale, even, within
        ``[2, widest]``; none but 0 where the plan has no RoPE part (the ``latent`` form, whose
        keys are turned after they are rebuilt)."""
        if not mode:
            return [0]
        return sorted({min(widest // 2 * 2, max(2, round(mode * s / 2) * 2))
                       for s in self.rope_scales} | {mode})

    def cached_ropes(self, mode: int, widest: int, budget: float) -> list[int]:
        """Every RoPE part a point may build: each choice at the budget, scaled to each of
        the ``kv_cache`` choices (what a study measures its teacher at)."""
        return sorted({scaled_rope(r, kv / budget) for r in self.rope_choices(mode, widest)
                       for kv in self.kv_choices(budget)})

    def sample(self, trial: Suggester, plan: Allocation, shape: TeacherShape,
               budget: float) -> Allocation:
        """A point around ``plan`` (the allocator's allocation at ``budget``), repaired to what
        its ``kv_cache`` allows (``fit_allocation``). A layer's ``rope_dim`` is its part at the
        budget: a point that spends a share of it keeps that share of the part (even, at least
        2), as the allocator's plan at that size would."""
        kv = float(trial.suggest_categorical(KV_CACHE, self.kv_choices(budget)))
        ropes, widths, choices = [], [], []
        for i, (c, r) in enumerate(zip(plan.latent_dims, plan.rope_dims)):
            options = self.rope_choices(r, shape.qk_dims[i])
            choices.append(sorted({scaled_rope(o, kv / budget) for o in options}))
            rope = int(trial.suggest_categorical(rope_name(i), options)) if r else 0
            ropes.append(scaled_rope(rope, kv / budget))
            widths.append(int(trial.suggest_categorical(latent_name(i), self.latent_choices(
                c, shape.full_rank(i, r)))))
        return fit_allocation(kv, widths, ropes, shape, choices)

    def modes(self, plan: Allocation, budget: float) -> dict[str, Any]:
        """The plan's point: the prior sampler's mode (every layer as planned, the budget
        spent)."""
        return {**plan.params(), KV_CACHE: max(self.kv_choices(budget))}


def scaled_rope(rope: int, share: float) -> int:
    """A RoPE part per key/value head at ``share`` of the budget it was chosen at: even, at
    least 2 (the whole part at a share of 1); none stays none."""
    return max(2, round(rope * share / 2) * 2) if rope else 0


def fit_allocation(kv_cache: float, widths: Sequence[float], ropes: Sequence[int],
                   shape: TeacherShape, rope_choices: Sequence[Sequence[int]] | None = None
                   ) -> Allocation:
    """The student that spends exactly what ``kv_cache`` allows, its latent widths in proportion
    to ``widths`` and its RoPE parts ``ropes``; where those would leave less than one latent
    unit per layer, the largest RoPE parts step down to their next smaller choice
    (``rope_choices[i]``, default every even part from 2) until they leave one.

    Raises:
        SpaceError: even the smallest RoPE parts leave less than one latent unit per layer.
    """
    allowed = shape.allowed(kv_cache)
    room = allowed - len(widths)  # every layer keeps at least one latent unit
    ropes = fit_ropes(ropes, room, shape.kv_heads, rope_choices)
    rope_units = sum(h * r for h, r in zip(shape.kv_heads, ropes))
    if rope_units > room:
        raise SpaceError(f"kv_cache {kv_cache:g}: {allowed} units per token cannot hold the "
                         f"smallest RoPE parts ({rope_units}) and one latent unit per layer")
    caps = [shape.full_rank(i, r) for i, r in enumerate(ropes)]
    total = allowed - rope_units
    mass = sum(max(0.0, float(w)) for w in widths)
    weights = [max(0.0, float(w)) * total / mass if mass > 0 else 1.0 for w in widths]
    return Allocation(kv_cache, tuple(repair(weights, total, caps)), tuple(ropes))


def fit_ropes(ropes: Sequence[int], room: int, kv_heads: Sequence[int],
              choices: Sequence[Sequence[int]] | None = None) -> list[int]:
    """``ropes`` with the largest stepped down to their next smaller choice, one at a time
    (the last layer first among equals), until their units fit ``room`` or none can step."""
    fitted = list(ropes)
    options = [sorted(c) for c in choices] if choices is not None else \
        [list(range(2, r + 1, 2)) for r in ropes]
    while sum(h * r for h, r in zip(kv_heads, fitted)) > room:
        smaller = [i for i, r in enumerate(fitted) if any(c < r for c in options[i])]
        if not smaller:
            break
        i = max(smaller, key=lambda i: (fitted[i], i))
        fitted[i] = max(c for c in options[i] if c < fitted[i])
    return fitted


def repair(weights: Sequence[float], total: int, caps: Sequence[int]) -> list[int]:
    """``total`` units split in proportion to ``weights`` (largest remainders), each part in
    ``[1, cap]``; what a capped part cannot take goes to the others, so the parts sum to
    ``min(total, sum(caps))``. Integer ``weights`` that already sum to ``total`` come back
    unchanged."""
    parts = [1] * len(weights)
    while True:
        left = total - sum(parts)
        open_ = [i for i, p in enumerate(parts) if p < caps[i]]
        if left <= 0 or not open_:
            return parts
        mass = sum(max(0.0, weights[i] - parts[i]) for i in open_)
        share = {i: left * (max(0.0, weights[i] - parts[i]) / mass if mass > 0
                            else 1 / len(open_)) for i in open_}
        add = {i: min(caps[i] - parts[i], math.floor(share[i] + 1e-9)) for i in open_}
        rest = left - sum(add.values())
        for i in sorted(open_, key=lambda i: (share[i] - math.floor(share[i] + 1e-9), -i),
                        reverse=True):
            if rest > 0 and parts[i] + add[i] < caps[i]:
                add[i], rest = add[i] + 1, rest - 1
        if not any(add.values()):
            return parts
        for i, extra in add.items():
            parts[i] += extra


def resolve_student_path(name: str | Path) -> Path:
    """A path as given, else a student space shipped in ``search_spaces/students/``."""
    path = Path(name)
    if path.exists():
        return path
    for candidate in (STUDENT_SPACES_DIR / path.name, STUDENT_SPACES_DIR / f"{path.name}.yaml"):
        if candidate.exists():
            return candidate
    shipped = ", ".join(p.name for p in shipped_student_spaces())
    raise SpaceError(f"student space {str(name)!r}: no such file here or in "
                     f"search_spaces/students/ (shipped: {shipped})")


def shipped_student_spaces() -> list[Path]:
    return sorted(STUDENT_SPACES_DIR.glob("*.yaml"))


def is_student_space(name: str | Path) -> bool:
    """Whether ``name`` is a student space: a file with ``form:`` at its top, or one shipped in
    ``search_spaces/students/``."""
    try:
        path = resolve_student_path(name)
    except SpaceError:
        return False
    try:
        data = read_yaml(path)
    except (OSError, yaml.YAMLError):
        return path.parent == STUDENT_SPACES_DIR
    return isinstance(data, dict) and "form" in data


DEFAULTS: Mapping[str, Any] = {"description": "", "width_scales": [0.5, 0.75, 1.0, 1.5, 2.0],
                               "rope_scales": [0.5, 1.0, 1.5], "kv_shares": [1.0],
                               "seq_len": 512, "sample_tokens": 16384, "eval_tokens": 8192,
                               "eval_chunks": 4, "distil_steps": 0, "align": 8,
                               "sampler": "tpe", "trials": 20, "refit_after": 0}


def read_student_space(name: str | Path) -> StudentSpace:
    """Read and validate a student space file (a path, or one shipped in
    ``search_spaces/students/``).

    Raises:
        SpaceError: unreadable, or every field that breaks its rule, in one line.
    """
    path = resolve_student_path(name)
    try:
        data = read_yaml(path)
    except (OSError, yaml.YAMLError) as err:
        raise SpaceError(f"{path}: cannot read YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise SpaceError(f"{path}: must be a mapping with keys {', '.join(STUDENT_KEYS)}")
    return parse_student_space(data, str(path))


def parse_student_space(data: Mapping[str, Any], source: str = "<space>") -> StudentSpace:
    """Validate a student space given as a dict (every problem collected, then one line)."""
    problems: list[str] = []
    unknown = sorted(set(data) - set(STUDENT_KEYS))
    if unknown:
        problems.append(f"unknown key(s) {', '.join(map(repr, unknown))}: valid keys are "
                        f"{', '.join(STUDENT_KEYS)}")
    full = {**DEFAULTS, **data}
    for key in ("name", "form"):
        if not isinstance(full.get(key), str) or not full.get(key):
            problems.append(f"{key} {full.get(key)!r}: must be a non-empty string")
    for key, low, high in (("width_scales", 0.0, 16.0), ("rope_scales", 0.0, 16.0),
                           ("kv_shares", 0.0, 1.0)):
        _scales(problems, key, full[key], low, high)
    for key, low in (("seq_len", 2), ("sample_tokens", 1), ("eval_tokens", 1),
                     ("eval_chunks", 1), ("distil_steps", 0), ("align", 1), ("trials", 1),
                     ("refit_after", 0)):
        value = full[key]
        if not is_int(value) or int(value) < low:
            problems.append(f"{key} {value!r}: must be an integer >= {low}")
    if full["sampler"] not in STUDENT_SAMPLERS or full["sampler"] not in SAMPLER_KINDS:
        problems.append(f"sampler {full['sampler']!r}: must be one of "
                        f"{', '.join(STUDENT_SAMPLERS)}")
    raise_if_any(problems, source)
    def scales(key: str) -> tuple[float, ...]:
        return tuple(float(v) for v in full[key])

    return StudentSpace(name=str(full["name"]), description=str(full["description"]),
                        form=str(full["form"]), width_scales=scales("width_scales"),
                        rope_scales=scales("rope_scales"), kv_shares=scales("kv_shares"),
                        seq_len=int(full["seq_len"]), sample_tokens=int(full["sample_tokens"]),
                        eval_tokens=int(full["eval_tokens"]),
                        eval_chunks=int(full["eval_chunks"]),
                        distil_steps=int(full["distil_steps"]), align=int(full["align"]),
                        sampler=str(full["sampler"]), trials=int(full["trials"]),
                        refit_after=int(full["refit_after"]), data=dict(full))


def _scales(problems: list[str], key: str, value: Any, low: float, high: float) -> None:
    """A non-empty list of numbers in ``(low, high]``."""
    if not isinstance(value, list) or not value or not all(
            is_number(v) and low < float(v) <= high for v in value):
        problems.append(f"{key} {value!r}: must be a non-empty list of numbers in "
                        f"({low:g}, {high:g}]")
