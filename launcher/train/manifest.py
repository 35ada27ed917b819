"""What a checkpoint should contain, so that a damaged one is noticed before it is trusted.

DCP checks a checkpoint's framing, not its contents: a shard truncated by a full disk fails to load, but a
shard whose values were overwritten loads without complaint. So every rank, once its part of a save is on
disk, writes ``manifest_rank_<N>.json``: each file it wrote, its size and a CRC-32 of its bytes. Before a
checkpoint is resumed from, the ranks share the work of checking every file against the manifests
(:func:`damage`); any missing manifest, missing file, wrong size or wrong checksum is named.
"""
from __future__ import annotations

import json
import zlib
from pathlib import Path

from launcher.core.checkpoints import META

MANIFEST = "manifest_rank_{rank:05d}.json"
CHUNK = 8 << 20


def digest(path: Path) -> dict:
    """Size and CRC-32 of a file, read in chunks (the file is normally still in the page cache)."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return {"bytes": size, "crc32": crc}


def files_of_rank(directory: Path, rank: int, main: bool) -> list[str]:
    """The files one rank wrote into a checkpoint: its DCP shards (``__<rank>_<n>.distcp``) and RNG
    state, and for the main rank also DCP's ``.metadata`` and the checkpoint's ``meta.json``."""
    names = sorted(p.name for p in directory.glob(f"__{rank}_*.distcp"))
    names += sorted(p.name for p in directory.glob(f"rng_rank_{rank:05d}.pt"))
    if main:
        names += [name for name in (".metadata", "meta.json") if (directory / name).is_file()]
    return names


def manifest(directory: Path, rank: int, step: int, names: list[str]) -> tuple[str, bytes]:
    """The manifest of the files this rank wrote: its file name and contents (the caller writes it
    synced, with the rest of the checkpoint)."""
    files = {name: digest(directory / name) for name in names}
    body = json.dumps({"step": step, "rank": rank, "files": files}, indent=1, sort_keys=True).encode()
    return MANIFEST.format(rank=rank), body


def entries(directory: Path, world_size: int) -> tuple[list[tuple[str, dict]], list[str]]:
    """Every (file, expected digest) the manifests list, and the problems with the manifests themselves."""
    found, problems = [], []
    for rank in range(world_size):
        path = directory / MANIFEST.format(rank=rank)
        try:
            data = json.loads(path.read_text())
            found += sorted(data["files"].items())
        except FileNotFoundError:
            problems.append(f"{path.name} is missing (rank {rank} never finished its part of the save)")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            problems.append(f"{path.name} is unreadable ({type(err).__name__})")
    return found, problems


def check_file(directory: Path, name: str, expected: dict) -> str | None:
    """What is wrong with one file, in words, or None."""
    path = directory / name
    if not path.is_file():
        return f"{name} is missing"
    size = path.stat().st_size
    if size != expected.get("bytes"):
        return f"{name} has {size} bytes, expected {expected.get('bytes')} (truncated or overwritten)"
    if digest(path)["crc32"] != expected.get("crc32"):
        return f"{name} has the right size but a wrong checksum (its contents changed after the save)"
    return None


def damage(directory: Path, world_size: int, share: int = 0, shares: int = 1) -> list[str]:
    """The problems this rank finds, checking every ``shares``-th file from ``share`` on (the ranks split
    the reading); manifest problems are reported by share 0 only."""
    listed, problems = entries(directory, world_size)
    found = problems if share == 0 else []
    for index, (name, expected) in enumerate(listed):
        if index % shares == share:
            problem = check_file(directory, name, expected)
            if problem:
                found.append(problem)
    return found


def has_manifests(directory: Path) -> bool:
    """Whether the checkpoint in ``directory`` has its manifests (written last by every save)."""
    return any(directory.glob("manifest_rank_*.json"))


def checkpoint_problems(directory: Path) -> list[str]:
    """What is wrong with a complete checkpoint's files, checked whole in one process ([] when its manifests
    vouch for it): what ``launcher export`` and ``eval`` refuse a checkpoint for."""
    try:
        world = int(json.loads((directory / META).read_text())["world_size"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        return [f"{directory / META} is unreadable ({type(err).__name__})"]
    return damage(directory, world)
