"""The student forms' table: what a compressed student's planned layers become, one
``StudentForm`` per form in ``FORMS`` (like ``arch.KINDS`` for attention kinds): its candidate
widths, its smallest layer (the KV cache floor), the layer spec a plan builds, the rules that
can plan it, and how a plan's table shows its decision.

- ``compact``: every head group keeps its kind and caches keys (and, with the loss rule,
  values) cut to a smaller ``qk_dim`` / ``v_dim`` (docs/theory.md §10.1-10.4);
- ``latent``: every mhsa layer caches one latent per token from which its keys and values are
  rebuilt, the keys turned by RoPE after they are rebuilt where the teacher's are (§10.5);
- ``latent_rope``: the same latent beside a decoupled RoPE part of ``rope_dim`` dims per
  key/value head, the rest of the keys unturned: multi-head latent attention's layout, which
  decodes from the cached latents as they are (absorbed).

Every question about a form is asked of this table (``student_form(name)``, or
``CompressionPlan.form``), never of a flag; how a form is measured is the torch side's registry
(``workers.compression.forms``). Adding a form is its name in ``FormName``, its row here, its
row there and the modules its row names (tests/test_forms checks that no other file names it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

from alloc.errors import CompressionError
from arch import ArchConfig, HeadGroup, LayerSpec
from common.errors import Problem

FormName = Literal["compact", "latent", "latent_rope"]
# How a plan chooses its widths: the saturation rule's bound, the attention error measured on a
# sample, or the sample's loss increase (docs/theory.md §10).
Rule = Literal["bound", "measured", "loss"]
RULES: tuple[Rule, ...] = get_args(Rule)


class PlannedLayer(Protocol):
    """A planned layer's latent decision (``alloc.compression.LayerPlan`` has it)."""

    @property
    def latent_dim(self) -> int: ...

    @property
    def rope_dim(self) -> int: ...

    @property
    def teacher_kv_units(self) -> int: ...

    @property
    def latent_loss(self) -> float | None: ...


def candidate_dims(qk_dim: int, align: int) -> list[int]:
    """The ``qk_dim`` a head group of ``qk_dim`` may be reduced to: multiples of ``align``
    below it, and itself."""
    return sorted({*range(align, qk_dim, align), qk_dim})


