"""The inputs of ``launcher data prepare``: text files, JSON-lines and Parquet files, or directories of them,
streamed as documents so a corpus larger than memory is read a piece at a time.

Every input is opened and checked (exists, is not empty, Parquet footer readable, the text field present)
before anything is written, so a bad input is a one-line error and leaves no output. Directories are
searched recursively and read in sorted order: the same inputs always give the same tokens.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from launcher.errors import LaunchError

# A format's file name endings (how ``auto`` recognises it, and what directories are searched for).
FORMATS: Dict[str, Tuple[str, ...]] = {"text": (".txt", ".md"), "jsonl": (".jsonl", ".json"),
                                       "parquet": (".parquet",)}
AUTO = "auto"
TEXT_BLOCK = 1 << 16  # a text file is read in pieces of about this many bytes, cut at line ends
PARQUET_BATCH = 1024  # rows per Parquet record batch


@dataclass(frozen=True)
class Source:
    path: Path
    format: str
    size: int  # bytes: what the progress counts

    def to_dict(self) -> Dict[str, object]:
        return {"path": str(self.path), "format": self.format, "bytes": self.size}


@dataclass(frozen=True)
class Skipped:
    """Files of an input directory that no format's ending names, passed over (``--glob`` takes them)."""

    folder: Path
    files: int
    examples: Tuple[str, ...]  # the first few names

    def line(self) -> str:
        more = ", ..." if self.files > len(self.examples) else ""
        return (f"skipped {self.files} file{'s' * (self.files != 1)} in {self.folder} that no format's ending names "
                f"({', '.join(self.examples)}{more}); to read them too, give --glob '*' (read as text unless named "
                "otherwise)")


def find_sources(inputs: List[Path], fmt: str, pattern: Optional[str], field: str) -> Tuple[List[Source],
                                                                                                List[Skipped]]:
    """Every input file, checked, and the non-empty files of each input directory passed over for their names;
    LaunchError for a missing or empty input or one that cannot be read."""
    found: List[Source] = []
    skipped: List[Skipped] = []
    for given in inputs:
        path = given.expanduser()
        if path.is_dir():
            # Empty files inside a directory (a package's __init__.py, say) hold no text: skipped.
            present = sorted(p for p in path.rglob("*") if p.is_file() and p.stat().st_size)
            files = [p for p in present if _wanted(p, fmt, pattern)]
            passed = [p.relative_to(path).as_posix() for p in present if not _wanted(p, fmt, pattern)]
            if passed and files and pattern is None:
                skipped.append(Skipped(given, len(passed), tuple(passed[:3])))
            if not files:
                searched = pattern or " ".join(f"*{e}" for f in _formats(fmt) for e in FORMATS[f])
                raise LaunchError(f"input {given} is a directory without non-empty input files (searched for "
                                  f"{searched}; choose with --glob or --format)")
        elif path.is_file():
            files = [path]
        else:
            raise LaunchError(f"input {given} does not exist")
        found.extend(_checked(file, fmt, field) for file in files)
    return found, skipped


def _formats(fmt: str) -> List[str]:
    return list(FORMATS) if fmt == AUTO else [fmt]


def _wanted(path: Path, fmt: str, pattern: Optional[str]) -> bool:
    if pattern is not None:
        return path.match(pattern)
    return any(path.name.endswith(end) for f in _formats(fmt) for end in FORMATS[f])


def format_of(path: Path, fmt: str) -> str:
    """``fmt``, or for ``auto`` the format the file name says (text when it says nothing known)."""
    if fmt != AUTO:
        return fmt
    return next((f for f, ends in FORMATS.items() if path.name.endswith(ends)), "text")


def _checked(path: Path, fmt: str, field: str) -> Source:
    size = path.stat().st_size
    if size == 0:
        raise LaunchError(f"input {path} is empty")
    source = Source(path=path, format=format_of(path, fmt), size=size)
    if source.format == "parquet":
        columns = _parquet(path).schema_arrow.names
        if field not in columns:
            raise LaunchError(f"input {path} has no '{field}' column (columns: {', '.join(columns)}); "
                              "choose one with --field")
    return source


def _parquet(path: Path):
    import pyarrow  # lazy: keeps numpy, pyarrow out of start-up
    import pyarrow.parquet as pq  # lazy: keeps numpy, pyarrow out of start-up

    try:
        return pq.ParquetFile(path)
    except (pyarrow.ArrowException, OSError) as err:
        raise LaunchError(f"input {path} is not a readable Parquet file ({_first_line(err)})") from None


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0][:200] if lines else type(err).__name__


def documents(source: Source, field: str, on_bytes: Callable[[int], None]) -> Iterator[Tuple[str, bool]]:
    """The texts of one input, a piece at a time, each with whether it ends a document (a JSON line, a
    Parquet row, a whole text file); ``on_bytes`` hears how much of the file has been read. LaunchError
    for a damaged record."""
    reader = {"text": _text, "jsonl": _jsonl, "parquet": _parquet_rows}[source.format]
    yield from reader(source.path, field, on_bytes)


def _text(path: Path, field: str, on_bytes: Callable[[int], None]) -> Iterator[Tuple[str, bool]]:
    with open(path, "rb") as f:
        block = f.read(TEXT_BLOCK)
        while block:
            block += f.readline()  # end the piece at a line end, so no word is cut in two
            on_bytes(len(block))
            following = f.read(TEXT_BLOCK)
            yield block.decode("utf-8", errors="surrogateescape"), not following  # bytes kept: tokenizer.py
            block = following


def _jsonl(path: Path, field: str, on_bytes: Callable[[int], None]) -> Iterator[Tuple[str, bool]]:
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            on_bytes(len(line))
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                raise LaunchError(f"input {path} line {number} is not JSON") from None
            text = record.get(field) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise LaunchError(f"input {path} line {number} has no string '{field}' field; choose one with --field")
            yield text, True


def _parquet_rows(path: Path, field: str, on_bytes: Callable[[int], None]) -> Iterator[Tuple[str, bool]]:
    import pyarrow  # lazy: keeps numpy, pyarrow out of start-up

    parquet = _parquet(path)
    per_row = path.stat().st_size / max(1, parquet.metadata.num_rows)
    try:
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH, columns=[field]):
            on_bytes(int(batch.num_rows * per_row))
            for text in batch.column(0).to_pylist():
                if text is not None:
                    if not isinstance(text, str):
                        raise LaunchError(f"input {path}: column '{field}' holds {type(text).__name__}, not text")
                    yield text, True
    except (pyarrow.ArrowException, OSError) as err:
        raise LaunchError(f"input {path} is not a readable Parquet file ({_first_line(err)})") from None
