"""Readers of the user's own data, with numpy only (no torch): a text file or folder, nanoGPT's
``train.bin``/``val.bin``, or ``x.npy``/``y.npy`` vector sequences, memory-mapped. What the
trainer trains on and the profiler measures."""

from userdata.readers import (
    DTYPES,
    FORMATS,
    ArrayData,
    DataError,
    DataFormat,
    DataSpec,
    TokenData,
    infer_format,
    open_arrays,
    open_tokens,
)

__all__ = [
    "DTYPES",
    "FORMATS",
    "ArrayData",
    "DataError",
    "DataFormat",
    "DataSpec",
    "TokenData",
    "infer_format",
    "open_arrays",
    "open_tokens",
]
