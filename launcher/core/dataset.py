"""What a token dataset is on disk: the one home of its layout, read by the launcher (data prepare writes it,
launch checks it, sample decodes with its tokenizer) and by training (launcher/train/data.py reads its shards).

``data.path`` names either a dataset directory made by ``launcher data prepare``::

    metadata.json          tokenizer (kind, file, sha256, vocabulary size), dtype, token count, shards, sources
    tokenizer.json         the Hugging Face tokenizer that made the shards (absent for byte-level)
    tokens_00000.bin ...   token ids back to back, little-endian ``dtype``

or a single token file (nanoGPT's ``train.bin``: no metadata, so its dtype is ``data.dtype`` and its
tokenizer is taken to be byte-level). Without ``data.path`` training uses the byte-level corpus of
Python's standard library, cached under ``data.cache_dir``. This module stays free of numpy and torch,
so that checking a dataset costs a launch nothing but a few ``stat`` calls.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

# Token ids are stored as unsigned integers of this many bytes.
TOKEN_DTYPES = {"uint16": 2, "uint32": 4}
METADATA = "metadata.json"
TOKENIZER_FILE = "tokenizer.json"
FORMAT = "slurm-gpt-launcher tokens v1"
BYTE_VOCAB = 256  # the byte-level tokenizer: one token per byte


def shard_name(index: int) -> str:
    return f"tokens_{index:05d}.bin"


def smallest_dtype(vocab_size: int) -> str:
    """The narrowest token dtype that holds every id of a vocabulary."""
    return next(name for name, size in TOKEN_DTYPES.items() if vocab_size <= 1 << (8 * size))


def default_corpus(cache_dir: str, dtype: str) -> Path:
    """Where the byte-level standard-library corpus is cached (built by launcher/train/data.py on first use)."""
    version = f"{sys.version_info.major}{sys.version_info.minor}"
    return Path(cache_dir).expanduser() / f"stdlib-py{version}-bytes-{dtype}.bin"


def samples(tokens: int, seq_len: int) -> int:
    """Windows of ``seq_len + 1`` tokens (inputs and targets shifted by one) that ``tokens`` tokens hold."""
    return max(0, (tokens - 1) // seq_len)


def val_tokens(tokens: int, val_fraction: float) -> int:
    """The tokens of the val split: the last ``val_fraction`` of the data."""
    return int(tokens * val_fraction)


class DatasetError(ValueError):
    """A dataset directory or token file that cannot be trained on; the message is one line."""


def read_metadata(directory: Path) -> Dict[str, Any]:
    """A dataset directory's metadata, checked for the fields readers rely on."""
    path = directory / METADATA
    if not path.is_file():
        raise DatasetError(f"{directory} is a directory without {METADATA} (make a dataset with "
                           "'launcher data prepare OUT INPUT...', or point data.path at a token file)")
    try:
        meta = json.loads(path.read_text())
        dtype, shards, tokenizer = meta["dtype"], meta["shards"], meta["tokenizer"]
        if dtype not in TOKEN_DTYPES or not isinstance(tokenizer["vocab_size"], int) or not all(
                isinstance(s["file"], str) and "/" not in s["file"] and isinstance(s["tokens"], int) for s in shards):
            raise ValueError("a field has a wrong value")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DatasetError(f"{path} is damaged ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                           "prepare the dataset again") from None
    return meta


def shard_files(path: Path) -> List[Path]:
    """The token files of ``data.path`` in order: a dataset directory's shards, or the file itself."""
    if path.is_dir():
        return [path / s["file"] for s in read_metadata(path)["shards"]]
    return [path]


def tokenizer_of(path: Optional[Path]) -> Dict[str, Any]:
    """The tokenizer record of ``data.path`` (byte-level for the default corpus and single token files)."""
    if path is not None and path.is_dir():
        return read_metadata(path)["tokenizer"]
    return {"kind": "byte", "file": None, "sha256": None, "vocab_size": BYTE_VOCAB}
