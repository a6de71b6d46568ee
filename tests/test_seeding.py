"""The search's plan from a data profile (``workers.search.seeding``): the one conversion of a
profile's allocator inputs to settings that ``alloc.solve --profile`` uses too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alloc.solve import main as solve_main
from common.files import write_yaml
from search_spaces import parse_space
from workers.search.options import SearchOptions
from workers.search.request import prepare
from workers.tasks import make_task


def deeper_pilot_profile(folder: Path, seq_len: int) -> Path:
    """A profile from a pilot of four later layers (more than a depth-3 plan has), with its
    input spectrum in a file beside it."""
    (folder / "p.input.txt").write_text("".join(f"{0.9 ** i:.6g}\n" for i in range(32)))
    path = folder / "p.yaml"
    write_yaml(path, {"source": "pilot", "allocator": {
        "kernel": "exp:0.5", "input_dim": 32, "seq_len": seq_len, "spectrum": "power:1.5",
        "input_spectrum": "file:p.input.txt", "logit_bounds": [2.0, 6.0, 9.0, 12.0],
        "patterns": [2.0, 4.0, 3.0, 5.0], "sources": {"kernel": "pilot (200 steps)"}}})
    return path


def test_a_deeper_pilot_s_profile_plans_the_search_as_alloc_solve_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A profile with more later layers measured than the space has: the search keeps the first
    ones, as ``alloc.solve --profile`` does (it was refused, naming ``--logit-bounds``), and
    plans what ``alloc.solve`` plans at the same budget, depth and MLP."""
    task = make_task("ngram", "smoke", 0)
    profile = deeper_pilot_profile(tmp_path, task.seq_len)
    space = parse_space({"name": "deep", "budget": 64, "depth": 3,
                         "layers": [{"heads": [1, 2, 4, 8], "mlp_ratio": [0, 2]}]})
    request = prepare(space, task, storage=f"sqlite:///{tmp_path / 's.db'}", study="deep",
                      options=SearchOptions(profile=profile, storage_path=tmp_path / "r"))
    settings = request.plan.settings
    assert (settings.logit_bounds, settings.patterns) == ((2.0, 6.0), (2.0, 4.0))
    assert settings.input_spectrum == f"file:{tmp_path / 'p.input.txt'}"
    assert solve_main(["--budget", "64", "--layers", "3", "--mlp-ratio", "2", "--profile",
                       str(profile), "--format", "json"]) == 0
    solved = json.loads(capsys.readouterr().out)
    assert solved["inputs"]["logit_bounds"] == [2.0, 6.0]
    assert request.plan.plan.arch.arch_id == solved["arch_id"]
    assert request.plan.plan.arch.to_dict() == solved["arch"]


def test_a_profile_the_plan_refuses_is_named_by_field_in_the_search_and_by_flag_in_solve(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The settings' rules speak of fields (``input_spectrum``), so the search, which has no
    ``--input-spectrum``, names none; ``alloc.solve`` shows the same problem with its flag."""
    from alloc.errors import PlanError

    task = make_task("ngram", "smoke", 0)
    profile = deeper_pilot_profile(tmp_path, task.seq_len)
    (tmp_path / "p.input.txt").write_text("1\n" * 40)  # more dimensions than the data's 32
    space = parse_space({"name": "deep", "budget": 64, "depth": 3,
                         "layers": [{"heads": [1, 2, 4, 8], "mlp_ratio": [0, 2]}]})
    with pytest.raises(PlanError) as err:
        prepare(space, task, storage=f"sqlite:///{tmp_path / 's.db'}", study="deep",
                options=SearchOptions(profile=profile, storage_path=tmp_path / "r"))
    assert [p.field for p in err.value.broken] == ["input_spectrum"]
    assert "--" not in str(err.value) and "40 values; needs 1 to input_dim (32)" in str(err.value)
    assert solve_main(["--budget", "64", "--layers", "3", "--profile", str(profile)]) == 2
    assert "--input-spectrum 'file:" in capsys.readouterr().err
