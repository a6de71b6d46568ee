"""Readers of the user's own data, with numpy only (no torch): a text file or folder, nanoGPT's
``train.bin``/``val.bin``, or ``x.npy``/``y.npy`` vector sequences, memory-mapped. What the
trainer trains on and the profiler measures, the flags that name it, and the task a command
names (``TaskSpec``: a generated task or this data); ``userdata.corpora``, the development and
held-out corpora every machine has. The public names are those of ``__all__``, imported from
here; every other module is private to the package (tests/test_layering checks)."""

from userdata.cli import DATA_FLAGS, DATA_HELP, add_data_args, data_flags, data_spec
from userdata.errors import DataError, TaskError
from userdata.readers import (
    DATA_FORMATS,
    DTYPES,
    ArrayData,
    DataFormat,
    DataSpec,
    TokenData,
    infer_format,
    open_arrays,
    open_tokens,
)
from userdata.task import GENERATED_TASKS, SIZES, TaskSpec

__all__ = [
    "DATA_FLAGS",
    "DATA_FORMATS",
    "DATA_HELP",
    "DTYPES",
    "GENERATED_TASKS",
    "SIZES",
    "ArrayData",
    "DataError",
    "DataFormat",
    "DataSpec",
    "TaskError",
    "TaskSpec",
    "TokenData",
    "add_data_args",
    "corpora",
    "data_flags",
    "data_spec",
    "infer_format",
    "open_arrays",
    "open_tokens",
]
