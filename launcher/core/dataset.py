"""What a token dataset is on disk: the one home of its layout and of its checks, read by the launcher (data
prepare writes it, launch checks it, sample decodes with its tokenizer) and by training (an attempt checks it
at its start, launcher/train/data.py reads its shards).

``data.path`` names either a dataset directory made by ``launcher data prepare``::

    metadata.json          tokenizer (kind, file, sha256, vocabulary size), dtype, token count, shards, sources
    tokenizer.json         the Hugging Face tokenizer that made the shards (absent for byte-level)
    tokens_00000.bin ...   token ids back to back, little-endian ``dtype``

or a single token file (nanoGPT's ``train.bin``: no metadata, so its dtype is ``data.dtype`` and its
tokenizer is taken to be byte-level). Without ``data.path`` training uses the byte-level corpus of
Python's standard library, a dataset directory like any other, built under ``data.cache_dir`` on first use.

Each shard's metadata records its tokens, bytes, a CRC-32 of the whole file and one of sampled blocks, and its
largest token id, so that a shard cut short, grown, written over or holding ids the model has no embedding
for is named before a step is trained on it (:func:`verify`), not found as numpy's or torch's error later or
never. CRC-32 (zlib) because it is the fastest checksum of the standard library and this package's
dependencies: 2.1 GB/s on the project's 2-core test machine, against 1.1 for sha1 and sha256, 0.6 for blake2b
and 0.5 for md5. A checker reads its shards whole up to FULL_CHECK_BYTES (there: 2.4 GB/s from the page cache,
0.42 s per GB, so at most 0.11 s) and beyond that samples 1 MiB of each (5 ms per GB of 128 MiB shards), so a
start never costs more than a fraction of a second per GB (docs/performance.md). This module stays free of
numpy and torch (zlib is the standard library's), so that checking a dataset costs a launch only ``stat``
calls and those reads.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from launcher.core.events import Fault
from launcher.core.config import DataConfig
from launcher.core.safepath import check_tree
from launcher.core.store import Location, Store, StoreError, is_remote

# Token ids are stored as unsigned integers of this many bytes.
TOKEN_DTYPES = {"uint16": 2, "uint32": 4}
METADATA = "metadata.json"
TOKENIZER_FILE = "tokenizer.json"
FORMAT = "slurm-gpt-launcher tokens v1"
BYTE_VOCAB = 256  # the byte-level tokenizer: one token per byte
END_OF_TEXT = "<|endoftext|>"  # bpe:N's one special token, between documents (launcher/dataset/tokenizer.py)
BYTE_TOKENIZER = {"kind": "byte", "spec": "byte", "vocab_size": BYTE_VOCAB, "file": None, "sha256": None,
                  "end_of_text": None}
PREPARE_HINT = "make one with 'launcher data prepare OUT INPUT...'"

# What a shard's record holds beyond its file and tokens, every one an integer.
CHECKED = ("bytes", "crc32", "sample_crc32", "max_id")
SAMPLE_BLOCKS, SAMPLE_BLOCK = 16, 64 << 10  # a sampled checksum reads 1 MiB of a shard, from its first byte to its last
FULL_CHECK_BYTES = 256 << 20  # a checker reads its shards whole up to this many bytes (0.11 s measured)
READ_CHUNK = 8 << 20


def shard_name(index: int) -> str:
    return f"tokens_{index:05d}.bin"


def smallest_dtype(vocab_size: int) -> str:
    """The narrowest token dtype that holds every id of a vocabulary."""
    return next(name for name, size in TOKEN_DTYPES.items() if vocab_size <= 1 << (8 * size))


def default_corpus(cache_dir: str, dtype: str) -> Path:
    """The dataset directory of the byte-level standard-library corpus (built by launcher/train/data.py on first
    use)."""
    version = f"{sys.version_info.major}{sys.version_info.minor}"
    return Path(cache_dir).expanduser() / f"stdlib-py{version}-bytes-{dtype}"


def check_cache(data: DataConfig) -> None:
    """UnsafePath, in one line, when another user could change what ``data.cache_dir`` leads to (a folder of
    theirs, or one they may write, on its way: launcher/core/safepath.py): the default corpus is built there and
    trained on, and its lock file opened there."""
    check_tree(Path(data.cache_dir).expanduser(), "data.cache_dir", "set data.cache_dir to a folder of your own")


def samples(tokens: int, seq_len: int) -> int:
    """Windows of ``seq_len + 1`` tokens (inputs and targets shifted by one) that ``tokens`` tokens hold."""
    return max(0, (tokens - 1) // seq_len)


def val_tokens(tokens: int, val_fraction: float) -> int:
    """The tokens of the val split: the last ``val_fraction`` of the data."""
    return int(tokens * val_fraction)


class DatasetError(ValueError):
    """A dataset directory or token file that cannot be trained on; the message is one line, naming the file.
    Raised in a task, it is the data's fault: the same on every node and every try (``short`` is what
    ``launcher runs`` shows beside FAILED)."""

    short = "bad data"
    fault = Fault.DATA


def read_metadata(directory: Path) -> Dict[str, Any]:
    """A dataset directory's metadata, checked for the fields readers rely on."""
    path = directory / METADATA
    if not path.is_file():
        raise DatasetError(f"{directory} is a directory without {METADATA} (make a dataset with "
                           "'launcher data prepare OUT INPUT...', or point data.path at a token file)")
    try:
        text = path.read_text()
    except OSError as err:
        raise DatasetError(f"{path} cannot be read ({err.strerror}); prepare the dataset again") from None
    return parse_metadata(text, str(path))


