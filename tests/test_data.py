"""The user's data: text, nanoGPT .bin and .npy sources read lazily and checked (each bad input
one line naming the file and the rule), and the tasks on them train through the trainer's CLI
and the search like any other task."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from arch import ArchConfig, HeadGroup, LayerSpec
from search_spaces import load_space, parse_space
from userdata import DataError, DataSpec, infer_format, open_arrays, open_tokens
from workers.tasks import describe_task, make_data_task, task_from_description
from workers.train import main as train_main


def write_bin(folder: Path, train: np.ndarray, val: np.ndarray, meta: object = None,
              kind: str = "pkl") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    train.tofile(folder / "train.bin")
    val.tofile(folder / "val.bin")
    if meta is not None:
        if kind == "pkl":
            (folder / "meta.pkl").write_bytes(pickle.dumps(meta))
        else:
            (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def text_folder(tmp: Path) -> Path:
    (tmp / "corpus" / "deep").mkdir(parents=True)
    (tmp / "corpus" / "a.txt").write_text("hello world, " * 200)
    (tmp / "corpus" / "deep" / "b.txt").write_text("tschüss welt. " * 200)
    (tmp / "corpus" / "skip.md").write_text("not read")
    return tmp / "corpus"


def test_formats_come_from_the_path(tmp_path: Path) -> None:
    folder = text_folder(tmp_path)
    assert infer_format(folder) == "text" and infer_format(folder / "a.txt") == "text"
    rng = np.random.default_rng(0)
    write_bin(tmp_path / "b", rng.integers(0, 50, 1000, dtype=np.uint16),
              rng.integers(0, 50, 200, dtype=np.uint16))
    assert infer_format(tmp_path / "b") == "bin"
    np.save(tmp_path / "x.npy", rng.normal(size=(4, 8, 3)))
    assert infer_format(tmp_path / "x.npy") == "npy"


def test_text_folder_is_read_recursively_as_bytes_with_a_positional_split(tmp_path: Path
                                                                         ) -> None:
    data = open_tokens(DataSpec(str(text_folder(tmp_path))), 33)
    raw = ((tmp_path / "corpus" / "a.txt").read_bytes() + b"\n\n"
           + (tmp_path / "corpus" / "deep" / "b.txt").read_bytes())
    assert data.vocab_size == 256 and len(data.train) + len(data.val) == len(raw)
    assert bytes(np.concatenate([data.train, data.val])) == raw  # last 10% is validation
    assert len(data.val) == len(raw) - int(0.9 * len(raw))


def test_bin_is_memory_mapped_and_its_vocabulary_found(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    train, val = rng.integers(0, 70, 5000, dtype=np.uint16), rng.integers(0, 70, 500,
                                                                          dtype=np.uint16)
    plain = open_tokens(DataSpec(str(write_bin(tmp_path / "a", train, val))), 65)
    assert isinstance(plain.train, np.memmap) and plain.vocab_size == max(train.max(),
                                                                          val.max()) + 1
    assert (np.asarray(plain.train) == train).all()
    meta = open_tokens(DataSpec(str(write_bin(tmp_path / "b", train, val, {"vocab_size": 100})
                                    )), 65)
    assert meta.vocab_size == 100
    js = open_tokens(DataSpec(str(write_bin(tmp_path / "c", train, val, {"vocab_size": 80},
                                            "json"))), 65)
    assert js.vocab_size == 80
    given = open_tokens(DataSpec(str(tmp_path / "b"), vocab_size=90), 65)
    assert given.vocab_size == 90  # the flag wins over meta.pkl
    # A model's vocabulary (profiling or compressing a checkpoint) comes after the flag and the
    # meta file, before the largest token + 1.
    model = open_tokens(DataSpec(str(tmp_path / "a"), default_vocab=256), 65)
    assert model.vocab_size == 256
    assert open_tokens(DataSpec(str(tmp_path / "b"), default_vocab=256), 65).vocab_size == 100
    with pytest.raises(DataError, match=r"token 69 >= vocabulary size 50 \(from the model's "):
        open_tokens(DataSpec(str(tmp_path / "a"), default_vocab=50), 65)
    wide = open_tokens(DataSpec(str(write_bin(tmp_path / "d", train.astype(np.uint32) + 70000,
                                              val.astype(np.uint32) + 70000)),
                                dtype="uint32"), 65)
    assert wide.vocab_size == 70070 and wide.train.dtype == np.uint32


@pytest.mark.parametrize(("make", "message"), [
    (lambda t: DataSpec(str(t / "nope")), "no such file or folder"),
    (lambda t: DataSpec(str(_file(t / "e.txt", b""))), "the corpus is empty"),
    (lambda t: DataSpec(str(_file(t / "l.txt", b"\xff\xfe" * 50))), "not UTF-8 text"),
    (lambda t: DataSpec(str(_file(t / "s.txt", b"short"))), "fewer than one window"),
    (lambda t: DataSpec(str(write_bin(t / "odd", np.arange(7, dtype=np.uint8),
                                      np.arange(7, dtype=np.uint8)))),
     "is not a whole number of uint16 tokens"),
    (lambda t: DataSpec(str(write_bin(t / "v", np.arange(100, dtype=np.uint16),
                                      np.arange(100, dtype=np.uint16), {"vocab_size": 50}))),
     "token 99 >= vocabulary size 50"),
    (lambda t: DataSpec(str(_folder(t / "empty"))), "a folder needs train.bin/val.bin"),
    (lambda t: DataSpec(str(write_bin(t / "z", np.zeros(0, np.uint16),
                                      np.arange(9, dtype=np.uint16)))),
     "train.bin': is empty"),
    (lambda t: DataSpec(str(write_bin(t / "f", np.arange(9, dtype=np.uint16),
                                      np.arange(9, dtype=np.uint16)) / "train.bin")),
     "a .bin file is one split of nanoGPT's layout; give the folder"),
    (lambda t: DataSpec(str(write_bin(t / "g", np.arange(9, dtype=np.uint16),
                                      np.arange(9, dtype=np.uint16)) / "train.bin"), "bin"),
     "data.format bin reads a folder"),
    (lambda t: DataSpec(str(_files(t / "blank", [b"", b""]))), "the corpus is empty"),
])
def test_bad_token_sources_say_which_file_and_rule(tmp_path: Path, make: object,
                                                   message: str) -> None:
    with pytest.raises(DataError, match=message) as err:
        open_tokens(make(tmp_path), 33)  # type: ignore[operator]
    assert "\n" not in str(err.value) and str(err.value).startswith("data.path '")
    assert "--" not in str(err.value)  # the Python API names fields, a command its flags


def _file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _files(path: Path, texts: list[bytes]) -> Path:
    path.mkdir()
    for i, text in enumerate(texts):
        (path / f"{i}.txt").write_bytes(text)
    return path


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


def test_arrays_with_targets_next_step_and_bad_ones(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 8, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    data = open_arrays(DataSpec(str(tmp_path)))  # next-step prediction of x
    assert data.x_train.shape == (18, 7, 3) and (data.y_train == x[:18, 1:]).all()
    np.save(tmp_path / "y.npy", rng.normal(size=(20, 8, 2)).astype(np.float32))
    data = open_arrays(DataSpec(str(tmp_path)))
    assert (data.input_dim, data.output_dim, data.length, len(data.x_val)) == (3, 2, 8, 2)
    x[3, 2, 1] = np.nan
    np.save(tmp_path / "x.npy", x)
    with pytest.raises(DataError, match="contains NaN"):
        open_arrays(DataSpec(str(tmp_path)))
    np.save(tmp_path / "x.npy", np.zeros((4, 8)))
    with pytest.raises(DataError, match=r"shape \(4, 8\) must be \(N, T, dim\)"):
        open_arrays(DataSpec(str(tmp_path)))


def test_data_tasks_batch_deterministically_and_rebuild_from_their_description(
        tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    folder = write_bin(tmp_path / "b", rng.integers(0, 40, 4000, dtype=np.uint16),
                       rng.integers(0, 40, 400, dtype=np.uint16))
    task = make_data_task(DataSpec(str(folder)), "smoke", seed=3)
    assert (task.name, task.seq_len, task.vocab_size) == ("bin", 32, 40)
    again = task_from_description(describe_task(task))
    a, b = task.batch("train", 5, 8), again.batch("train", 5, 8)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert torch.equal(a.x[:, 1:], a.y[:, :-1]) and a.x.dtype == torch.int64
    tokens = np.fromfile(folder / "val.bin", dtype=np.uint16)
    v = task.batch("val", 0, 4)
    row = v.x[0].numpy()
    starts = [i for i in range(len(tokens) - 32) if (tokens[i:i + 32] == row).all()]
    assert starts  # validation windows come from val.bin
    np.save(tmp_path / "x.npy", rng.normal(size=(30, 10, 4)).astype(np.float32))
    vectors = make_data_task(DataSpec(str(tmp_path / "x.npy")), "smoke")
    batch = vectors.batch("train", 0, 6)
    assert batch.x.shape == (6, 9, 4) and batch.y.shape == (6, 9, 4)


@pytest.mark.parametrize("kind", ["text", "bin", "npy"])
def test_the_trainer_cli_trains_on_each_format(kind: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(2)
    if kind == "text":
        data = text_folder(tmp_path)
    elif kind == "bin":
        data = write_bin(tmp_path / "b", rng.integers(0, 30, 3000, dtype=np.uint16),
                         rng.integers(0, 30, 300, dtype=np.uint16), {"vocab_size": 30})
    else:
        np.save(tmp_path / "x.npy", rng.normal(size=(40, 12, 5)).astype(np.float32))
        data = tmp_path / "x.npy"
    arch = tmp_path / "arch.yaml"
    arch.write_text(ArchConfig(d_model=16, layers=(LayerSpec("mhsa", (HeadGroup(2, 8),)),),
                               max_seq_len=1, vocab_size=2).to_yaml())
    assert train_main(["--arch", str(arch), "--data", str(data), "--smoke-test", "--format",
                       "json", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["task"] == kind and summary["status"] == "completed"


@pytest.mark.parametrize(("argv", "message"), [
    (["--data", "NOPE"], "--data '"),
    (["--data", "DIR", "--task-param", "m_max=3"], "a --data task takes only length=N"),
    (["--task", "ngram", "--vocab-size", "9"], "only with --data"),
    (["--data", "DIR", "--data-format", "npy"], "no such file (npy needs x.npy"),
    # the readers' fields (data.format) shown as the command's flags
    (["--data", "DIR/a.txt", "--data-format", "bin"], "--data-format bin reads a folder"),
])
def test_trainer_cli_bad_data_is_one_line(argv: list[str], message: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    folder = text_folder(tmp_path)
    arch = tmp_path / "arch.yaml"
    arch.write_text(ArchConfig(d_model=8, layers=(LayerSpec("mhsa", (HeadGroup(2, 4),)),),
                               max_seq_len=1, vocab_size=2).to_yaml())
    argv = [a.replace("DIR", str(folder)) if a.startswith("DIR") else
            str(tmp_path / "nope") if a == "NOPE" else a for a in argv]
    assert train_main(["--arch", str(arch), *argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_the_data_flags_name_a_spec_with_the_readers_choices() -> None:
    """One builder of the data flags (``userdata.add_data_args``): its choices are the readers'
    formats and dtypes, and what they name is the ``DataSpec`` read."""
    from common.cli import Parser
    from userdata import DATA_FORMATS, DTYPES, add_data_args, data_spec

    parser = Parser(prog="p")
    add_data_args(parser)
    choices = {a.dest: a.choices for a in parser._actions}
    assert choices["data_format"] == DATA_FORMATS and choices["data_dtype"] == DTYPES
    assert data_spec(parser.parse_args([])) is None
    args = parser.parse_args(["--data", "d", "--data-format", "bin", "--data-dtype", "uint32",
                              "--vocab-size", "9"])
    assert data_spec(args) == DataSpec("d", "bin", "uint32", 9)


def test_a_space_names_its_data_relative_to_its_file(tmp_path: Path) -> None:
    text_folder(tmp_path)
    (tmp_path / "s.yaml").write_text("name: s\nbudget: 16\ndepth: 1\ndata: corpus\n"
                                     "layers: [{heads: [2]}]\n")
    space = load_space(tmp_path / "s.yaml")
    assert space.data_source is not None
    assert space.data_source.path == str((tmp_path / "corpus").resolve())
    assert space.data_source.format == "text"
    with pytest.raises(Exception, match="data"):
        parse_space({"name": "t", "budget": 16, "layers": [{"heads": [2]}],
                     "data": {"path": str(tmp_path / "corpus"), "colour": 1}})


def test_a_y_npy_is_only_the_targets_of_an_x_npy(tmp_path: Path) -> None:
    x = np.random.default_rng(0).normal(size=(20, 8, 3)).astype(np.float32)
    np.save(tmp_path / "foo.npy", x)
    np.save(tmp_path / "y.npy", np.zeros((5, 2, 1), dtype=np.float32))  # someone else's
    data = open_arrays(DataSpec(str(tmp_path / "foo.npy")))
    assert data.y_train.shape[-1] == 3  # next-step prediction of foo, not the unrelated y.npy
