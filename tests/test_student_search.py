"""The search over a pretrained checkpoint's students (``workers.search --teacher``,
``workers/search/students.py``): the space's repair under the KV budget, bad input refused in
one line before any work, and a smoke study on a tiny Llama teacher (SQLite, and PostgreSQL
when ``$TEST_POSTGRES_URL`` is set) whose teacher is measured once and reused after
``--resume``, whose fixed allocations are trials of the study, and whose exported plan builds
the student the trial measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch

from search_spaces import (
    Allocation,
    SpaceError,
    TeacherShape,
    fit_allocation,
    parse_student_space,
    read_student_space,
    repair,
    shipped_student_spaces,
)
from tests.helpers.llama import SEQ, VOCAB, build, ids, saved, token_folder

transformers = pytest.importorskip("transformers")

SPACE = {"name": "tiny_students", "form": "latent_rope", "seq_len": 16, "sample_tokens": 128,
         "eval_tokens": 128, "eval_chunks": 2, "align": 4, "sampler": "prior",
         "kv_shares": [0.75, 1.0], "refit_after": 3}


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny GQA Llama folder, its token data, and a student space at its size."""
    root = tmp_path_factory.mktemp("student")
    space = root / "space.yaml"
    space.write_text(json.dumps(SPACE))
    return {"teacher": saved(build("llama", num_key_value_heads=2), root / "teacher"),
            "tokens": token_folder(root / "tokens"), "space": space}


def command(paths: dict[str, Path], url: str, study: str, tmp: Path, *extra: str) -> list[str]:
    return ["--space", str(paths["space"]), "--teacher", str(paths["teacher"]), "--data",
            str(paths["tokens"]), "--eval", str(paths["tokens"]), "--kv-cache", "0.25",
            "--storage", url, "--study", study, "--storage-path", str(tmp / "results"),
            "--max-concurrent", "1", "--quiet", "--format", "json", *extra]


# --- the space ------------------------------------------------------------------------------------

def test_every_shipped_student_space_loads() -> None:
    assert shipped_student_spaces()
    for path in shipped_student_spaces():
        space = read_student_space(path.name)
        assert space.form in ("latent", "latent_rope") and space.trials > 0 and space.hash


def test_a_bad_student_space_names_every_field_in_one_line() -> None:
    with pytest.raises(SpaceError) as err:
        parse_student_space({"name": "x", "form": "latent_rope", "kv_shares": [1.5],
                             "sampler": "grid", "colour": 1, "eval_chunks": 0})
    text = str(err.value)
    assert "\n" not in text
    for part in ("'colour'", "kv_shares [1.5]", "sampler 'grid'", "eval_chunks 0"):
        assert part in text


@pytest.mark.parametrize("total", [7, 30, 64, 200])
def test_repair_spends_the_total_in_proportion_within_the_caps(total: int) -> None:
    weights, caps = [1.0, 2.0, 5.0, 0.0], [40, 40, 20, 40]
    parts = repair(weights, total, caps)
    assert sum(parts) == min(total, sum(caps))
    assert all(1 <= p <= c for p, c in zip(parts, caps))
    assert repair([3, 5, 9], 17, [20, 20, 20]) == [3, 5, 9]  # already the total: unchanged


def test_an_allocation_spends_exactly_what_its_kv_cache_allows() -> None:
    shape = TeacherShape((2, 2, 2), (16, 16, 16), (16, 16, 16), 64, 192)
    for kv in (0.125, 0.25, 0.5):
        made = fit_allocation(kv, [3.0, 1.0, 1.0], [8, 8, 8], shape)
        assert made.units(shape.kv_heads) == shape.allowed(kv)
        assert all(c >= 1 for c in made.latent_dims) and all(r % 2 == 0 for r in made.rope_dims)
    # RoPE parts the budget cannot hold step down through their choices, never off them
    tight = fit_allocation(0.125, [1.0, 1.0, 1.0], [8, 8, 8], shape, [[2, 4, 8]] * 3)
    assert set(tight.rope_dims) <= {2, 4, 8} and tight.units(shape.kv_heads) == 24
    with pytest.raises(SpaceError):
        fit_allocation(0.05, [1.0] * 3, [8, 8, 8], shape, [[4, 8]] * 3)
    roundtrip = Allocation.from_dict(json.loads(json.dumps(made.to_dict())))
    assert roundtrip == made and roundtrip.key() == made.key()


