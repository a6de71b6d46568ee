"""A practitioner's data, read with numpy (no torch): what the trainer trains on and the profiler
measures.

Formats (``DataSpec.format``, taken from the path unless given):

* ``text``: a UTF-8 text file, or a folder of ``*.txt`` files (recursively, in sorted order,
  joined by a blank line); byte-level tokens, vocabulary 256; the last 10% is validation.
* ``bin``: the flat token files nanoGPT-style pipelines write: ``train.bin`` and ``val.bin`` in a
  folder, ``uint16`` by default (``dtype: uint32``); the vocabulary is ``vocab_size`` if given,
  else ``meta.pkl`` / ``meta.json`` beside them, else the largest token + 1.
* ``npy``: float arrays of vector sequences: ``x.npy`` of shape (N, T, d_in) with ``y.npy``
  (N, T, d_out) as targets or, without it, next-step prediction of ``x``; the last 10% of the
  sequences is validation.

Files are memory-mapped, never loaded whole: a batch reads its windows from the page cache (a
folder of ``*.txt`` files is the exception: it is joined in memory, so give a large text corpus as
one file or as nanoGPT ``.bin``). Every
check (missing file, empty corpus, wrong dtype, token >= vocabulary, sequences shorter than the
window, NaN) raises ``DataError`` with one line naming the file and the rule, in the words of
``DataSpec``'s fields as a space file's ``data:`` writes them (``data.path``, ``data.format``,
``data.dtype``, ``data.vocab_size``); a command shows them as its flags (``userdata.DATA_FLAGS``).
"""

from __future__ import annotations

import dataclasses
import json
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from common.errors import Problem
from userdata.errors import DataError

DataFormat = Literal["text", "bin", "npy"]
DATA_FORMATS: tuple[DataFormat, ...] = get_args(DataFormat)
DTYPES = ("uint16", "uint32")
VAL_FRACTION = 0.1
_CHUNK = 1 << 24  # elements scanned at a time (64 MB of uint32)


def _bad(field: str, shown: object, rule: str) -> DataError:
    """The error for ``DataSpec``'s ``field`` (``dtype``), shown as ``shown``, breaking ``rule``
    (which may name other fields, ``{data.format}``)."""
    return DataError.of([Problem(f"data.{field}", shown, rule)])


def _bad_file(path: Path | str, rule: str) -> DataError:
    """The error for the data file or folder ``path`` (the spec's ``path``, or a file in it)."""
    return _bad("path", repr(str(path)), rule)


@dataclass(frozen=True)
class DataSpec:
    """Where the data is and how to read it."""

    path: str
    format: DataFormat | None = None  # None: from the path (``infer_format``)
    dtype: str = "uint16"  # bin only
    vocab_size: int | None = None  # bin only: overrides meta.pkl / the largest token
    # bin only: the vocabulary without ``vocab_size`` or a meta file (a trained model's, which
    # the data feeds), before the largest token + 1
    default_vocab: int | None = None

    def resolved(self) -> DataSpec:
        """The spec with an absolute path (Ray workers run elsewhere; on a cluster every node
        needs the data at this path) and its format taken from the path, checked."""
        if self.dtype not in DTYPES:
            raise _bad("dtype", repr(self.dtype), f"must be one of {', '.join(DTYPES)}")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise _bad("vocab_size", self.vocab_size, "must be an integer >= 1")
        path = Path(self.path).resolve()
        fmt = self.format or infer_format(path)
        if fmt not in DATA_FORMATS:
            raise _bad("format", repr(fmt), f"must be one of {', '.join(DATA_FORMATS)}")
        return dataclasses.replace(self, path=str(path), format=fmt)


def infer_format(path: Path) -> DataFormat:
    """``text`` for a ``.txt`` file or a folder of them, ``bin`` for a folder with
    ``train.bin``, ``npy`` for an ``.npy`` file or a folder with ``x.npy``."""
    if not path.exists():
        raise _bad_file(path, "no such file or folder")
    if path.is_file():
        if path.suffix == ".npy":
            return "npy"
        if path.suffix == ".bin":
            raise _bad_file(path, "a .bin file is one split of nanoGPT's layout; give the "
                                  "folder that holds train.bin and val.bin")
        return "text"
    if (path / "train.bin").exists():
        return "bin"
    if (path / "x.npy").exists():
        return "npy"
    if next(path.rglob("*.txt"), None) is not None:
        return "text"
    raise _bad_file(path, "a folder needs train.bin/val.bin (bin), x.npy (npy) or *.txt files "
                          "(text); or give {data.format}")