# A bucket's metadata as an attempt's first rank read it and handed it to the others (launcher/train/preflight.py),
# by URL: the ranks of a task read it once, not once per rank per use. Only a task fills it (a long-lived process
# that checks datasets, such as the console, reads the store each time).
READ_METADATA: Dict[str, Dict[str, Any]] = {}


def remote_metadata(store: Store, location: Location) -> Dict[str, Any]:
    """A bucket's dataset's metadata (``s3://BUCKET/PREFIX/metadata.json``), checked as :func:`read_metadata`
    checks a directory's; StoreError when the store does not serve it; READ_METADATA's where a task has it."""
    if location.url() in READ_METADATA:
        return READ_METADATA[location.url()]
    try:
        text = store.read(location, METADATA).decode("utf-8", errors="replace")
    except StoreError as err:
        if err.missing == "bucket":
            raise DatasetError(f"data.path={location.url()}: there is no bucket {location.bucket} at "
                               f"{store.endpoint} (or your credentials may not see it)") from None
        if err.missing:
            raise DatasetError(f"data.path={location.url()} has no {METADATA} at {store.endpoint} (make a dataset "
                               f"there with 'launcher data prepare {location.url()} INPUT...')") from None
        raise
    return parse_metadata(text, location.url(METADATA))


def described(data: DataConfig) -> Optional[Tuple[Dict[str, Any], Path]]:
    """A dataset's metadata and the local folder its tokenizer file is in (what sample, eval and export read), or
    None for data with no metadata (a single token file, the default corpus not built yet). A bucket's tokenizer
    is fetched once into ``data.cache_dir`` (``tokenizers/<sha256>/``), checked against the metadata's hash."""
    if is_remote(data.path):
        store, location = Store(data.store), Location.parse(str(data.path))
        meta = remote_metadata(store, location)
        record = meta["tokenizer"]
        folder = Path(data.cache_dir).expanduser() / "tokenizers" / str(record.get("sha256"))
        if record.get("file") and not (folder / record["file"]).is_file():
            check_cache(data)
            body = store.read(location, record["file"])
            if hashlib.sha256(body).hexdigest() != record.get("sha256"):
                raise DatasetError(f"{location.url(record['file'])} is not the tokenizer the data was made with (its "
                                   f"sha256 differs from {METADATA}'s); prepare or upload the dataset again")
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{record['file']}.{os.getpid()}"
            tmp.write_bytes(body)
            os.replace(tmp, folder / record["file"])
        return meta, folder
    path = data_path(data)
    return (read_metadata(path), path) if path.is_dir() else None


