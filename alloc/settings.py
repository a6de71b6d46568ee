"""Every input of the allocator (``PlanSettings``), validated on construction like
``ArchConfig``: every rule that ties the inputs together is checked here, and only here; a
broken one raises ``PlanError`` whose problems name the fields (``align 24: must divide budget
512``); ``alloc.solve`` shows them as its flags (``--align 24: must divide --budget 512``).
What a profile measures of them (``AllocatorInputs``) becomes settings in one place,
``AllocatorInputs.settings``, for ``alloc.solve --profile`` and the search alike."""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from alloc.errors import PlanError
from alloc.extract import ErrorModel, max_head_dim
from alloc.saturation import parse_spectrum
from arch import (
    POSITIONALS,
    AttentionKind,
    KernelError,
    Positional,
    kind_traits,
    kinds_text,
    kinds_where,
    parse_kernel,
)
from arch.checks import bool_rule, choice_rule, int_rule, is_int, is_number, number_rule
from common.errors import Problem, TransformerAllocError, excerpt

MLP_PRODUCT_ORDER = 2  # an MLP after the attention multiplies pairs of extracted tokens (§2.1)

# The kinds the allocator plans: a latent layer's latent width is not a head split but a
# compression's choice (workers.compression.latent_students).
PLANNED_KINDS: tuple[AttentionKind, ...] = kinds_where(lambda t: t.planned)
# The planned kinds whose query heads may share key/value heads, for messages.
GROUPED_KV_PLANNED = kinds_text(lambda t: t.grouped_kv, PLANNED_KINDS)


