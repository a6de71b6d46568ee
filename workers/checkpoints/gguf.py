"""GGUF files (llama.cpp's format) read as the Llama family's stock tensors: ``config.json``'s
fields from the file's metadata, and each tensor dequantized to float32 when it is read, one at
a time, from the memory-mapped file (the ``gguf`` package's reader and dequantizer).

``GGUFTensors`` answers what ``workers.checkpoints.folder.TensorFolder`` answers (``shape``,
``dtype``, ``get`` by the ``transformers`` name, ``model.layers.0.self_attn.q_proj.weight``), so
every reader and pass of a Llama-family folder reads a GGUF file unchanged: loading, streaming a
layer at a time, students.

Two things differ from a ``transformers`` folder, both undone here as ``transformers``' own GGUF
loader undoes them (``modeling_gguf_pytorch_utils``): llama.cpp stores a Llama's query and key
rows of each head interleaved (pair ``i`` at rows ``2i, 2i + 1``; the rotate-half layout has it
at ``i, i + head_dim / 2``), and names tensors its own way (``blk.0.attn_q.weight``). A tied
embedding is a file without ``output.weight``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from workers.checkpoints.folder import TensorFolder, check_finite, checkpoint_error, read_config

SUFFIX = ".gguf"
# GGUF architectures read as transformers' model_type; a Mistral file says llama (its name
# tells them apart, as transformers reads it)
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2"}
# the per-block tensors: transformers' name after "model.layers.{i}." -> llama.cpp's after
# "blk.{i}."
_BLOCK = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight"}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}
DEQUANTIZE_VALUES = 1 << 22  # values dequantized at once (16 MB as float32)
# metadata fields a reader no longer needs once the config is read (the tokenizer's vocabulary
# and merges: ~150 MB of Python objects for a 49,152-token vocabulary)
_TOKENIZER_FIELDS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                     "tokenizer.ggml.token_type", "tokenizer.ggml.scores")
_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
# metadata key (after "<architecture>.") -> config.json field
_CONFIG = {"block_count": "num_hidden_layers", "context_length": "max_position_embeddings",
           "embedding_length": "hidden_size", "feed_forward_length": "intermediate_size",
           "attention.head_count": "num_attention_heads",
           "attention.head_count_kv": "num_key_value_heads",
           "attention.layer_norm_rms_epsilon": "rms_norm_eps", "vocab_size": "vocab_size",
           "attention.key_length": "head_dim", "attention.sliding_window": "sliding_window"}


def is_gguf(path: Path) -> bool:
    """True for a ``.gguf`` file, or a folder holding exactly one (and no ``config.json``)."""
    return gguf_file(path) is not None


def gguf_file(path: Path) -> Path | None:
    """The GGUF file ``path`` names: itself, or the one ``.gguf`` file of a folder without a
    ``config.json`` (None otherwise)."""
    if path.is_file():
        return path if path.suffix == SUFFIX else None
    if not path.is_dir() or (path / "config.json").exists():
        return None
    found = sorted(path.glob(f"*{SUFFIX}"))
    return found[0] if len(found) == 1 else None


def stock_to_gguf(name: str) -> str:
    """llama.cpp's name of the tensor ``transformers`` calls ``name``."""
    if name in _TOP:
        return _TOP[name]
    match = _LAYER.fullmatch(name)
    if match is None or match.group(2) not in _BLOCK:
        raise KeyError(name)
    return f"blk.{match.group(1)}.{_BLOCK[match.group(2)]}"


def _reader(path: Path, source: str) -> Any:
    try:
        from gguf import GGUFReader
    except ImportError:
        raise checkpoint_error(source, "reading a GGUF file needs the gguf package (pip "
                                       "install gguf)") from None
    try:
        return _checked_reader(GGUFReader)(str(path))
    except _Truncated as cut:
        raise checkpoint_error(source, f"{path.name}: truncated GGUF file ({cut.size:,} bytes, "
                                       f"{cut.needs})") from None
    except Exception as err:  # the reader raises several kinds for a file that is not GGUF
        raise checkpoint_error(source, f"unreadable GGUF file ({type(err).__name__}: "
                                       f"{str(err).splitlines()[0] if str(err) else ''})") from None


