"""Reading a run's records when they may be damaged: a disk that filled up, a hand edit, a copy cut short.

A damaged record must never hide its run nor break a listing of the others. Whole-file records (run.json,
plan.json, config.yaml) that cannot be read raise DamagedRun, which says which file and how; listings show
the run as DAMAGED with that reason, commands on it say it in one line. A damaged *line* of a JSON-lines
log (events, metrics) is skipped, so the rest of the log stays usable.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Iterable, Iterator, Set, Tuple


class DamagedRun(ValueError):
    """A run whose records cannot be read: which file, and how."""

    def __init__(self, run_dir: Path, file: str, how: str) -> None:
        super().__init__(f"run {Path(run_dir).name} is damaged: {Path(run_dir) / file} {how}")
        self.run_dir, self.file, self.how = Path(run_dir), file, how

    @property
    def reason(self) -> str:
        """The file and how it is damaged, for a listing (the message names the whole path)."""
        return f"{self.file} {self.how}"


def read_text(run_dir: Path, file: str) -> str:
    """The run's ``file`` as text; DamagedRun when it is missing, unreadable or empty."""
    try:
        with open(os.path.join(run_dir, file)) as f:  # not pathlib: a listing reads thousands of these
            text = f.read()
    except FileNotFoundError:
        raise DamagedRun(run_dir, file, "is missing") from None
    except (OSError, UnicodeDecodeError) as err:
        raise DamagedRun(run_dir, file, f"cannot be read ({getattr(err, 'strerror', None) or err})") from None
    if not text.strip():
        raise DamagedRun(run_dir, file, "is empty")
    return text


def read_json_object(run_dir: Path, file: str) -> dict:
    """The JSON object in the run's ``file``; DamagedRun saying how it is missing, unreadable or not one."""
    text = read_text(run_dir, file)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise DamagedRun(run_dir, file, f"is not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") \
            from None
    if not isinstance(data, dict):
        raise DamagedRun(run_dir, file, f"holds a JSON {type(data).__name__}, not an object")
    return data


def read_yaml_mapping(run_dir: Path, file: str) -> dict:
    """The YAML mapping in the run's ``file`` (read with libyaml where it is built in: listings check every
    run's config, and must not pay for OmegaConf); DamagedRun saying how it is damaged."""
    import yaml  # lazy: keeps yaml out of start-up

    text = read_text(run_dir, file)
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise DamagedRun(run_dir, file, f"is not valid YAML ({getattr(err, 'problem', None) or 'syntax'}{at})") \
            from None
    if not isinstance(data, dict):
        raise DamagedRun(run_dir, file, f"holds a YAML {type(data).__name__}, not a mapping")
    return data


def read_jsonl(path: Path) -> Iterator[dict]:
    """The JSON objects of a JSON-lines file. A damaged line (garbage, or valid JSON that is not an object) is
    skipped with a warning (:func:`warn_damaged`), so the rest of the file stays usable; a last line without its
    newline is one being written, skipped without a word; a missing file has none."""
    for _, record in numbered_jsonl(path):
        yield record


def numbered_jsonl(path: Path) -> Iterator[Tuple[int, dict]]:
    """:func:`read_jsonl` with each object's line number."""
    try:
        with open(path, errors="replace") as f:
            yield from numbered_lines(f, path)
    except FileNotFoundError:
        return


def numbered_lines(lines: Iterable[str], path: Path) -> Iterator[Tuple[int, dict]]:
    """:func:`numbered_jsonl` of a file already open (one opened without following a symlink), ``path`` naming it
    in the warnings."""
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if line.endswith("\n"):
                warn_damaged(path, number, "is not valid JSON")
            continue
        if isinstance(record, dict):
            yield number, record
        else:
            warn_damaged(path, number, f"holds a JSON {type(record).__name__}, not an object")


_WARNED: Set[str] = set()


def warn_damaged(path: Path, number: int, how: str) -> None:
    """Say on stderr, once per file per command (a job's step is one too), that a line of it is damaged and
    skipped: the reader goes on with the rest, and the user learns why a step or an event is missing."""
    if str(path) not in _WARNED:
        _WARNED.add(str(path))
        print(f"warning: {path} line {number} {how}; skipped, the rest is read", file=sys.stderr)


def forget_warnings() -> None:
    """Start a new command (the CLI run in one process, as tests and a console do): each file warns again."""
    _WARNED.clear()