# --- tokens -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenData:
    """Token ids of the train and validation splits (1-D, memory-mapped where possible)."""

    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    source: str


def open_tokens(spec: DataSpec, window: int, scan: bool = True) -> TokenData:
    """The token splits of a ``text`` or ``bin`` source, each at least ``window`` long.

    Args:
        spec: the source.
        window: tokens one example needs (``seq_len + 1``).
        scan: read every token of a ``bin`` source once, to check it against the vocabulary
            (or to find the vocabulary); without it ``spec.vocab_size`` must be set.

    Raises:
        DataError: see the module docstring.
    """
    spec = spec.resolved()
    if spec.format == "text":
        data = _text_bytes(Path(spec.path))
        cut = int(len(data) * (1 - VAL_FRACTION))
        tokens = TokenData(data[:cut], data[cut:], 256, spec.path)
    elif spec.format == "bin":
        tokens = _bin_tokens(spec, scan)
    else:
        raise _bad_file(spec.path, "npy holds vector sequences, not tokens")
    for split in ("train", "val"):
        n = len(getattr(tokens, split))
        if n < window:
            raise _bad_file(spec.path, f"the {split} split has {n:,} tokens, fewer than one "
                                       f"window of seq_len + 1 = {window}")
    return tokens


def _text_bytes(path: Path) -> np.ndarray:
    files = [path] if path.is_file() else sorted(path.rglob("*.txt"))
    if not files:
        raise _bad_file(path, "no *.txt files in this folder")
    for file in files:
        with file.open("rb") as handle:
            head = handle.read(1 << 20)
        try:
            head.decode("utf-8")
        except UnicodeDecodeError as err:
            if err.start < len(head) - 4:  # a character cut by the 1 MB sample is fine
                raise _bad_file(file, f"not UTF-8 text (byte {err.start}: "
                                      f"{err.reason})") from None
    if len(files) == 1:
        size = files[0].stat().st_size
        if size == 0:
            raise _bad_file(files[0], "the corpus is empty")
        return np.memmap(files[0], dtype=np.uint8, mode="r")
    if not any(f.stat().st_size for f in files):
        raise _bad_file(path, "the corpus is empty (every *.txt file is)")
    # A folder of files is joined in memory (a single large file is memory-mapped instead).
    return np.frombuffer(b"\n\n".join(f.read_bytes() for f in files), dtype=np.uint8)


def _bin_tokens(spec: DataSpec, scan: bool) -> TokenData:
    folder = Path(spec.path)
    dtype = np.dtype(spec.dtype)
    splits = {}
    for split in ("train", "val"):
        file = folder / f"{split}.bin"
        if folder.is_file():
            raise _bad_file(folder, "{data.format} bin reads a folder holding train.bin and "
                                    "val.bin (nanoGPT layout), not one file")
        if not file.is_file():
            raise _bad_file(folder, f"needs {split}.bin (nanoGPT layout)")
        size = file.stat().st_size
        if size == 0:
            raise _bad_file(file, "is empty (no tokens)")
        if size % dtype.itemsize:
            raise _bad_file(file, f"{size} bytes is not a whole number of {spec.dtype} tokens "
                                  "({data.dtype} uint16 or uint32)")
        splits[split] = np.memmap(file, dtype=dtype, mode="r")
    if not scan and spec.vocab_size is not None:  # checked where the task was made
        return TokenData(splits["train"], splits["val"], spec.vocab_size, spec.path)
    largest = max(_max(a) for a in splits.values())
    meta = None if spec.vocab_size else _meta_vocab(folder)
    vocab = spec.vocab_size or meta or spec.default_vocab or largest + 1
    if largest >= vocab:
        source = ("{data.vocab_size}" if spec.vocab_size else "meta.pkl/meta.json" if meta
                  else "the model's vocabulary; give {data.vocab_size}")
        raise _bad_file(folder, f"token {largest} >= vocabulary size {vocab} (from {source})")
    return TokenData(splits["train"], splits["val"], int(vocab), spec.path)