@dataclass(frozen=True)
class PlanSettings:
    """Every allocator input; the defaults make the bare ``--budget 512`` meaningful.

    Validated on construction, like ``ArchConfig``: every rule that ties the inputs together
    is checked here (and only here), and a broken one raises ``PlanError`` whose problems
    (``PlanError.broken``) name the fields (``align 24: must divide budget 512``); a command
    shows them with its flags (``--align 24: must divide --budget 512``).
    """

    budget: int = 512
    layers: int = 6
    extract_layers: int = 1
    seq_len: int = 256
    input_dim: int = 64
    kernel: str = "poly:1.0"
    align: int = 8
    c_proj: float = 1.0
    c_head: float = 1.0
    order: float = 2.0
    # m of the extraction term's (d / d_in)^-m (docs/theory.md §2.3); 0: the paper's bound.
    width_order: float = 0.0
    alpha: float = 0.01
    norm_bound: float | None = None
    tolerance: float = 0.05
    logit_bound: float = 1.0
    # Measured logit bound R of each later layer (e.g. from a checkpoint profile); None: the
    # one logit_bound for all of them.
    logit_bounds: tuple[float, ...] | None = None
    spectrum: str = "power:1"
    attention: AttentionKind = "mhsa"
    mlp_ratio: float = 4.0
    uniform: bool = False
    vocab_size: int | None = None
    positional: Positional = "learned"
    # k of the compression term (docs/theory.md §2.1): None = from mlp_ratio, 2 when the plan
    # has an MLP (it forms products of the extracted tokens), 1 for attention only.
    product_order: int | None = None
    # "file:PATH": the tokens' covariance eigenvalues as the first layer sees them (a pilot
    # profile's, docs/theory.md §9.2); None: isotropic tokens of input_dim dimensions.
    input_spectrum: str | None = None
    # Key/value heads of every layer (grouped-query attention); None: one per query head.
    kv_heads: int | None = None
    # The longest block of consecutive offsets one head group may average (docs/theory.md
    # §2.2); 1: the bound's one-offset groups only.
    max_block: int = 8
    # Distinct attention patterns measured in each later layer (a pilot's, §4.1): that layer
    # gets the nearest allowed head count; None (or a layer past the list): layer 0's heads.
    patterns: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("logit_bounds", "patterns"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        problems = settings_problems(self)
        if problems:
            raise PlanError.of(problems)

    @classmethod
    def from_dict(cls, data: Any) -> PlanSettings:
        """Settings from a dict (a study's recorded ``alloc_inputs``); unknown keys are refused
        with the list of valid ones."""
        valid = tuple(f.name for f in fields(cls))
        if not isinstance(data, dict):
            raise PlanError(f"allocator inputs: expected a mapping, got {type(data).__name__}")
        unknown = sorted(set(map(str, data)) - set(valid))
        if unknown:
            raise PlanError(f"allocator inputs: unknown key {unknown[0]!r}; valid keys: "
                            f"{', '.join(valid)}")
        return cls(**data)

    @property
    def compression_order(self) -> int:
        """The compression term's order k (docs/theory.md §2.1): ``product_order`` if given,
        else the target's as the plan's MLP states it: 2 with an MLP (it forms products of the
        extracted tokens), 1 for attention only. One order for every candidate the bound
        prices: a candidate layer without an MLP does not make the task linear."""
        if self.product_order is not None:
            return self.product_order
        return MLP_PRODUCT_ORDER if self.mlp_ratio > 0 else 1

    @property
    def model(self) -> ErrorModel:
        """The early-layer bound's error model (its order: ``compression_order``)."""
        variance = None if self.input_spectrum is None else input_variance(self.input_spectrum)
        return ErrorModel(self.input_dim, self.c_proj, self.c_head, self.order, self.alpha,
                          self.norm_bound, self.compression_order, variance, self.width_order)


@dataclass(frozen=True)
class AllocatorInputs:
    """What a profile measures for the allocator (a profile file's ``allocator`` section,
    ``alloc.profiling.files.read_allocator_inputs``), or what a task declares of it: the inputs
    that are the data's, not the plan's shape. ``settings`` is their one way into
    ``PlanSettings``."""

    kernel: str  # ngram:K, exp:LAMBDA, poly:P or file:PATH
    input_dim: int
    seq_len: int
    spectrum: str  # power:BETA or file:PATH
    input_spectrum: str | None = None  # file:PATH, a pilot's first-layer input variances
    # Per later layer, as many as the pilot that measured them had (possibly more than a plan).
    logit_bounds: tuple[float, ...] | None = None
    patterns: tuple[float, ...] | None = None

    def settings(self, **given: Any) -> PlanSettings:
        """The plan's settings: these inputs, under the ``given`` ``PlanSettings`` fields (the
        plan's shape, and any input given explicitly, which wins; an explicit ``input_dim``
        also replaces the measured input spectrum). The per-later-layer measurements are cut
        to the plan's later layers (``layers - extract_layers``): a deeper pilot measured more
        layers than the plan has, and theirs go unused.

        Raises:
            PlanError: a rule of ``PlanSettings`` broken.
        """
        layers = given.get("layers", PlanSettings.layers)
        extract = given.get("extract_layers", PlanSettings.extract_layers)
        later = max(0, layers - extract) if is_int(layers) and is_int(extract) else 0
        measured = {**asdict(self), "logit_bounds": _first(self.logit_bounds, later),
                    "patterns": _first(self.patterns, later)}
        if "input_dim" in given:
            del measured["input_spectrum"]
        return PlanSettings(**{**measured, **given})


def _first(values: tuple[float, ...] | None, count: int) -> tuple[float, ...] | None:
    """The first ``count`` of ``values`` (None when none are left)."""
    return None if values is None else values[:count] or None


# (offset, heads, dim) choices of the exact solver above which it would take seconds and
# gigabytes: refused up front.
MAX_TABLE = 50_000_000
MAX_ERROR_TERM = 1e100
MAX_BLOCK = 64  # the bound's largest term; products of a few stay finite in float64


def align_problem(align: int, budget: int, input_dim: int) -> Problem | None:
    """Why head dims in multiples of ``align`` cannot fill ``budget`` for tokens of
    ``input_dim`` dimensions (None: they can)."""
    if align > min(input_dim, budget):
        return Problem("align", align, f"must be <= {{input_dim}} ({input_dim}) and <= {{budget}} "
                       f"({budget}) so that an aligned head dimension exists")
    if budget % align:
        return Problem("align", align, f"must divide {{budget}} {budget} (head dims are multiples "
                       "of {align} and a uniform layer must fill the budget)")
    return None


def fitting_align(budget: int, input_dim: int, choices: tuple[int, ...] = (8, 4, 2, 1)) -> int:
    """The largest of ``choices`` that ``align_problem`` accepts (1 always is)."""
    return next(a for a in choices if align_problem(a, budget, input_dim) is None)


def settings_problems(s: PlanSettings) -> list[Problem]:
    """Every broken rule of ``s``, each naming its field (``extract_layers``): its values' types
    and ranges first, then the rules that tie them together (the bound's size and the exact
    solver's table only once those hold)."""
    problems = _value_problems(s)
    if problems:
        return problems
    problems += [p for p in (align_problem(s.align, s.budget, s.input_dim),) if p]
    if s.extract_layers > s.layers:
        problems.append(Problem("extract_layers", s.extract_layers,
                                f"must be <= {{layers}} {s.layers}"))
    later = s.layers - s.extract_layers
    for name, values in (("logit_bounds", s.logit_bounds), ("patterns", s.patterns)):
        if values is not None and len(values) > later:
            problems.append(Problem(name, values, f"{len(values)} values for {later} later "
                                    f"layer(s) ({{layers}} {s.layers} - {{extract_layers}} "
                                    f"{s.extract_layers})", shown=""))
    hidden = s.mlp_ratio * s.budget
    if abs(hidden - round(hidden)) > 1e-9:
        problems.append(Problem("mlp_ratio", f"{s.mlp_ratio:g}", f"mlp-ratio * budget = "
                                f"{hidden:g} must be a whole number of units"))
    kind = kind_traits(s.attention)
    if s.kv_heads is not None and not kind.grouped_kv:
        problems.append(Problem("kv_heads", s.kv_heads, "grouped key/value heads are for "
                                f"{GROUPED_KV_PLANNED} layers, not {{attention}} {s.attention}"))
    if s.positional == "rope" and not kind.queries_keys:
        problems.append(Problem("positional", s.positional, "not offered for {attention} "
                                f"{s.attention} (no queries or keys); use learned or sinusoidal"))
    problems += _named_input_problems(s)
    return problems or _size_problems(s)


def _broken(name: str, value: Any, rule: str | None) -> list[Problem]:
    """The kit's ``rule`` broken by field ``name`` as a problem (``name = value: rule``)."""
    return [] if rule is None else [Problem(name, value, rule, shown=f"= {excerpt(value)}")]


def _value_problems(s: PlanSettings) -> list[Problem]:
    problems: list[Problem] = []
    for name in ("budget", "layers", "seq_len", "input_dim", "align"):
        problems += _broken(name, getattr(s, name), int_rule(getattr(s, name), 1))
    problems += _broken("extract_layers", s.extract_layers, int_rule(s.extract_layers, 0))
    problems += _broken("max_block", s.max_block, int_rule(s.max_block, 1, MAX_BLOCK))
    for name in ("c_proj", "c_head", "alpha", "mlp_ratio", "width_order"):
        problems += _broken(name, getattr(s, name), number_rule(getattr(s, name), 0.0))
    problems += _broken("order", s.order, number_rule(s.order, 1.0))
    for name in ("tolerance", "logit_bound"):
        problems += _broken(name, getattr(s, name),
                            number_rule(getattr(s, name), 0.0, strict=True))
    if s.norm_bound is not None:
        problems += _broken("norm_bound", s.norm_bound,
                            number_rule(s.norm_bound, 0.0, strict=True))
    for name in ("product_order", "kv_heads", "vocab_size"):
        if getattr(s, name) is not None:
            problems += _broken(name, getattr(s, name), int_rule(getattr(s, name), 1))
    if s.logit_bounds is not None and not all(is_number(b) and b > 0 for b in s.logit_bounds):
        problems.append(Problem("logit_bounds", s.logit_bounds,
                                "every value must be a number > 0", shown=repr(s.logit_bounds)))
    if s.patterns is not None and not all(is_number(p) and 1 <= p <= s.budget
                                          for p in s.patterns):
        problems.append(Problem("patterns", s.patterns, f"every value must be a number in [1, "
                                f"{{budget}} {s.budget}] (distinct patterns of a later layer)",
                                shown=repr(s.patterns)))
    problems += _broken("attention", s.attention, choice_rule(s.attention, PLANNED_KINDS))
    problems += _broken("positional", s.positional, choice_rule(s.positional, POSITIONALS))
    problems += _broken("uniform", s.uniform, bool_rule(s.uniform))
    return problems


def _named_input_problems(s: PlanSettings) -> list[Problem]:
    """The kernel, the spectrum and the measured input spectrum (a file) as given."""
    problems: list[Problem] = []
    for name, check in (("kernel", lambda: parse_kernel(s.kernel, s.seq_len)),
                        ("spectrum", lambda: parse_spectrum(s.spectrum))):
        try:
            check()
        except KernelError as err:
            problems.append(Problem(name, getattr(s, name), str(err), shown=""))
    if s.input_spectrum is not None:
        try:
            values = input_variance(s.input_spectrum)
        except TransformerAllocError as err:  # KernelError, or the file's own read error
            return [*problems, Problem("input_spectrum", s.input_spectrum, str(err), shown="")]
        if len(values) > s.input_dim or not any(values):
            problems.append(Problem("input_spectrum", s.input_spectrum, f"{len(values)} values; "
                                    f"needs 1 to {{input_dim}} ({s.input_dim}) values, not all "
                                    "zero", shown=repr(s.input_spectrum)))
    return problems


def _size_problems(s: PlanSettings) -> list[Problem]:
    """The bound's terms stay finite, and the exact solver's table stays small."""
    model = s.model
    with np.errstate(over="ignore"):  # an overflow is what is being checked
        largest = max(float(model.head_constant(s.seq_len) * model.width_factor(s.align)),
                      float(model.compression(0)))
    if not largest <= MAX_ERROR_TERM:  # also catches an overflow to inf
        return [Problem("c_proj", f"{s.c_proj:g}", f"with {{c_head}} {s.c_head:g}, {{order}} "
                        f"{s.order:g}, {{width_order}} {s.width_order:g} and {{alpha}} "
                        f"{s.alpha:g} at {{seq_len}} {s.seq_len}, the bound's terms reach "
                        f"{largest:.3g} (c_head * B * exp(alpha (n + 1) N) * (align / d_in)^-m, "
                        f"c_proj * sqrt(d_in)); they must stay <= {MAX_ERROR_TERM:g} for the "
                        "solvers to stay finite (docs/theory.md §2)")]
    top = max_head_dim(s.input_dim, s.budget, s.width_order)
    pairs = sum(s.budget // d for d in range(s.align, top + 1, s.align))
    choices = s.seq_len * pairs * min(s.max_block, s.seq_len)
    if choices > MAX_TABLE:
        return [Problem("seq_len", s.seq_len, f"with {{budget}} {s.budget}, {{align}} {s.align} "
                        f"and {{max_block}} {s.max_block} the instance has {choices:,} (block, "
                        f"heads, dim) choices, over {MAX_TABLE:,}; lower {{seq_len}} or "
                        "{max_block}, or raise {align}")]
    return []


@functools.cache
def input_variance(spec: str) -> tuple[float, ...]:
    """The values of an ``--input-spectrum file:PATH`` (read once per process; ``KernelError``
    if it is not a file of non-negative numbers)."""
    kind, values = parse_spectrum(spec)
    if kind != "file":
        raise KernelError(f"input spectrum {spec!r}: must be file:PATH (one variance per line)")
    assert isinstance(values, np.ndarray)
    return tuple(float(v) for v in values)
