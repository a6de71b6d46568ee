"""The student forms' table (``alloc.compression.FORMS``): every form has its torch-side row,
each row's floor is what its smallest student caches, a built model caches what the form's
layer spec says, and no module outside the two tables asks which form it holds by its name (so
that adding a form is one row in each table and the modules the row names)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from alloc.compression import (
    FORM_NAMES,
    FORMS,
    CompressionPlan,
    LayerPlan,
    form_of,
    kv_cache_floor,
    render_plan,
    student_form,
)
from alloc.errors import CompressionError
from arch import ArchConfig, HeadGroup, LayerSpec
from workers.compression.forms import SENSITIVITY
from workers.models import build_model

ROOT = Path(__file__).resolve().parents[1]
TABLES = {"alloc/compression/forms.py", "workers/compression/forms.py"}
PRODUCT = ("alloc", "arch", "common", "search_spaces", "studies", "userdata", "workers")


def rope_teacher() -> ArchConfig:
    """Two grouped-query RoPE layers and one MSSA layer (which no form changes)."""
    mhsa = LayerSpec("mhsa", (HeadGroup(4, 16, kv_heads=2),))
    return ArchConfig(d_model=32, max_seq_len=16, vocab_size=40, positional="rope",
                      layers=(mhsa, mhsa, LayerSpec("mssa", (HeadGroup(2, 16),))))


def test_every_form_has_its_torch_row_and_is_found_by_what_it_caches() -> None:
    assert tuple(SENSITIVITY) == FORM_NAMES == tuple(FORMS)
    for form in FORMS.values():
        assert student_form(form.name) is form
        assert form_of(form.latent, 2 if form.rope_part else 0) is form
        assert form.rules and all(SENSITIVITY[form.name] or e == "curvature"
                                  for e in form.estimates)
    with pytest.raises(CompressionError, match="form mla: must be one of compact, latent, "):
        student_form("mla")


@pytest.mark.parametrize("name", FORM_NAMES)
def test_a_forms_floor_is_what_its_smallest_built_student_caches(name: str) -> None:
    """``kv_cache_floor`` of each form equals the units per token that the model built from
    the form's smallest layers holds in its cache (one token decoded)."""
    form, teacher = FORMS[name], rope_teacher()
    rope = 4 if form.rope_part else 0
    layers = tuple(form.smallest(teacher, layer, 4, values=True, rope_dim=rope)
                   for layer in teacher.layers)
    student = ArchConfig.from_dict({**teacher.to_dict(),
                                    "layers": [x.to_dict() for x in layers]})
    model = build_model(student).eval()
    x = torch.randn(1, 5, teacher.d_model)
    with torch.no_grad():  # what each built layer caches per token, (B, T, units)
        held = sum(model.block(i).attn.cached(x).shape[-1] for i in range(len(layers)))
    floor = kv_cache_floor(teacher, 4, values=True, form=form, rope_dim=rope)
    assert floor * teacher.kv_width == pytest.approx(held) and held == student.kv_width
    assert held < teacher.kv_width
    assert student.layers[2] == teacher.layers[2]  # mssa: kept whole by every form
    if form.latent:
        assert {x.attention for x in student.layers[:2]} == {"latent"}
        assert all(x.rope_dim == rope and x.rotate_latent == (not rope)
                   for x in student.layers[:2])
    else:
        assert all(x.attention == "mhsa" for x in student.layers[:2])


def test_a_plan_says_its_form_and_shows_its_decision() -> None:
    teacher = rope_teacher()
    base = [LayerPlan(i, x.attention, x.heads_str, 1.0) for i, x in enumerate(teacher.layers)]
    for rope, name in ((0, "latent"), (4, "latent_rope")):
        layers = (LayerPlan(0, "mhsa", "4x16kv2", 1.0, latent_dim=8, latent_losses={8: 0.25},
                            rope_dim=rope), *base[1:])
        plan = CompressionPlan("x", 16, 0.1, 4, "loss", layers, teacher)
        assert plan.form is FORMS[name]
        shown = render_plan(plan)
        assert "latent" in shown and ("RoPE 4/head" in shown) == bool(rope)
    assert CompressionPlan("x", 16, 0.1, 4, "loss", tuple(base), teacher).form is \
        FORMS["compact"]


def names_asked(path: Path, root: Path = ROOT) -> list[str]:
    """Where ``path`` asks a form by its name: ``FORMS["x"]``, ``x.form == "x"`` (or ``in``),
    ``student_form("x")`` with a form's name as a literal."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        literals: list[ast.expr] = []
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
                and node.value.id in ("FORMS", "SENSITIVITY"):
            literals = [node.slice]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "student_form":
            literals = list(node.args)
        elif isinstance(node, ast.Compare) and "form" in ast.unparse(node.left):
            literals = list(node.comparators)
        found += [f"{path.relative_to(root)}:{node.lineno}" for x in literals
                  if isinstance(x, ast.Constant) and x.value in FORM_NAMES]
    return found


def test_no_module_outside_the_tables_asks_a_form_by_name() -> None:
    """Adding a form touches ``FormName``, the two tables and the modules its rows name: the
    rest of the product asks the form's traits (``form.latent``, ``form.rope_part``,
    ``form.rules``), never its name."""
    found = [hit for package in PRODUCT for path in sorted((ROOT / package).rglob("*.py"))
             if str(path.relative_to(ROOT)) not in TABLES for hit in names_asked(path)]
    assert not found, found


def test_the_name_check_sees_each_way_of_asking(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text('a = FORMS["latent"]\nif plan.form.name == "compact":\n    pass\n'
                      'b = student_form("latent_rope")\nc = FORMS[name]\n')
    assert names_asked(source, tmp_path) == ["m.py:1", "m.py:2", "m.py:4"]
