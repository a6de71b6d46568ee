"""The flags that name the user's data, shared by every command that reads it (``workers.train``,
``workers.search``, ``workers.compress``, the profile commands): ``--data``, ``--data-format``,
``--data-dtype``, ``--vocab-size``, and the ``DataSpec`` they name."""

from __future__ import annotations

import argparse
from pathlib import Path

from common.cli import flag_names, int_in
from userdata.readers import DATA_FORMATS, DTYPES, DataSpec

# The flag that sets each field of a ``DataSpec``: the readers' problems name the fields
# (``data.path``), a command shows them as these flags (``TransformerAllocError.text``).
DATA_FLAGS = {"data.path": "--data", "data.format": "--data-format", "data.dtype": "--data-dtype",
              "data.vocab_size": "--vocab-size"}

DATA_HELP = ("your data: a UTF-8 text file or folder of *.txt, a folder with nanoGPT's "
             "train.bin/val.bin, or x.npy (with y.npy)")


def add_data_args(parser: argparse.ArgumentParser,
                  data_group: argparse._ActionsContainer | None = None,
                  data_help: str = DATA_HELP) -> None:
    """``--data`` (in ``data_group`` if given, e.g. one exclusive with ``--task``; with
    ``data_help`` saying what the command does with it) and how to read it."""
    (data_group or parser).add_argument("--data", type=Path, help=data_help)
    parser.add_argument("--data-format", choices=DATA_FORMATS,
                        help="default: from the --data path")
    parser.add_argument("--data-dtype", choices=DTYPES, default=DataSpec.dtype,
                        help="token type of .bin files")
    parser.add_argument("--vocab-size", type=int_in(1),
                        help=".bin vocabulary (default: meta.pkl/meta.json, else the largest "
                             "token + 1)")


def data_flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """The entries of ``DATA_FLAGS`` whose flag ``parser`` has: a command without ``--data``
    (one that reads data it wrote) shows the readers' problems in their own words."""
    have = set(flag_names(parser).values())
    return {field: flag for field, flag in DATA_FLAGS.items() if flag in have}


def data_spec(args: argparse.Namespace) -> DataSpec | None:
    """The data the flags of ``add_data_args`` name, or None without ``--data``."""
    if args.data is None:
        return None
    return DataSpec(str(args.data), args.data_format, args.data_dtype, args.vocab_size)