class _Truncated(Exception):
    """The file ends before what its header describes: ``size`` bytes, ``needs`` says what."""

    def __init__(self, size: int, needs: str) -> None:
        super().__init__(needs)
        self.size, self.needs = size, needs


def _checked_reader(base: Any) -> Any:
    """``gguf``'s reader class, made to raise ``_Truncated`` where it would read past the end
    of the file (it reads a short slice of the map and fails later with an ``IndexError`` or a
    reshape's ``ValueError``): in the header, or where the header's tensors end."""

    class Checked(base):  # type: ignore[misc]
        def _get(self, offset: int, dtype: Any, count: int = 1,
                 override_order: Any = None) -> Any:
            end = int(offset) + np.dtype(dtype).itemsize * int(count)
            if end > len(self.data):
                raise _Truncated(len(self.data), "its header goes on past the end")
            return super()._get(offset, dtype, count, override_order)

        def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
            ends = [_tensor_end(start_offs, field) for field in fields]
            needs = max((e for e in ends if e is not None), default=0)
            if needs > len(self.data):
                raise _Truncated(len(self.data), f"the header's tensors need {needs:,}")
            super()._build_tensors(start_offs, fields)

    return Checked


def _tensor_end(start: int, field: Any) -> int | None:
    """Where the tensor a header ``field`` describes ends in the file (None: a type the reader
    refuses itself)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    _name_len, _name, _n_dims, dims, raw_dtype, offset = field.parts
    try:
        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(int(raw_dtype[0]))]
    except (ValueError, KeyError):
        return None
    return start + int(offset[0]) + int(np.prod(dims)) * type_size // block_size


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def gguf_config(reader: Any, source: str) -> dict[str, Any]:
    """The ``config.json`` of a Llama-family ``transformers`` model that the file's metadata
    describes; a RoPE scaling or an architecture outside the family is refused by name."""
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise checkpoint_error(source, f"general.architecture = {arch!r} is not supported; "
                                       f"this reader takes {', '.join(ARCHITECTURES)} GGUF files")
    name = str(_field(reader, "general.name") or "")
    family = "mistral" if arch == "llama" and "mistral" in name.lower() else ARCHITECTURES[arch]
    config: dict[str, Any] = {"model_type": family, "architectures": [
        {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
         "qwen2": "Qwen2ForCausalLM"}[family]]}
    for key, field in _CONFIG.items():
        value = _field(reader, f"{arch}.{key}")
        if value is not None:
            config[field] = value
    if "vocab_size" not in config:
        tokens = _field(reader, "tokenizer.ggml.tokens")
        config["vocab_size"] = len(tokens) if tokens is not None else None
    for key in reader.fields:
        if key.startswith(f"{arch}.rope.scaling."):
            raise checkpoint_error(source, f"{key} = {_field(reader, key)!r} is not supported "
                                           "(this reader takes RoPE without scaling)")
    rope_dims = _field(reader, f"{arch}.rope.dimension_count")
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if rope_dims is not None and rope_dims != head_dim:
        raise checkpoint_error(source, f"{arch}.rope.dimension_count = {rope_dims}: every one "
                                       f"of a head's {head_dim} dims must rotate")
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": float(
        _field(reader, f"{arch}.rope.freq_base") or 10000.0)}
    config["tie_word_embeddings"] = not any(t.name == "output.weight" for t in reader.tensors)
    # what a student of it is written in: float32 only when the file holds float32 alone
    # (quantized weights have fewer significant bits than bfloat16 keeps)
    config["dtype"] = "float32" if all(t.tensor_type.name == "F32" for t in reader.tensors) \
        else "bfloat16"
    for token in ("bos", "eos", "padding"):
        value = _field(reader, f"tokenizer.ggml.{token}_token_id")
        if value is not None:
            config["pad_token_id" if token == "padding" else f"{token}_token_id"] = value
    return config


class GGUFTensors:
    """The stock tensors of a GGUF file, by their ``transformers`` names (use as a context
    manager, as ``TensorFolder``): ``shape`` and ``dtype`` read the header, ``get`` dequantizes
    one tensor."""

    def __init__(self, path: Path, source: str) -> None:
        self.path, self.source = path, source
        self.reader = _reader(path, source)
        self.config = gguf_config(self.reader, source)
        self.has_tokenizer = _field(self.reader, "tokenizer.ggml.model") is not None
        for key in _TOKENIZER_FIELDS:  # read by transformers' tokenizer conversion, not here
            self.reader.fields.pop(key, None)
        self.permuted = self.reader.fields and _field(
            self.reader, "general.architecture") == "llama"
        self._tensors = {t.name: t for t in self.reader.tensors}
        self.files = {}
        for stock in self._stock_names():
            if stock_to_gguf(stock) in self._tensors:
                self.files[stock] = path.name

    def _stock_names(self) -> list[str]:
        layers = int(self.config.get("num_hidden_layers") or 0)
        return [*_TOP, *(f"model.layers.{i}.{name}" for i in range(layers) for name in _BLOCK)]

    def __enter__(self) -> GGUFTensors:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def names(self) -> Any:
        return iter(self.files)

    def _tensor(self, name: str) -> Any:
        if name not in self.files:
            raise checkpoint_error(self.source, f"tensor {name!r} ({_safe(name)}) is missing")
        return self._tensors[stock_to_gguf(name)]

    def shape(self, name: str) -> tuple[int, ...]:
        """``name``'s shape as ``transformers`` holds it (rows first; GGUF lists the
        dimensions innermost first)."""
        return tuple(int(n) for n in reversed(self._tensor(name).shape))

    def dtype(self, name: str) -> str:
        """``name``'s storage type in the file (``F32``, ``F16``, ``BF16``, ``Q4_1``, ...)."""
        return str(self._tensor(name).tensor_type.name)

    def get(self, name: str, shape: tuple[int, ...],
            dtype: torch.dtype | None = torch.float32) -> Tensor:
        """Tensor ``name``, checked to have ``shape`` before it is read, dequantized to float32
        (then ``dtype``; None: float32), a Llama's query and key rows back in rotate-half
        order."""
        from gguf import dequantize

        found = self.shape(name)
        if found != shape:
            raise checkpoint_error(self.source, f"tensor {name!r} has shape {found}, its "
                                                f"metadata makes it {shape}")
        tensor = self._tensor(name)
        out = torch.empty(shape, dtype=torch.float32)
        rows = out.view(-1, shape[-1])
        data = tensor.data.reshape(rows.shape[0], -1)  # (rows, bytes or values per row)
        # a few rows at a time: the dequantizer's temporaries are a chunk's, not the tensor's
        step = max(1, DEQUANTIZE_VALUES // shape[-1])
        for a in range(0, rows.shape[0], step):
            chunk = dequantize(data[a:a + step], tensor.tensor_type)
            # (a copy: an unquantized file's rows come back as read-only views of the map)
            rows[a:a + step] = torch.from_numpy(np.array(chunk, dtype=np.float32).reshape(
                -1, shape[-1]))
        if self.permuted and (".q_proj." in name or ".k_proj." in name):
            heads = self.config["num_attention_heads" if ".q_proj." in name
                                else "num_key_value_heads"]
            out = unpermute(out, heads)
        check_finite(name, out, self.source)
        return out if dtype is None else out.to(dtype)


def unpermute(rows: Tensor, heads: int) -> Tensor:
    """llama.cpp's interleaved query/key rows (or biases) of ``heads`` heads (pair ``i`` of a
    head at rows ``2i, 2i + 1``) in rotate-half order (rows ``i, i + dim / 2``)."""
    dim = rows.shape[0] // heads
    return rows.reshape(heads, dim // 2, 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


def permute(rows: Tensor, heads: int) -> Tensor:
    """The inverse of ``unpermute``: rotate-half rows in llama.cpp's interleaved order."""
    dim = rows.shape[0] // heads
    return rows.reshape(heads, 2, dim // 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


def _safe(name: str) -> str:
    try:
        return stock_to_gguf(name)
    except KeyError:
        return "no GGUF name"


def open_tensors(path: Path, source: str) -> TensorFolder | GGUFTensors:
    """The tensors of a Llama-family checkpoint by their ``transformers`` names: a folder's
    safetensors, or a GGUF file's (use as a context manager)."""
    gguf = gguf_file(path)
    return TensorFolder(path, source) if gguf is None else GGUFTensors(gguf, source)


def model_config(path: Path, source: str) -> dict[str, Any]:
    """The ``config.json`` of a folder, or the one a GGUF file's metadata makes."""
    gguf = gguf_file(path)
    return read_config(path, source) if gguf is None else GGUFTensors(gguf, source).config
