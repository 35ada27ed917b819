"""``launcher data prepare``'s work: inputs -> tokenizer -> token shards + metadata, all or nothing.

Everything is written into a hidden temporary directory beside ``OUT`` and renamed to ``OUT`` only when
complete, so an error or an interrupt at any point leaves no partial dataset (and an ``--overwrite``d one
as it was). Memory stays bounded whatever the inputs' size: documents are read, encoded and written a
batch at a time, and a shard is closed at ``shard_tokens`` tokens.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Optional

from launcher.core.config import StoreConfig
from launcher.core.dataset import (METADATA, TOKEN_DTYPES, TOKENIZER_FILE, shard_name, shard_record, smallest_dtype,
                                   write_metadata)
from launcher.core.store import Location, Store, StoreError, is_remote, resolve
from launcher.dataset import tokenizer as tok
from launcher.dataset.progress import Progress
from launcher.dataset.sources import Skipped, Source, documents, find_sources
from launcher.errors import LaunchError

BATCH_CHARS = 1 << 20  # texts encoded together (the tokenizers package encodes a batch in parallel)


@dataclass(frozen=True)
class Request:
    """What the user asked for (``launcher data prepare --help`` explains each)."""

    out: Path | str  # a directory, or s3://BUCKET/PREFIX
    inputs: List[Path]
    tokenizer: str
    format: str
    field: str
    glob: Optional[str]
    dtype: Optional[str]
    shard_tokens: int
    overwrite: bool
    store: StoreConfig = field(default_factory=StoreConfig)  # where out is s3://...


@dataclass(frozen=True)
class Prepared:
    """A dataset made: its metadata (as metadata.json holds it) and the input files passed over for their names."""

    meta: Dict[str, Any]
    skipped: List[Skipped]


def prepare(req: Request) -> Prepared:
    """Make the dataset ``req`` describes. LaunchError (nothing written) on bad input."""
    if req.shard_tokens < 1:
        raise LaunchError(f"--shard-tokens must be a positive number of tokens, got {req.shard_tokens}")
    if is_remote(str(req.out)):
        return _prepare_remote(req)
    out = Path(req.out).expanduser().resolve()
    if out.exists() and not (req.overwrite and out.is_dir() and (out / METADATA).is_file()):
        hint = "; add --overwrite to replace it" if out.is_dir() and (out / METADATA).is_file() else ""
        raise LaunchError(f"output {req.out} already exists{hint}")
    tok.bpe_size(req.tokenizer)  # a bad bpe:N is refused before any input is read
    sources, skipped = find_sources(req.inputs, req.format, req.glob, req.field)
    codec = tok.from_spec(req.tokenizer, lambda: _texts(sources, req.field, f"training {req.tokenizer}"))
    dtype = _dtype(req, codec)
    tmp = out.with_name(f".{out.name}.tmp.{os.getpid()}")
    tmp.mkdir(parents=True)
    try:
        meta = _write(tmp, sources, codec, req, dtype)
        if meta["tokens"] == 0:
            raise LaunchError(f"the inputs hold no text ({', '.join(map(str, req.inputs))})")
        _install(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Prepared(meta, skipped)


def _prepare_remote(req: Request) -> Prepared:
    """The dataset made in a local temporary folder a shard at a time, each shard uploaded as soon as it is
    closed and then removed (memory and local disk bounded by one shard), the tokenizer next and metadata.json
    last, with each shard's ETag: the dataset exists in the bucket once its metadata does. An existing dataset
    there is refused unless ``overwrite``, which first removes its metadata (so no run reads it half-replaced)."""
    try:
        location = Location.parse(str(req.out))
        store = Store(resolve(req.store))
        exists = METADATA in store.listing(location)
    except (ValueError, StoreError) as err:
        raise LaunchError(str(err)) from None
    if exists and not req.overwrite:
        raise LaunchError(f"output {location.url()} already holds a dataset at {store.endpoint}; add --overwrite to "
                          "replace it")
    tok.bpe_size(req.tokenizer)
    sources, skipped = find_sources(req.inputs, req.format, req.glob, req.field)
    codec = tok.from_spec(req.tokenizer, lambda: _texts(sources, req.field, f"training {req.tokenizer}"))
    dtype = _dtype(req, codec)
    with tempfile.TemporaryDirectory(prefix="launcher-prepare-") as tmp:
        try:
            if exists:
                store.delete(location, METADATA)

            def upload(record: Dict[str, Any]) -> None:
                file = Path(tmp) / record["file"]
                record["etag"] = store.upload(location, record["file"], str(file))
                file.unlink()
            meta = _write(Path(tmp), sources, codec, req, dtype, upload)
            if meta["tokens"] == 0:
                raise LaunchError(f"the inputs hold no text ({', '.join(map(str, req.inputs))})")
            if meta["tokenizer"]["file"]:
                store.upload(location, TOKENIZER_FILE, str(Path(tmp) / TOKENIZER_FILE))
            store.upload(location, METADATA, str(Path(tmp) / METADATA))
        except StoreError as err:
            raise LaunchError(f"{err}; no dataset was made at {location.url()}") from None
    return Prepared(meta, skipped)


def _dtype(req: Request, codec: tok.Codec) -> str:
    dtype = req.dtype or smallest_dtype(codec.vocab_size)
    if codec.vocab_size > 1 << (8 * TOKEN_DTYPES[dtype]):
        raise LaunchError(f"--dtype {dtype} cannot hold a vocabulary of {codec.vocab_size:,}; use uint32")
    return dtype


def _texts(sources: List[Source], field: str, label: str) -> Iterator[str]:
    progress = Progress(label, sum(s.size for s in sources))
    for source in sources:
        for text, _end in documents(source, field, progress.add):
            yield text
    progress.done()


def _write(tmp: Path, sources: List[Source], codec: tok.Codec, req: Request, dtype: str,
           closed: Callable[[Dict[str, Any]], None] = lambda record: None) -> Dict[str, Any]:
    shards = Shards(tmp, dtype, req.shard_tokens, closed)
    progress = Progress(f"tokenizing with {codec.spec}", sum(s.size for s in sources))
    batch: List[str] = []
    ends: List[bool] = []
    chars = 0
    for source in sources:
        for text, end in documents(source, req.field, progress.add):
            batch.append(text)
            ends.append(end)
            chars += len(text)
            if chars >= BATCH_CHARS:
                shards.add(codec, batch, ends)
                batch, ends, chars = [], [], 0
    shards.add(codec, batch, ends)
    progress.done()
    return write_metadata(tmp, dtype, codec.save(tmp), shards.close(), [s.to_dict() for s in sources], req.field)


class Shards:
    """Token files of at most ``limit`` tokens each, filled in order, each recorded with its checksums and
    largest id once closed (launcher/core/dataset.py's ``shard_record``)."""

    def __init__(self, directory: Path, dtype: str, limit: int, closed: Callable[[Dict[str, Any]], None]):
        self.directory, self.dtype, self.limit, self.closed = directory, dtype, limit, closed
        self.done: List[Dict[str, Any]] = []
        self.file: Optional[BinaryIO] = None
        self.in_file = self.max_id = 0

    def add(self, codec: tok.Codec, texts: List[str], ends: List[bool]) -> None:
        import numpy as np  # lazy: keeps numpy out of start-up

        for ids, end in zip(codec.encode_batch(texts), ends):
            tokens = np.asarray(ids, dtype=self.dtype)
            if end and codec.eot is not None:
                tokens = np.append(tokens, np.asarray(codec.eot, dtype=self.dtype))
            while len(tokens):
                if self.file is None:
                    self.file = open(self.directory / shard_name(len(self.done)), "wb")
                take = tokens[: self.limit - self.in_file]
                self.file.write(take.tobytes())
                self.max_id = max(self.max_id, int(take.max()))
                self.in_file += len(take)
                tokens = tokens[len(take):]
                if self.in_file == self.limit:
                    self._finish()

    def _finish(self) -> None:
        assert self.file is not None
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        self.done.append(shard_record(Path(self.file.name), self.in_file, self.max_id))
        self.closed(self.done[-1])
        self.file, self.in_file, self.max_id = None, 0, 0

    def close(self) -> List[Dict[str, Any]]:
        if self.file is not None:
            self._finish()
        return self.done


def _install(tmp: Path, out: Path) -> None:
    """Put the finished dataset at ``out`` (replacing an older one only now that the new one is whole)."""
    old = out.with_name(f".{out.name}.old.{os.getpid()}")
    if out.exists():
        os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