@dataclass(frozen=True)
class StudentForm:
    """What a student form has.

    Attributes:
        name: the form's registry name.
        summary: what its planned layers cache, with the section of docs/theory.md.
        latent: its planned layers cache one latent per token (mhsa layers only), chosen by
            width; otherwise each head group's ``qk_dim`` (and ``v_dim``) is cut.
        rope_part: a decoupled RoPE part of ``rope_dim`` per key/value head sits beside the
            latent (``rope_dim > 0``); without it a latent form keeps ``rope_dim = 0``.
        rules: the planning rules that can choose its widths (the first is the default).
        estimates: how a latent form's loss increases may be found: ``curvature`` (to second
            order from one forward and backward pass, docs/theory.md §10.6) and ``forwards``
            (one forward per layer and width, §10.5); a compact form's loss rule always runs
            forwards (none to choose).
    """

    name: FormName
    summary: str
    latent: bool
    rope_part: bool
    rules: tuple[Rule, ...]
    estimates: tuple[str, ...] = ()

    def widths(self, layer: LayerSpec, d_model: int, align: int, rope_dim: int = 0) -> list[int]:
        """A latent form's candidate widths for mhsa ``layer`` (docs/theory.md §10.5):
        multiples of ``align`` below its full rank, ``min(d_model, rows)`` (the rank of its
        stacked key and value maps: every key row but the ``rope_dim`` of each key/value head's
        decoupled RoPE part, and every value row), and the full rank, at which the latent layer
        is exact."""
        rows = sum(g.kv_heads * (g.qk_dim - rope_dim + g.v_dim) for g in layer.heads)
        return candidate_dims(min(d_model, rows), align)

    def layer_spec(self, layer: LayerSpec, width: int, positional: str,
                   rope_dim: int = 0) -> LayerSpec:
        """mhsa ``layer`` made a latent layer of ``width`` units, as a plan of this form makes
        it: with ``rope_dim = 0`` every key from the latent, turned by RoPE after it is rebuilt
        where the teacher's keys are turned (``positional``); with ``rope_dim > 0`` that many
        dims of each key/value head as a decoupled RoPE part and the rest from the latent,
        unturned."""
        return dataclasses.replace(layer, attention="latent", latent_dim=width,
                                   rope_dim=rope_dim,
                                   rotate_latent=positional == "rope" and not rope_dim)

    def smallest(self, teacher: ArchConfig, layer: LayerSpec, align: int, values: bool,
                 rope_dim: int = 0) -> LayerSpec:
        """``teacher``'s ``layer`` as the smallest plan of this form at ``align`` makes it: a
        latent form's mhsa layers at their narrowest width (the others whole); a compact
        form's query-key groups at their smallest ``qk_dim``, and their values at theirs when
        ``values`` are planned (the loss rule's mhsa layers)."""
        kind = layer.kind
        if self.latent:
            if not kind.to_latent:
                return layer
            width = self.widths(layer, teacher.d_model, align, rope_dim)[0]
            return self.layer_spec(layer, width, teacher.positional, rope_dim)
        if not kind.cut_keys:
            return layer
        heads = tuple(HeadGroup(g.count, candidate_dims(g.qk_dim, align)[0],
                                candidate_dims(g.v_dim, align)[0] if values and kind.cut_values
                                else g.v_dim, g.kv_heads) for g in layer.heads)
        return dataclasses.replace(layer, heads=heads)

    def kept(self, values: bool) -> str:
        """What this form's smallest plan keeps (``values``: the values are planned too), for
        the refusal of a budget below it."""
        if self.latent:
            return "the smallest latent widths"
        return "the smallest candidate keys and values" if values else \
            "the values and the smallest candidate keys"

    def describe(self, layer: PlannedLayer) -> str | None:
        """A planned layer's decision as the plan's table shows it (None: the head groups'
        decisions, a compact form's)."""
        if not self.latent or not layer.latent_dim:
            return None
        rope = f" + RoPE {layer.rope_dim}/head" if layer.rope_dim else ""
        return f"latent {layer.teacher_kv_units}->{layer.latent_dim}{rope} " \
               f"(loss {layer.latent_loss:+.3g})"


FORMS: Mapping[FormName, StudentForm] = {form.name: form for form in (
    StudentForm("compact", "each head group's keys (and values) cut to a smaller qk_dim "
                "(v_dim), its kind kept (docs/theory.md §10.1-10.4)", latent=False,
                rope_part=False, rules=("measured", "bound", "loss")),
    StudentForm("latent", "one latent per token per mhsa layer, keys and values rebuilt from "
                "it and the keys turned by RoPE after (docs/theory.md §10.5)", latent=True,
                rope_part=False, rules=("loss",), estimates=("curvature", "forwards")),
    StudentForm("latent_rope", "one latent per token per mhsa layer beside a decoupled RoPE "
                "part per key/value head; decodes absorbed (docs/theory.md §10.5)",
                latent=True, rope_part=True, rules=("loss",), estimates=("curvature",)),
)}
FORM_NAMES: tuple[FormName, ...] = tuple(FORMS)
DEFAULT_FORM = FORMS["compact"]  # what a plan makes unless a latent student is asked for


def student_form(name: str) -> StudentForm:
    """The form called ``name``.

    Raises:
        CompressionError: an unknown name (the choices listed).
    """
    if name not in FORMS:
        raise CompressionError.of([Problem("form", name, "must be one of "
                                           + ", ".join(FORM_NAMES))])
    return FORMS[name]  # type: ignore[index]


def form_of(latent: bool, rope_dim: int) -> StudentForm:
    """The form whose planned layers are ``latent`` (or not) with a RoPE part of
    ``rope_dim``."""
    return next(f for f in FORMS.values()
                if f.latent == latent and f.rope_part == (latent and rope_dim > 0))