# --- the command --------------------------------------------------------------------------------

@pytest.mark.parametrize(("change", "says"), [
    ({"--kv-cache": "0.001"}, "--kv-cache 0.001: must be in ["),
    ({"--teacher": "/nonexistent/model"}, "--teacher"),
    ({"--eval": "/nonexistent/tokens"}, "--eval"),
    ({"--sampler": "grid"}, "--sampler grid"),
])
def test_bad_input_exits_2_in_one_line_before_any_work(
        teacher: dict[str, Path], tmp_path: Path, change: dict[str, str], says: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    from workers.search.cli import main as search_main

    argv = command(teacher, f"sqlite:///{tmp_path / 's.db'}", "bad", tmp_path)
    for flag, value in change.items():
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    assert search_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "s.db").exists() and not (tmp_path / "results").exists()


@pytest.mark.parametrize(("fields", "says"), [
    ({"width_scales": [], "form": "compact"}, "width_scales []"),
    ({"form": "compact"}, "the compact form is not searched"),
])
def test_a_bad_space_field_exits_2(teacher: dict[str, Path], tmp_path: Path,
                                   fields: dict[str, Any], says: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from workers.search.cli import main as search_main

    space = tmp_path / "bad.yaml"
    space.write_text(json.dumps({**SPACE, **fields}))
    argv = command(teacher, f"sqlite:///{tmp_path / 's.db'}", "bad", tmp_path)
    argv[argv.index("--space") + 1] = str(space)
    assert search_main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "s.db").exists()


