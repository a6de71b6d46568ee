"""workers.tasks: determinism, shapes, hand-checked labels, disjoint splits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from arch import ArchConfig, HeadGroup, LayerSpec
from userdata import DATA_FORMATS
from workers.tasks import (
    DATA_TASKS,
    TASKS,
    AdditionTask,
    DyckTask,
    TaskError,
    fit_arch,
    make_task,
)


@pytest.mark.parametrize("size", ["smoke", "paper"])
@pytest.mark.parametrize("name", sorted(set(TASKS) - set(DATA_TASKS)))
def test_batches_are_deterministic_and_shaped(name: str, size: str) -> None:
    task = make_task(name, size, seed=3)
    a, b = task.batch("train", 5, 6), task.batch("train", 5, 6)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and torch.equal(a.mask, b.mask)
    assert not torch.equal(task.batch("train", 6, 6).x, a.x)
    assert a.x.shape[:2] == (6, task.seq_len) and a.mask.shape == (6, task.seq_len)
    assert a.mask.any()
    if task.inputs == "tokens":
        assert a.x.dtype == torch.long and int(a.x.max()) < task.vocab_size
        assert int(a.y[a.mask].max()) < task.vocab_size
    else:
        assert a.x.shape[2] == task.input_dim and a.y.shape[2] == task.output_dim


def rows(t: torch.Tensor) -> set[tuple[int, ...]]:
    return {tuple(r) for r in t.tolist()}


@pytest.mark.parametrize("name", ["retrieval", "addition", "dyck", "induction", "modadd"])
def test_train_and_validation_never_overlap(name: str) -> None:
    task = make_task(name, "smoke")
    train = set().union(*(rows(task.batch("train", i, 256).x) for i in range(8)))
    val = set().union(*(rows(task.batch("val", i, 256).x) for i in range(4)))
    assert train and val and not train & val


def test_modadd_labels_and_split() -> None:
    task = make_task("modadd", "smoke")
    b = task.batch("train", 0, 64)
    assert torch.equal(b.y[:, -1], (b.x[:, 0] + b.x[:, 1]) % 13)
    assert (b.x[:, 2] == 13).all() and b.mask[:, -1].all() and not b.mask[:, :2].any()
    train, val = task.pairs("train"), task.pairs("val")
    assert len(rows(train)) == 120 and len(rows(val)) == 40 and not rows(train) & rows(val)


def test_retrieval_answer_is_the_queried_keys_value() -> None:
    task = make_task("retrieval", "smoke", m_max=5)
    b = task.batch("train", 0, 200)
    for seq, answer in zip(b.x.tolist(), b.y[:, -1].tolist()):
        pairs = [(seq[i], seq[i + 1]) for i in range(0, len(seq) - 1, 2) if seq[i]]
        keys = [k for k, _ in pairs]
        assert 1 <= len(pairs) <= 5 and len(set(keys)) == len(keys)
        assert all(k >= 128 and 1 <= v < 128 for k, v in pairs)
        assert dict(pairs)[seq[-1]] == answer


def test_retrieval_trains_on_several_queries_and_a_curriculum() -> None:
    task = make_task("retrieval", "smoke", m_max=6, queries=3, ramp=100, ramp_from=2)
    assert task.seq_len == 2 * 6 + 2 * 3 - 1
    b = task.batch("train", 0, 300)
    assert b.x.shape == (300, task.seq_len) and int(b.mask.sum(1).min()) == 3
    for seq, y, mask in zip(b.x.tolist(), b.y.tolist(), b.mask.tolist()):
        context = dict((seq[i], seq[i + 1]) for i in range(0, 12, 2) if seq[i])
        assert 1 <= len(context) <= 2  # the curriculum's first batch: at most ramp_from pairs
        for t in (t for t, m in enumerate(mask) if m):  # each query key -> its value
            assert t >= 12 and context[seq[t]] == y[t]
            assert t + 1 == len(seq) or seq[t + 1] == y[t]  # the next pair repeats it
    assert task.pairs_at(50) == 4 and task.pairs_at(100) == task.pairs_at(10**6) == 6
    val = task.batch("val", 0, 50)  # evaluation is the plain single-query task
    assert val.x.shape == (50, 13) and val.mask[:, -1].all() and int(val.mask.sum()) == 50
    assert torch.equal(val.y[:, -1], task.answer(val.x))  # type: ignore[attr-defined]


def test_addition_hand_checked() -> None:
    task = make_task("addition", "smoke")  # 3 digits
    b = task.batch("train", 0, 50)
    for x, y in zip(b.x.tolist(), b.y.tolist()):
        full = [*x, y[-1]]
        a = int("".join(map(str, full[0:3])))
        c = int("".join(map(str, full[4:7])))
        assert full[3] == AdditionTask.PLUS and full[7] == AdditionTask.EQUALS
        assert 100 <= a <= 999 and 100 <= c <= 999
        assert int("".join(map(str, full[8:12]))) == a + c


def test_dyck_labels_and_balance() -> None:
    assert DyckTask.balanced(torch.tensor([[0, 1, 0, 0, 1, 1], [0, 1, 1, 0, 0, 1],
                                           [0, 0, 1, 1, 0, 0]])).tolist() == [True, False, False]
    task = make_task("dyck", "smoke")
    b = task.batch("train", 0, 400)
    for x, label in zip(b.x.tolist(), b.y[:, -1].tolist()):
        depth, ok = 0, True
        for token in x[:-1]:
            depth += 1 if token == DyckTask.OPEN else -1
            ok &= depth >= 0
        assert (label == DyckTask.ANSWER[1]) == (ok and depth == 0)
    balanced = (b.y[:, -1] == DyckTask.ANSWER[1]).float().mean().item()
    assert 0.35 < balanced < 0.75  # not a trivial majority class


def test_ngram_targets_are_sums_of_previous_four_tokens() -> None:
    task = make_task("ngram", "smoke", noise=0.0)
    b = task.batch("train", 0, 3)
    for t in range(task.seq_len):
        expected = sum((b.x[:, t - s] for s in range(1, 5) if t - s >= 0),
                       torch.zeros_like(b.x[:, 0]))
        torch.testing.assert_close(b.y[:, t], expected)


def test_induction_second_half_repeats_the_first() -> None:
    task = make_task("induction", "smoke")
    b = task.batch("train", 0, 8)
    half = task.seq_len // 2
    assert torch.equal(b.x[:, half:2 * half], b.x[:, :half])
    assert torch.equal(b.y[b.mask], b.x[:, 1:][b.mask[:, :-1]])


def test_icl_linear_targets_are_linear_and_sparse() -> None:
    task = make_task("icl_linear", "smoke", sparsity=2)
    b = task.batch("train", 0, 4)
    xs, ys = b.x[:, 0::2, :5], b.x[:, 1::2, 5]
    w = torch.linalg.lstsq(xs, ys[..., None]).solution[..., 0]  # 10 points, 5 dims: exact
    assert ((w.abs() > 1e-4).sum(1) <= 2).all()
    torch.testing.assert_close(b.y[:, 0::2, 0], ys)


def test_denoise_signal_lies_in_the_tokens_subspace() -> None:
    task = make_task("denoise", "smoke")
    b = task.batch("train", 0, 4)
    assert b.aux is not None
    u = task.bases()[b.aux]  # (B, T, d, p)
    projected = torch.einsum("btdp,btp->btd", u, torch.einsum("btdp,btd->btp", u, b.y))
    torch.testing.assert_close(projected, b.y, rtol=1e-4, atol=1e-5)
    total, count = task.score(b.y, b)  # the clean signal has no out-of-subspace part
    assert total / count > 1e4


def test_memorize_table_is_fixed_and_bits_per_param() -> None:
    task = make_task("memorize", "smoke")
    a, b = task.batch("train", 0, 64), task.batch("val", 3, 64)
    table = task.table()
    for batch in (a, b):
        assert torch.equal(batch.y[:, -1], table[batch.x[:, 0], batch.x[:, 1] - 16])
    assert task.extra(1.0, 256 * 4)["bits_per_param"] == pytest.approx(4 * 256 / 1024)


def test_lm_corpus_splits_are_disjoint_and_local() -> None:
    task = make_task("lm", "smoke")
    train, val = task.text("train"), task.text("val")
    assert len(train) > 300_000 and len(val) > 30_000
    b = task.batch("val", 0, 4)
    assert torch.equal(b.y[:, :-1], b.x[:, 1:])


def test_unknown_names_list_the_choices() -> None:
    with pytest.raises(TaskError, match="unknown task 'sort'; choices: ngram"):
        make_task("sort")
    with pytest.raises(TaskError, match="unknown parameter 'mmax' for task retrieval; valid: "):
        make_task("retrieval", mmax=3)
    with pytest.raises(TaskError, match="unknown size 'huge'"):
        make_task("dyck", "huge")


def test_fit_arch_wires_inputs_and_keeps_layers() -> None:
    layers = (LayerSpec("mhsa", (HeadGroup(2, 8),), mlp_ratio=2),)
    arch = ArchConfig(d_model=16, layers=layers, max_seq_len=256, input_dim=64)
    tokens = fit_arch(arch, make_task("modadd", "smoke"))
    assert (tokens.vocab_size, tokens.input_dim, tokens.max_seq_len) == (14, None, 3)
    assert tokens.layers == layers
    vectors = fit_arch(tokens, make_task("icl_linear", "smoke"))
    assert (vectors.input_dim, vectors.output_dim, vectors.vocab_size) == (6, 1, None)


def test_modadd_rejects_a_split_larger_than_the_pairs() -> None:
    with pytest.raises(TaskError, match=r"train 40000 \+ val 4000 .* p\^2 = 9409 pairs"):
        make_task("modadd", "paper", p=97)
    assert len(make_task("modadd", "paper", p=97, train=4704, val=2000).pairs("val")) == 2000


def test_a_trained_models_task_keeps_short_vector_sequences(tmp_path: Path) -> None:
    """Measuring a vector model on .npy sequences shorter than its length uses them as they
    are; asking for more steps than they have is a DataError, one line, not a traceback."""
    import numpy as np

    from arch import ArchConfig, HeadGroup, LayerSpec
    from userdata import DataError, DataSpec, TaskSpec
    from workers.taskargs import check_fits, resolve_task

    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=(20, 8, 3)))
    arch = ArchConfig(d_model=16, layers=(LayerSpec("mhsa", (HeadGroup(2, 8),)),),
                      max_seq_len=16, input_dim=3)
    spec = TaskSpec(data=DataSpec(str(tmp_path / "x.npy")))
    task = resolve_task(spec, arch)
    assert task is not None and task.seq_len == 7  # next-step prediction over 8 steps
    check_fits(task, arch, trains=False, spec=spec)
    with pytest.raises(DataError, match="length=12: the sequences"):
        resolve_task(TaskSpec(data=spec.data, params={"length": 12}), arch)


def test_the_task_flags_name_every_registered_task() -> None:
    """``userdata.task`` lists the task names without torch; the registry must agree."""
    from userdata import GENERATED_TASKS

    assert list(GENERATED_TASKS) == sorted(set(TASKS) - set(DATA_TASKS))
    assert set(DATA_TASKS) <= set(TASKS) and sorted(DATA_TASKS) == sorted(DATA_FORMATS)


# Each command that runs a task, and the flags it requires besides the task's.
COMMANDS = {"workers.train": ["--arch", "a.yaml"], "workers.search": ["--space", "s.yaml"],
            "workers.profile": ["--checkpoint", "m.pt"],
            "workers.compress": ["--checkpoint", "m.pt", "--plan", "p.yaml", "--out", "s.pt"]}


def _spec(command: str, flags: list[str]):  # type: ignore[no-untyped-def]
    import importlib

    from workers.taskargs import task_spec

    module = importlib.import_module("workers.search.cli" if command == "workers.search"
                                     else command)
    return task_spec(module.build_parser().parse_args([*COMMANDS[command], *flags]))


@pytest.mark.parametrize("flags", [
    ["--task", "ngram", "--task-param", "dim=8", "--seed", "3"],
    ["--task", "lm", "--smoke-test"],
    ["--task", "modadd", "--task-param", "p=13", "--task-param", "train=40",
     "--task-param", "val=40"],
    ["--data", "DIR", "--task-param", "length=16", "--seed", "1"],
    ["--data", "DIR", "--vocab-size", "300", "--smoke-test"],
])
def test_the_same_flags_name_the_same_task_in_every_command(flags: list[str],
                                                            tmp_path: Path) -> None:
    """Every command reads its task flags into one ``TaskSpec`` (``task_spec``) and builds it
    with one resolver (``resolve_task``): the same flags give the same spec, and the same
    task, in the trainer, the search, the checkpoint profile and the compressor; for a trained
    model whose length is the task's window, the model's task is that task."""
    from workers.taskargs import resolve_task
    from workers.tasks import describe_task

    (tmp_path / "a.txt").write_text("the quick brown fox jumps over the lazy dog. " * 200)
    flags = [str(tmp_path) if a == "DIR" else a for a in flags]
    specs = {command: _spec(command, flags) for command in COMMANDS}
    assert len({repr(spec) for spec in specs.values()}) == 1, specs
    spec = specs["workers.train"]
    task = resolve_task(spec)
    assert task is not None
    arch = ArchConfig(d_model=16, layers=(LayerSpec("mhsa", (HeadGroup(2, 8),)),),
                      max_seq_len=task.seq_len, **{
                          "vocab_size": task.io.vocab_size} if task.io.vocab_size else {
                          "input_dim": task.io.input_dim, "output_dim": task.io.output_dim})
    assert describe_task(resolve_task(spec, arch)) == describe_task(task)  # type: ignore[arg-type]


def test_a_bad_task_field_is_one_error_naming_the_field_then_the_flag(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ``TaskSpec`` that breaks a rule is one ``TaskError`` naming each field as the library
    calls it (``task.params``), never a flag; every command shows the same problem with its
    flag (``--task-param``)."""
    from userdata import DataSpec, TaskSpec
    from workers.compress import main as compress_main
    from workers.train import main as train_main

    (tmp_path / "a.txt").write_text("some text " * 100)
    with pytest.raises(TaskError) as err:
        TaskSpec(data=DataSpec(str(tmp_path)), params={"m_max": 3, "length": 8}, size="big",
                 seed=-1)
    text = str(err.value)
    assert "\n" not in text and "--" not in text
    assert [p.field for p in err.value.broken] == ["task.params", "task.size", "task.seed"]
    assert text.startswith("task.params m_max: a task.data task takes only length=N")
    with pytest.raises(TaskError, match=r"task\.name: unknown task 'sort'; choices: addition"):
        TaskSpec("sort")
    bad = ["--data", str(tmp_path), "--task-param", "m_max=3"]
    (tmp_path / "a.yaml").write_text(ArchConfig(d_model=8, layers=(
        LayerSpec("mhsa", (HeadGroup(2, 4),)),), max_seq_len=1, vocab_size=2).to_yaml())
    for main, argv in ((train_main, ["--arch", str(tmp_path / "a.yaml"), *bad]),
                       (compress_main, [*COMMANDS["workers.compress"], *bad])):
        assert main(argv) == 2
        err_text = capsys.readouterr().err
        assert err_text.count("\n") == 1
        assert "--task-param m_max: a --data task takes only length=N" in err_text
