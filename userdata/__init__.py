"""Readers of the user's own data, with numpy only (no torch): a text file or folder, nanoGPT's
``train.bin``/``val.bin``, or ``x.npy``/``y.npy`` vector sequences, memory-mapped. What the
trainer trains on and the profiler measures, and the flags that name it."""

from userdata.cli import add_data_args, data_spec
from userdata.errors import DataError
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

__all__ = [
    "DATA_FORMATS",
    "DTYPES",
    "ArrayData",
    "DataError",
    "DataFormat",
    "DataSpec",
    "TokenData",
    "add_data_args",
    "data_spec",
    "infer_format",
    "open_arrays",
    "open_tokens",
]