def _max(array: np.ndarray) -> int:
    """Largest value, scanning a memory map in chunks (never the whole file at once)."""
    return int(max(array[i:i + _CHUNK].max() for i in range(0, len(array), _CHUNK)))


def _meta_vocab(folder: Path) -> int | None:
    """``vocab_size`` from ``meta.json`` or nanoGPT's ``meta.pkl``, if one is there."""
    meta: Any = None
    if (folder / "meta.json").is_file():
        try:
            meta = json.loads((folder / "meta.json").read_text())
        except (OSError, ValueError) as err:
            raise _bad_file(folder / "meta.json", f"not JSON ({err})") from None
    elif (folder / "meta.pkl").is_file():
        try:
            with (folder / "meta.pkl").open("rb") as handle:
                meta = pickle.load(handle)  # nanoGPT's own format; the user's file
        except (OSError, pickle.UnpicklingError, EOFError) as err:
            raise _bad_file(folder / "meta.pkl", f"unreadable ({err})") from None
    if meta is None:
        return None
    vocab = meta.get("vocab_size") if isinstance(meta, dict) else None
    if not isinstance(vocab, int) or vocab < 1:
        raise _bad_file(folder, "meta file has no integer vocab_size")
    return vocab


# --- vector sequences ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ArrayData:
    """Input and target sequences of each split: (N, T, d_in) and (N, T, d_out)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    source: str

    @property
    def input_dim(self) -> int:
        return int(self.x_train.shape[2])

    @property
    def output_dim(self) -> int:
        return int(self.y_train.shape[2])

    @property
    def length(self) -> int:
        return int(self.x_train.shape[1])


def open_arrays(spec: DataSpec) -> ArrayData:
    """The sequences of an ``npy`` source (targets ``y.npy``, else ``x`` one step ahead).

    Raises:
        DataError: see the module docstring.
    """
    spec = spec.resolved()
    if spec.format != "npy":
        raise _bad_file(spec.path, f"{spec.format} holds tokens, not vector sequences")
    path = Path(spec.path)
    x_file = path if path.is_file() else path / "x.npy"
    # Targets only beside an x.npy (a folder, or the file itself): any foo.npy with an
    # unrelated y.npy next to it is next-step prediction of foo.
    y_file = x_file.with_name("y.npy") if x_file.name == "x.npy" else None
    x = _load_array(x_file)
    if y_file is not None and y_file.is_file():
        y = _load_array(y_file)
        if y.shape[:2] != x.shape[:2]:
            raise _bad_file(y_file, f"shape {y.shape} must match x's (N, T) = {x.shape[:2]}")
    else:  # next-step prediction: x_t -> x_{t+1}
        if x.shape[1] < 2:
            raise _bad_file(x_file, "next-step prediction needs T >= 2")
        x, y = x[:, :-1], x[:, 1:]
    n_val = max(1, round(len(x) * VAL_FRACTION))
    if len(x) - n_val < 1:
        raise _bad_file(x_file, f"{len(x)} sequence(s); needs at least 2 (train and "
                                "validation)")
    return ArrayData(x[:-n_val], y[:-n_val], x[-n_val:], y[-n_val:], spec.path)


def _load_array(file: Path) -> np.ndarray:
    if not file.is_file():
        raise _bad_file(file, "no such file (npy needs x.npy, optionally y.npy)")
    try:
        array = np.load(file, mmap_mode="r")
    except (OSError, ValueError) as err:
        raise _bad_file(file, f"not a numpy array ({err})") from None
    if array.ndim != 3 or 0 in array.shape:
        raise _bad_file(file, f"shape {array.shape} must be (N, T, dim), non-empty")
    if not np.issubdtype(array.dtype, np.floating):
        raise _bad_file(file, f"dtype {array.dtype} must be floating point")
    rows = max(1, _CHUNK // array[0].size)  # sequences per scanned chunk
    for i in range(0, len(array), rows):
        if not np.isfinite(array[i:i + rows]).all():
            raise _bad_file(file, "contains NaN or infinite values")
    return array
