#!/usr/bin/env python
"""Turn text files into a token file that training reads (set ``data.path`` and ``data.dtype``).

Byte-level by default (each byte one token, vocabulary 256: use a model with
``vocab_size >= 256``). With ``--tokenizer tokenizer.json`` (a Hugging Face
``tokenizers`` file) the text is encoded with it instead; that needs the
``tokenizers`` package, which training itself does not.

Examples:
    python scripts/prepare_data.py data/mycorpus.bin ~/texts/
    python scripts/prepare_data.py data/mycorpus.bin a.txt b.txt --tokenizer tokenizer.json

Directories are searched recursively for files matching ``--glob`` (``*.txt``);
files are read in sorted order so the same inputs always give the same file.
The output is written atomically (complete or absent).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from train.data import encode_bytes, write_tokens  # noqa: E402


def input_files(paths: list[Path], pattern: str) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob(pattern) if p.is_file()))
        elif path.is_file():
            files.append(path)
        else:
            raise SystemExit(f"error: {path} does not exist")
    if not files:
        raise SystemExit(f"error: no input files (directories are searched for {pattern!r})")
    return files


def tokenizer_encoder(path: Path) -> tuple[Callable[[bytes], list[int]], int]:
    """(encode, vocabulary size) of a Hugging Face tokenizer file."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise SystemExit("error: --tokenizer needs the 'tokenizers' package: pip install tokenizers") from None
    tokenizer = Tokenizer.from_file(str(path))
    return (lambda data: tokenizer.encode(data.decode("utf-8", errors="replace")).ids), tokenizer.get_vocab_size()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output", type=Path, help="the token file to write (e.g. data/corpus.bin)")
    parser.add_argument("inputs", type=Path, nargs="+", help="text files or directories")
    parser.add_argument("--tokenizer", type=Path, help="a tokenizers JSON file (default: byte-level)")
    parser.add_argument("--glob", default="*.txt", help="file pattern inside directories (default: *.txt)")
    parser.add_argument("--dtype", choices=("uint16", "uint32"),
                        help="token type (default: uint16 if the vocabulary fits, else uint32)")
    args = parser.parse_args(argv)

    files = input_files(args.inputs, args.glob)
    if args.tokenizer is None:
        vocab = 256
        dtype = args.dtype or "uint16"
        chunks: Iterator[np.ndarray] = (encode_bytes(f.read_bytes(), dtype) for f in files)
    else:
        encode, vocab = tokenizer_encoder(args.tokenizer)
        dtype = args.dtype or ("uint16" if vocab <= 2**16 else "uint32")
        chunks = (np.asarray(encode(f.read_bytes()), dtype=dtype) for f in files)
    if vocab > np.iinfo(dtype).max + 1:
        raise SystemExit(f"error: a vocabulary of {vocab} does not fit in {dtype}")
    count = write_tokens(args.output, chunks, dtype)
    print(f"wrote {count:,} tokens from {len(files)} files to {args.output}\n"
          f"train with: data.path={args.output.resolve()} data.dtype={dtype} (vocabulary {vocab}; "
          f"model.vocab_size must be at least that)")


if __name__ == "__main__":
    main()