def dataset_fingerprint(meta: Dict[str, Any]) -> int:
    """A 32-bit number that changes with any shard of the dataset (from the checksums its metadata records): a
    streamed dataset's cache folder and sample order are keyed by it."""
    return zlib.crc32(json.dumps([meta["dtype"], [[s["file"], s["bytes"], s["crc32"]] for s in meta["shards"]]])
                      .encode())


def parse_metadata(text: str, where: str) -> Dict[str, Any]:
    """metadata.json's text (read from ``where``), checked for the fields readers rely on."""
    try:
        meta = json.loads(text)
        dtype, shards, tokenizer = meta["dtype"], meta["shards"], meta["tokenizer"]
        if dtype not in TOKEN_DTYPES or not isinstance(tokenizer["vocab_size"], int) or not all(
                isinstance(s["file"], str) and "/" not in s["file"] and isinstance(s["tokens"], int)
                and _checked_fields(s) for s in shards):
            raise ValueError("a field has a wrong value")
    except (ValueError, KeyError, TypeError) as err:
        first = str(err).splitlines()[0] if str(err) else ""
        raise DatasetError(f"{where} is damaged ({type(err).__name__}: {first}); prepare the dataset again") from None
    return meta


def _checked_fields(shard: Dict[str, Any]) -> bool:
    """A shard record has all of CHECKED, integers."""
    return all(type(shard.get(key)) is int for key in CHECKED)


def shard_files(path: Path) -> List[Path]:
    """The token files of ``data.path`` in order: a dataset directory's shards, or the file itself."""
    if path.is_dir():
        return [path / s["file"] for s in read_metadata(path)["shards"]]
    return [path]


def file_label(path: Path, file: Path) -> str:
    """How messages name one token file of ``data.path`` (``path``): by its full path, which a rank's record
    keeps whatever the directory it ran in."""
    return f"data.path={file}" if file == path else f"shard {file}"


# ----------------------------------------------------------------------------------------------
# Writing: what data prepare and the default corpus record of each shard


# What this process has summed already, by the file's identity and version: a sweep's runs (and a test process's
# many compositions) check the same unchanged shards once. Any write changes mtime and ctime (which no one sets).
_SUMMED: Dict[tuple, int] = {}


def crc32(path: Path, ranges: List[Tuple[int, int]]) -> int:
    """CRC-32 of the byte ``ranges`` (offset, length) of a file, in order."""
    info = os.stat(path)
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, tuple(ranges))
    if key not in _SUMMED:
        _SUMMED[key] = _crc32(path, ranges)
    return _SUMMED[key]


def _crc32(path: Path, ranges: List[Tuple[int, int]]) -> int:
    crc = 0
    with open(path, "rb") as f:
        for offset, length in ranges:
            f.seek(offset)
            while length > 0:
                chunk = f.read(min(length, READ_CHUNK))
                if not chunk:
                    break
                crc = zlib.crc32(chunk, crc)
                length -= len(chunk)
    return crc


def sample_ranges(size: int) -> List[Tuple[int, int]]:
    """The blocks of a shard of ``size`` bytes that a sampled checksum reads: SAMPLE_BLOCKS of SAMPLE_BLOCK bytes
    spread evenly from the first byte to the last, or the whole shard when it is no larger."""
    if size <= SAMPLE_BLOCKS * SAMPLE_BLOCK:
        return [(0, size)]
    stride = (size - SAMPLE_BLOCK) / (SAMPLE_BLOCKS - 1)
    return [(round(i * stride), SAMPLE_BLOCK) for i in range(SAMPLE_BLOCKS)]


