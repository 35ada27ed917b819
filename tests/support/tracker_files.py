"""Read back what the trackers wrote, with their own readers: TensorBoard's event accumulator, and W&B's
protobuf records from its offline ``.wandb`` files (W&B ships no Python reader of them any more; the file is
a LevelDB-style log: a 7-byte header, then 32 KiB blocks of records, each a 7-byte header and a chunk)."""
from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK, HEADER = 32 * 1024, 7
FULL, LAST = 1, 4


def tensorboard_scalars(logdir: Path) -> dict[str, dict[int, float]]:
    """Every scalar curve of a TensorBoard log directory as {tag: {step: value}}, as TensorBoard shows it;
    asserts that no step appears twice on a curve."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    curves = {}
    for tag in acc.Tags()["scalars"]:
        events = acc.Scalars(tag)
        steps = [e.step for e in events]
        assert len(steps) == len(set(steps)), f"{tag}: steps logged twice: {steps}"
        curves[tag] = {e.step: e.value for e in events}
    return curves


def wandb_records(path: Path):
    """The ``wandb_internal_pb2.Record`` messages of one offline ``run-ID.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if left < HEADER or (length == 0 and kind == 0):  # block trailer or padding
            pos += left
            continue
        pending += data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_attempts(wandb_dir: Path) -> list[dict]:
    """Each offline W&B run directory under ``wandb_dir`` (one per attempt), oldest first: its run id and
    its history as {step: {key: value}}."""
    attempts = []
    for run_file in sorted(wandb_dir.glob("offline-run-*/run-*.wandb")):
        ids, history = set(), {}
        for record in wandb_records(run_file):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.add(record.run.run_id)
            elif kind == "history":
                items = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item}
                history[record.history.step.num] = items
        attempts.append({"ids": ids, "history": history})
    return attempts