@pytest.mark.usefixtures("shared_ray", "remote_code_cache")
def test_a_student_study_measures_once_resumes_and_exports_what_it_measured(
        teacher: dict[str, Path], storage_url: str, study_name: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from studies.cli import main as studies_main
    from workers.search import student_cache
    from workers.search.cli import main as search_main

    before = sum(student_cache.COMPUTED.values())
    argv = command(teacher, storage_url, study_name, tmp_path)
    assert search_main([*argv, "--trials", "3"]) == 0, capsys.readouterr().err[-3000:]
    summary = json.loads(capsys.readouterr().out)
    assert summary["best"] is not None and sum(student_cache.COMPUTED.values()) == before + 1
    study = optuna.load_study(study_name=study_name, storage=storage_url)
    assert len(study.directions) == 2  # held-out loss and KV cache bytes per token
    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    labels = {t.user_attrs.get("seed") for t in study.trials}
    assert {"plan", "uniform", "palu"} <= labels  # the fixed allocations, in the database
    plan = next(t for t in study.trials if t.user_attrs.get("seed") == "plan")
    assert plan.params and plan.params["kv_cache"] == 0.25  # the plan's point: samplers see it
    for t in done:
        chosen = Allocation.from_dict(json.loads(t.user_attrs["allocation"]))
        assert chosen.kv_cache <= 0.25 and len(json.loads(t.user_attrs["window_losses"])) > 1
        assert t.values[1] == t.user_attrs["kv_cache"]
    # --resume: the teacher's measurements are found, not made again
    assert search_main([*argv, "--trials", "5", "--resume"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert sum(student_cache.COMPUTED.values()) == before + 1
    resumed = optuna.load_study(study_name=study_name, storage=storage_url)
    assert len(resumed.get_trials(states=(optuna.trial.TrialState.COMPLETE,
                                          optuna.trial.TrialState.PRUNED))) >= 5
    # the refit is asked for at every trial past the third; a random tiny teacher's students
    # may fit no depth scales (the no-Ray tests below check the fit and the enqueued plan)
    assert [t.user_attrs.get("seed") for t in resumed.trials].count("refit") <= 1
    # the front, the best under a budget, and the best's plan built by workers.compress
    assert studies_main(["pareto", "--storage", storage_url, "--study", study_name, "--x",
                         "kv_cache", "--format", "json"]) == 0
    front = json.loads(capsys.readouterr().out)
    assert front and all(t["kv_cache"] is not None for t in front)
    assert studies_main(["best", "--storage", storage_url, "--study", study_name,
                         "--kv-cache", "0.25", "--format", "json"]) == 0
    best = json.loads(capsys.readouterr().out)[0]
    # every trial against the allocator's plan, paired by held-out window
    assert studies_main(["windows", "--storage", storage_url, "--study", study_name,
                         "--format", "json"]) == 0
    paired = json.loads(capsys.readouterr().out)
    reference = next(t for t in paired["trials"] if t["number"] == paired["against"])
    assert reference["label"] == "plan" and reference["difference"] == 0.0
    assert {t["number"] for t in paired["trials"]} >= {best["number"]}
    assert_exported_plan_builds_the_trial(teacher, storage_url, study_name, best["number"],
                                          tmp_path, capsys)
    assert_confirmed_on_windows_the_search_never_saw(teacher, storage_url, study_name,
                                                     best["number"], capsys)


def assert_confirmed_on_windows_the_search_never_saw(paths: dict[str, Path], url: str,
                                                     study: str, number: int,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``workers.confirm`` on the study's own held-out source reads the windows after the ones
    the search scored; each student's loss there is that of its trial's plan rebuilt; the
    fixed allocations, the best sampled student and the teacher are scored, paired against the
    plan."""
    from studies.cli import main as studies_main
    from userdata import DataSpec
    from workers.confirm import main as confirm_main
    from workers.search.protocol import StudentJob, StudentSpec
    from workers.search.student_cache import eval_windows, window_losses
    from workers.search.student_trial import build as build_trial

    capsys.readouterr()
    assert confirm_main(["--storage", url, "--study", study, "--eval", str(paths["tokens"]),
                         "--top", "1", "--eval-tokens", "64", "--quiet", "--format",
                         "json"]) == 0, capsys.readouterr().err
    found = json.loads(capsys.readouterr().out)
    seq_len = found["seq_len"]
    assert found["skipped_tokens"] == 128 // seq_len * seq_len and found["windows"] == 4
    rows = {t["label"]: t for t in found["trials"]}
    assert studies_main(["windows", "--storage", url, "--study", study, "--format",
                         "json"]) == 0
    fixed = {t["label"] for t in json.loads(capsys.readouterr().out)["trials"] if t["label"]}
    assert "plan" in fixed and set(rows) - {"teacher", "sampled"} == fixed
    assert rows["plan"]["vs_plan"]["difference"] == 0.0
    assert found["best_fixed"] in ("plan", "uniform", "palu")
    trial = optuna.load_study(study_name=study, storage=url).trials[number]
    spec = StudentSpec(Allocation.from_dict(json.loads(trial.user_attrs["allocation"])),
                       trial.user_attrs["plan_folder"])
    job = StudentJob(str(Path(paths["teacher"]).resolve()),
                     trial.user_attrs["plan_folder"].rsplit("/students/", 1)[0])
    student, _ = build_trial(job, spec)
    new = eval_windows(DataSpec(str(paths["tokens"])), seq_len, 64, skip=128)
    searched = eval_windows(DataSpec(str(paths["tokens"])), seq_len, 128)
    assert not any(torch.equal(w, v) for w in new for v in searched)
    row = next(t for t in found["trials"] if t["number"] == number)
    assert row["loss"] == pytest.approx(float(window_losses(student, new).mean()), rel=1e-6)
    assert_the_published_methods_are_scored_on_the_same_windows(paths, url, study, found,
                                                                capsys)


def assert_the_published_methods_are_scored_on_the_same_windows(
        paths: dict[str, Path], url: str, study: str, confirmed: dict[str, Any],
        capsys: pytest.CaptureFixture[str]) -> None:
    """``experiments.student_front``: the confirmed students at the losses ``workers.confirm``
    measured, and the published methods beside them at the study's budget, each paired against
    the search's pick."""
    from experiments.student_front import main as front_main

    out = Path(confirmed["teacher"]).parent / "front"
    assert front_main(["--storage", url, "--study", study, "--eval", str(paths["tokens"]),
                       "--eval-tokens", "64", "--top", "1", "--methods", "svd", "mha2mla",
                       "--smoke-test", "--out", str(out), "--quiet", "--format",
                       "json"]) == 0, capsys.readouterr().err
    front = json.loads(capsys.readouterr().out)
    names = {r["name"]: r for r in front["rows"]}
    assert {"svd", "mha2mla", "teacher"} <= set(names) and (out / "student_front.json").is_file()
    assert names[front["pick"]]["vs_pick"] == 0.0
    for t in confirmed["trials"]:
        if t["number"] is not None:
            found = names[f"trial {t['number']} ({t['label']})"]
            assert found["loss"] == pytest.approx(t["loss"], rel=1e-9)
    assert names["svd"]["kv_cache"] <= names[front["pick"]]["kv_cache"] * 1.01


def assert_exported_plan_builds_the_trial(paths: dict[str, Path], url: str, study: str,
                                          number: int, tmp: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``studies export --trial N`` then ``workers.compress``: the student of equal logits to
    the one trial ``N`` measured (rebuilt as its worker built it)."""
    from studies.cli import main as studies_main
    from workers.checkpoints import load
    from workers.compress import main as compress_main
    from workers.search.protocol import StudentJob, StudentSpec
    from workers.search.student_trial import build as build_trial

    plan = tmp / "export" / "plan.yaml"
    plan.parent.mkdir()
    assert studies_main(["export", "--storage", url, "--study", study, "--trial", str(number),
                         "--out", str(plan)]) == 0, capsys.readouterr().err
    assert (plan.parent / "plan.factors.safetensors").is_file()
    assert compress_main(["--checkpoint", str(paths["teacher"]), "--plan", str(plan),
                          "--out", str(tmp / "student"), "--quiet"]) == 0, \
        capsys.readouterr().err
    trial = optuna.load_study(study_name=study, storage=url).trials[number]
    attrs: dict[str, Any] = trial.user_attrs
    job = StudentJob(str(Path(paths["teacher"]).resolve()), attrs["plan_folder"].rsplit(
        "/students/", 1)[0])
    spec = StudentSpec(Allocation.from_dict(json.loads(attrs["allocation"])),
                       attrs["plan_folder"])
    measured, _ = build_trial(job, spec)
    built = load(tmp / "student").model.eval()
    with torch.no_grad():
        torch.testing.assert_close(built(ids()), measured(ids()), atol=1e-5, rtol=1e-5)
    assert built.arch == measured.arch
    assert SEQ and VOCAB  # the helpers' sizes: the teacher reads them


def test_the_cache_is_measured_once_and_a_trial_distils_and_reports_each_part(
        teacher: dict[str, Path], tmp_path: Path) -> None:
    """Without Ray: the teacher measured once for two requests of the same inputs; a trial
    (``student_trial``) distils, then reports its running held-out loss after each part."""
    from search_spaces import fit_allocation
    from userdata import DataSpec
    from workers.search import student_cache
    from workers.search.protocol import StudentJob, StudentSpec, TrialReport
    from workers.search.student_trial import WINDOWS, student_trial

    tokens = DataSpec(str(teacher["tokens"])).resolved()
    settings = student_cache.CacheSettings(Path(teacher["teacher"]).resolve(), tokens, tokens,
                                           16, 128, 64, (2, 4))
    before = sum(student_cache.COMPUTED.values())
    cache = student_cache.ensure_cache(settings, tmp_path, quiet=True)
    again = student_cache.ensure_cache(settings, tmp_path, quiet=True)
    assert again.folder == cache.folder and sum(student_cache.COMPUTED.values()) == before + 1
    chosen = fit_allocation(0.25, [1.0, 2.0], [2, 4], cache.shape)
    reports: list[TrialReport] = []
    job = StudentJob(str(settings.teacher), str(cache.folder), eval_chunks=2, distil_steps=2)
    student_trial(job, StudentSpec(chosen, str(cache.student_folder(chosen))),
                  lambda report, _: reports.append(report), tmp_path, "node")
    assert [r.step for r in reports] == [1, 2] and all(r.error is None for r in reports)
    losses = json.loads((cache.student_folder(chosen) / WINDOWS).read_text())
    assert reports[-1].value == pytest.approx(sum(losses) / len(losses))


def test_a_point_below_the_budget_keeps_its_share_of_each_rope_part() -> None:
    """Sampled points spend exactly their ``kv_cache``; at half the budget each layer keeps
    half its RoPE part (what the study measured the teacher at), not the whole of it."""
    from search_spaces import RandomSuggester
    from search_spaces.students import rope_name, scaled_rope

    space = parse_student_space({**SPACE, "kv_shares": [0.5, 1.0]})
    shape = TeacherShape((2,) * 4, (16,) * 4, (16,) * 4, 64, 256)
    plan = Allocation(0.25, (8, 8, 8, 8), (4, 4, 4, 4))
    cached = set(space.cached_ropes(4, 16, 0.25))
    for seed in range(20):
        trial = RandomSuggester(seed)
        made = space.sample(trial, plan, shape, 0.25)
        assert made.units(shape.kv_heads) == shape.allowed(made.kv_cache)
        assert set(made.rope_dims) <= cached
        share = made.kv_cache / 0.25
        assert all(r <= scaled_rope(trial.params[rope_name(i)], share)
                   for i, r in enumerate(made.rope_dims))


def test_a_latent_form_point_has_no_rope_part_and_spends_its_kv_cache_exactly() -> None:
    """The rotated latent form searches widths only: no ``rope_dim`` is suggested, every layer
    keeps none, and each point spends exactly the units its ``kv_cache`` allows."""
    from search_spaces import RandomSuggester

    space = parse_student_space({**SPACE, "form": "latent", "kv_shares": [0.5, 1.0]})
    shape = TeacherShape((2,) * 4, (16,) * 4, (16,) * 4, 64, 256)
    plan = Allocation(0.25, (20, 12, 16, 16), (0, 0, 0, 0))
    assert space.cached_ropes(0, 16, 0.25) == [0]
    assert set(space.modes(plan, 0.25)) == {"kv_cache", *(f"L{i}.latent_dim" for i in range(4))}
    for seed in range(20):
        trial = RandomSuggester(seed)
        made = space.sample(trial, plan, shape, 0.25)
        assert made.rope_dims == (0,) * 4 and not any("rope" in k for k in trial.params)
        assert made.units(shape.kv_heads) == shape.allowed(made.kv_cache)


def test_a_latent_form_search_measures_and_builds_rotated_students(
        teacher: dict[str, Path], tmp_path: Path) -> None:
    """``form: latent`` end to end without Ray: the request plans no RoPE part, the cache
    measures the rotated form once, the fixed allocations spend the budget exactly, and the
    plan's student rebuilds its keys then turns them (and scores every held-out window)."""
    from userdata import DataSpec
    from workers.search import student_cache
    from workers.search.protocol import StudentJob, StudentSpec, TrialReport
    from workers.search.student_trial import student_trial
    from workers.search.students import fixed_allocations, prepare_student

    space = parse_student_space({**SPACE, "form": "latent"})
    tokens = DataSpec(str(teacher["tokens"]))
    request = prepare_student(space, Path(teacher["teacher"]), tokens, tokens, 0.25)
    assert request.rope == 0 and request.settings.rope_dims == (0,)
    cache = student_cache.ensure_cache(request.settings, tmp_path, quiet=True)
    fixed = fixed_allocations(cache, request)
    for chosen in fixed.values():
        assert chosen.rope_dims == (0,) * len(chosen.rope_dims)
        assert chosen.units(cache.shape.kv_heads) == cache.shape.allowed(0.25)
    student = student_cache.student_plan(cache, fixed["plan"]).student
    assert all(layer.rotate_latent and not layer.rope_dim for layer in student.layers)
    reports: list[TrialReport] = []
    job = StudentJob(str(request.settings.teacher), str(cache.folder), eval_chunks=2)
    student_trial(job, StudentSpec(fixed["plan"], str(cache.student_folder(fixed["plan"]))),
                  lambda report, _: reports.append(report), tmp_path, "node")
    assert [r.step for r in reports] == [1, 2] and all(r.error is None for r in reports)


@pytest.mark.parametrize(("extra", "says"), [
    (["--study", "other"], "--study other: must name a student search's study"),
    (["--study", "absent"], "--study absent: must name a student search's study"),
])
def test_confirm_refuses_in_one_line(tmp_path: Path, extra: list[str], says: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``workers.confirm`` reads only a student search's study: any other is one line, exit 2,
    and the database is left as it was."""
    from workers.confirm import main as confirm_main

    url = f"sqlite:///{tmp_path / 's.db'}"
    optuna.create_study(study_name="other", storage=url)
    before = (tmp_path / "s.db").read_bytes()
    assert confirm_main(["--storage", url, "--eval", str(tmp_path), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert (tmp_path / "s.db").read_bytes() == before


# --- the plan refitted to the measured students --------------------------------------------------

@pytest.fixture(scope="module")
def latent_cache(teacher: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
                 ) -> tuple[Any, Any]:
    """A latent-form student request on the tiny teacher and its measured cache."""
    from userdata import DataSpec
    from workers.search import student_cache
    from workers.search.students import prepare_student

    tokens = DataSpec(str(teacher["tokens"]))
    space = parse_student_space({**SPACE, "form": "latent", "refit_after": 4})
    request = prepare_student(space, Path(teacher["teacher"]), tokens, tokens, 0.25)
    return request, student_cache.ensure_cache(request.settings, tmp_path_factory.mktemp("c"),
                                               quiet=True)


def synthetic_students(cache: Any, request: Any, scales: tuple[float, ...], count: int
                       ) -> list[tuple[Allocation, float]]:
    """Random allocations at the budget and the loss the depth model gives each at ``scales``
    (one per depth group), exactly."""
    import numpy as np

    from alloc.compression import depth_groups

    plan = cache.plan(0)
    groups = depth_groups(plan)
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        chosen = fit_allocation(0.25, rng.uniform(0.2, 2.0, len(plan.layers)).tolist(),
                                [0] * len(plan.layers), cache.shape)
        loss = float(cache.meta["teacher_loss"]) + sum(
            s * sum(plan.layers[i].latent_losses[chosen.latent_dims[i]] for i in g)
            for s, g in zip(scales, groups))
        out.append((chosen, loss))
    return out


def test_the_depth_scales_fitted_to_exact_losses_are_the_true_ones(
        latent_cache: tuple[Any, Any]) -> None:
    """Students whose losses follow the depth model exactly give back its scales (R² 1); too
    few students give no fit; the rescaled plan's estimates are the plan's times the scale."""
    from alloc.compression import Observation, depth_groups, fit_depth_scales, rescaled

    request, cache = latent_cache
    plan = cache.plan(0)
    truth = tuple([1.0, 3.0, 7.0][:len(depth_groups(plan))])
    students = synthetic_students(cache, request, truth, 12)
    observed = [Observation(dict(enumerate(a.latent_dims)), dict(enumerate(a.rope_dims)), loss)
                for a, loss in students]
    fit = fit_depth_scales(cache.plans(), observed, float(cache.meta["teacher_loss"]))
    assert fit is not None and fit.observations == 12
    assert fit.scales == pytest.approx(truth, rel=1e-6) and fit.r2 == pytest.approx(1.0)
    assert fit.trusted  # exact losses: the depth model predicts a left-out student best
    assert fit_depth_scales(cache.plans(), observed[:len(truth) + 1],
                            float(cache.meta["teacher_loss"])) is None
    scaled = rescaled(plan, fit)
    for layer, before in zip(scaled.layers, plan.layers):
        factor = fit.scale_of(layer.index)
        assert layer.latent_losses is not None and before.latent_losses is not None
        assert all(layer.latent_losses[w] == pytest.approx(factor * v)
                   for w, v in before.latent_losses.items())


def test_a_study_enqueues_the_plan_refitted_to_its_students_once(
        latent_cache: tuple[Any, Any], tmp_path: Path) -> None:
    """After ``refit_after`` complete students of the same teacher measurements (this study's,
    and earlier studies' of the same cache, not a study of other measurements) the searcher
    enqueues, once, the plan made again from the scales fitted to them, labelled ``refit`` with
    its fit recorded, and the prior sampler of a study that follows others centres on it;
    students whose losses the depth model does not predict enqueue nothing."""
    from optuna.trial import TrialState, create_trial

    from alloc.compression import aligned, plan_for_kv_cache, rescaled
    from workers.search.students import (
        ALLOCATION,
        PLAN,
        REFIT,
        StudentSearcher,
        earlier_students,
        fixed_allocations,
        prior_centre,
        refit_allocation,
    )

    request, cache = latent_cache
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 's.db'}")
    students = synthetic_students(cache, request, (1.0, 3.0, 7.0), 8)
    fixed = fixed_allocations(cache, request)

    def study_of(name: str, folder: str, rows: list[tuple[Allocation, float]]) -> optuna.Study:
        study = optuna.create_study(storage=storage, study_name=name,
                                    directions=["minimize", "minimize"])
        study.set_user_attr("cache", folder)
        for chosen, loss in rows:
            add(study, chosen, loss)
        return study

    def add(study: optuna.Study, chosen: Allocation, loss: float) -> None:
        study.add_trial(create_trial(values=[loss, 1.0], user_attrs={
            ALLOCATION: json.dumps(chosen.to_dict())}))

    def searcher_of(study: optuna.Study) -> StudentSearcher:
        searcher = StudentSearcher(request, cache, study, storage, fixed)
        searcher.fixed = []  # only the refit is under test
        return searcher

    # alone, and beside another teacher's study: 3 of refit_after 4, nothing; then the fourth
    alone = study_of("alone", str(cache.folder), students[:3])
    study_of("other-teacher", "/elsewhere", [(a, loss + 5.0) for a, loss in students[4:]])
    searcher = searcher_of(alone)
    searcher._enqueue_refit()
    assert not alone.get_trials(states=(TrialState.WAITING,))
    assert prior_centre(request, cache, fixed[PLAN], searcher.earlier)[0] == fixed[PLAN]
    add(alone, *students[3])
    searcher._enqueue_refit()
    searcher._enqueue_refit()
    (waiting,) = alone.get_trials(states=(TrialState.WAITING,))
    assert waiting.user_attrs["seed"] == REFIT and json.loads(
        waiting.user_attrs[REFIT])["observations"] == 4
    # a study after it (and another of the same teacher) has the earlier students at once
    study_of("same-teacher", str(cache.folder), students[4:])
    study = study_of("this", str(cache.folder), [])
    searcher = searcher_of(study)
    assert len(searcher.earlier) == 8 == len(earlier_students(request, storage, "this", cache))
    searcher._enqueue_refit()
    searcher._enqueue_refit()
    (waiting,) = study.get_trials(states=(TrialState.WAITING,))
    assert waiting.user_attrs["seed"] == REFIT
    fit = json.loads(waiting.user_attrs[REFIT])
    assert fit["observations"] == 8 and fit["r2"] == pytest.approx(1.0)
    assert fit["loo_error"] < fit["loo_single"]
    made = Allocation.from_dict(json.loads(waiting.user_attrs["fixed"]))
    found = refit_allocation(cache, request, searcher._measured_students())
    assert found is not None and made == found[0]
    centre, why = prior_centre(request, cache, fixed[PLAN], searcher.earlier)
    assert centre == made and "8 earlier students" in why
    expected = plan_for_kv_cache(aligned(rescaled(cache.plan(0), found[1]), request.space.align),
                                 0.25)
    assert made.latent_dims == tuple(layer.latent_dim for layer in expected.layers)
    assert made.units(cache.shape.kv_heads) <= cache.shape.allowed(0.25)
    # losses that are noise around one value: the depth model is not trusted, nothing is made
    import numpy as np

    noise = np.random.default_rng(1).normal(3.0, 0.01, len(students))
    noisy = study_of("noisy", "/other", [(a, float(n)) for (a, _), n in zip(students, noise)])
    assert refit_allocation(cache, request, noisy.get_trials()) is None