def shard_record(path: Path, tokens: int, max_id: int) -> Dict[str, Any]:
    """A finished shard's entry in metadata.json: what :func:`verify` holds it to."""
    size = path.stat().st_size
    return {"file": path.name, "tokens": tokens, "bytes": size, "crc32": crc32(path, [(0, size)]),
            "sample_crc32": crc32(path, sample_ranges(size)), "max_id": max_id}


def write_metadata(directory: Path, dtype: str, tokenizer: Dict[str, Any], shards: List[Dict[str, Any]],
                   sources: List[Dict[str, Any]], field: Optional[str]) -> Dict[str, Any]:
    """Write a dataset's metadata.json once its shards are on disk (last: only a whole dataset has one); returns
    it."""
    meta = {"format": FORMAT, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "dtype": dtype,
            "tokens": sum(s["tokens"] for s in shards), "tokenizer": tokenizer, "shards": shards,
            "sources": sources, "field": field}
    with open(directory / METADATA, "w") as f:
        f.write(json.dumps(meta, indent=1) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return meta


# ----------------------------------------------------------------------------------------------
# Checking: at launch (launcher/dataset/check.py) and at every attempt's start (launcher/train/preflight.py)


@dataclass(frozen=True)
class Checked:
    """What checking ``data.path`` found."""

    tokens: int
    tokenizer: Dict[str, Any]
    shard_bytes: Tuple[int, ...] = ()
    meta: Optional[Dict[str, Any]] = None  # a bucket's metadata, as read


def data_path(data: DataConfig) -> Path:
    """Where a run's data is: ``data.path``, or the default corpus."""
    return Path(data.path).expanduser() if data.path is not None else default_corpus(data.cache_dir, data.dtype)


def verify(data: DataConfig, vocab_size: int, share: int = 0, shares: int = 1,
           store: Optional[Store] = None) -> Checked:
    """The run's data as training will read it, or DatasetError naming the first thing wrong.

    Every checker checks the layout, the dtype, the vocabulary and every shard's size (a ``stat`` each); the
    checksums are split among ``shares`` checkers (the ranks of an attempt), this one taking every
    ``shares``-th shard from ``share`` on, read whole when they hold at most FULL_CHECK_BYTES, else sampled. A
    dataset in a bucket is checked through ``store`` (default: one of ``data.store``): its metadata by every
    checker, its shards' sizes and ETags by the first."""
    if is_remote(data.path):
        return _verify_remote(data, vocab_size, store or Store(data.store), listed=share == 0)
    path = data_path(data)
    if not path.exists():
        raise DatasetError(f"data.path={path} does not exist; {PREPARE_HINT}")
    if path.is_dir():
        return _verify_dataset(path, data, vocab_size, share, shares)
    if not path.is_file():
        raise DatasetError(f"data.path={path} is neither a file nor a dataset directory")
    check_vocab(BYTE_TOKENIZER, vocab_size)
    size, itemsize = path.stat().st_size, TOKEN_DTYPES[data.dtype]
    if size == 0:
        raise DatasetError(f"{file_label(path, path)} is empty (0 bytes); {PREPARE_HINT}")
    if size % itemsize:
        raise DatasetError(f"{file_label(path, path)} has {size:,} bytes, not a whole number of {data.dtype} tokens "
                           f"({itemsize} bytes each): truncated, or another dtype (data.dtype)")
    return Checked(size // itemsize, dict(BYTE_TOKENIZER))


def _size(file: Path) -> Optional[Tuple[int, str]]:
    return (file.stat().st_size, "") if file.is_file() else None


def check_vocab(tokenizer: Dict[str, Any], vocab_size: int) -> None:
    """The model must have an embedding for every token of the data's tokenizer."""
    if vocab_size < tokenizer["vocab_size"]:
        raise DatasetError(f"model.vocab_size={vocab_size} is smaller than the vocabulary of data.path's tokenizer "
                           f"({tokenizer['vocab_size']}); set model.vocab_size={tokenizer['vocab_size']} or more")


def _check_meta(meta: Dict[str, Any], source: str, data: DataConfig, vocab_size: int,
                sizes: Dict[str, Optional[Tuple[int, str]]], again: str) -> int:
    """A dataset's tokens, or DatasetError for the first thing its metadata and its shards' ``sizes`` (each
    shard's size and ETag, None where it is missing) say is wrong."""
    if meta["dtype"] != data.dtype:
        raise DatasetError(f"data.dtype={data.dtype} does not match data.path={source}, whose tokens are "
                           f"{meta['dtype']} (its {METADATA}); set data.dtype={meta['dtype']}")
    check_vocab(meta["tokenizer"], vocab_size)
    for shard in meta["shards"]:
        where, found = sizes_label(source, shard["file"]), sizes[shard["file"]]
        if found is None:
            raise DatasetError(f"{where} is missing; {again}")
        expected, etag = shard["bytes"], shard.get("etag")
        if found[0] != expected:
            raise DatasetError(f"{where} has {found[0]:,} bytes, not the {expected:,} ({shard['tokens']:,} tokens) "
                               f"that {METADATA} records: cut short, grown or replaced; {again}")
        if etag and found[1] and found[1] != etag:
            raise DatasetError(f"{where} has changed since it was prepared (its ETag is {found[1]}, not the {etag} "
                               f"that {METADATA} records); {again}")
        if shard["max_id"] >= vocab_size:
            raise DatasetError(f"{where} holds token ids up to {shard['max_id']:,}, not below "
                               f"model.vocab_size={vocab_size:,}; set model.vocab_size={shard['max_id'] + 1} or more")
    tokens = sum(s["tokens"] for s in meta["shards"])
    if tokens == 0:
        raise DatasetError(f"data.path={source} holds no tokens; prepare it again from non-empty inputs")
    return tokens


def sizes_label(source: str, name: str) -> str:
    """How messages name a shard of the dataset at ``source`` (a directory, or an ``s3://`` URL)."""
    return f"shard {source.rstrip('/')}/{name}"


def _verify_remote(data: DataConfig, vocab_size: int, store: Store, listed: bool) -> Checked:
    """A bucket's dataset: its metadata, and (``listed``) every shard's size and ETag from a listing (one request
    per 1,000 objects). The shards' checksums are checked as each node downloads them
    (launcher/train/shard_cache.py)."""
    try:
        location = Location.parse(str(data.path))
    except ValueError as err:
        raise DatasetError(f"data.path: {err}") from None
    meta = remote_metadata(store, location)
    listing = store.listing(location) if listed else {}
    sizes = {s["file"]: listing.get(s["file"]) if listed else (s["bytes"], "") for s in meta["shards"]}
    tokens = _check_meta(meta, location.url(), data, vocab_size, sizes, "prepare or upload the dataset again")
    return Checked(tokens, meta["tokenizer"], tuple(s["bytes"] for s in meta["shards"]), meta)


def _verify_dataset(directory: Path, data: DataConfig, vocab_size: int, share: int, shares: int) -> Checked:
    meta = read_metadata(directory)
    # The default corpus is the launcher's to rebuild; a dataset, the user's to prepare again.
    again = f"delete {directory} to have it built again" if data.path is None else "prepare the dataset again"
    shards = meta["shards"]
    sizes = {s["file"]: _size(directory / s["file"]) for s in shards}
    tokens = _check_meta(meta, str(directory), data, vocab_size, sizes, again)
    mine = [s for index, s in enumerate(shards) if index % shares == share]
    whole = sum(s["bytes"] for s in mine) <= FULL_CHECK_BYTES
    for shard in mine:
        file = directory / shard["file"]
        ranges = [(0, shard["bytes"])] if whole else sample_ranges(shard["bytes"])
        if crc32(file, ranges) != shard["crc32" if whole else "sample_crc32"]:
            raise DatasetError(f"{file_label(directory, file)} has changed since it was written: its size is right "
                               f"but its CRC-32 {'' if whole else 'of sampled blocks '}is not the one {METADATA} "
                               f"records; {again}")
    return Checked(tokens, meta["tokenizer"])
