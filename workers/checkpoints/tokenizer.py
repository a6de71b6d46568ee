"""A checkpoint's tokenizer, carried into what is made from it: a student folder gets its
teacher's tokenizer files, so that ``AutoTokenizer.from_pretrained(student)`` works as it did on
the teacher. A ``transformers`` folder's files are copied as they are; a GGUF file's tokenizer
(its vocabulary, merges and special tokens in the metadata) is written by ``transformers``' own
GGUF conversion."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from workers.checkpoints.folder import source_of
from workers.checkpoints.gguf import GGUFTensors, gguf_file

# The files transformers' tokenizers read from a model folder
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
                   "chat_template.jinja", "generation_config.json")


def tokenizer_writer(checkpoint: Path) -> Callable[[Path], None] | None:
    """What writes ``checkpoint``'s tokenizer into a folder (None: it has none: our ``.pt``
    checkpoints, folders without tokenizer files)."""
    gguf = gguf_file(checkpoint)
    if gguf is not None:
        if not GGUFTensors(gguf, source_of(gguf)).has_tokenizer:
            return None
        return lambda folder: _from_gguf(gguf, folder)
    if not checkpoint.is_dir():
        return None
    found = [checkpoint / name for name in TOKENIZER_FILES if (checkpoint / name).is_file()]
    if not any(f.name != "generation_config.json" for f in found):
        return None

    def copy(folder: Path) -> None:
        for file in found:
            shutil.copyfile(file, folder / file.name)

    return copy


def _from_gguf(gguf: Path, folder: Path) -> None:
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(folder)
