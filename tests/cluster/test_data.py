"""Your own data, end to end on the local cluster: text -> a bpe:4096 tokenizer and shards -> gpt_small on
4 ranks (2 nodes x 2) trains on them and its loss falls -> ``launcher sample`` prints text decoded with that
tokenizer. A model whose vocabulary is smaller than the tokenizer's is refused at launch. Data damaged after
the launch checked it fails the attempt in one line naming the file, as the data's fault: one attempt, not
retried, whether found at the attempt's start or as training reads it."""
from __future__ import annotations

import json
import re
import sysconfig
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from support.helpers import UNTIL_STOPPED, events, job_id_of, record, runs_json, wait_for

STDLIB = Path(sysconfig.get_paths()["stdlib"])
STEPS = 30


def test_bpe_data_trains_gpt_small_and_sample_decodes_with_its_tokenizer(slurm, tmp_path):
    data, root = tmp_path / "data", tmp_path / "runs"
    prep = slurm.launcher("data", "prepare", str(data), str(STDLIB / "email"), str(STDLIB / "json"), "--glob", "*.py",
                          "--tokenizer", "bpe:4096", root=root)
    assert prep.returncode == 0, prep.stderr
    meta = json.loads((data / "metadata.json").read_text())
    assert meta["tokenizer"]["vocab_size"] == 4096 and meta["tokens"] > 50_000

    small = slurm.launcher("gpus=4", "model=gpt_small", f"data.path={data}", "name=small-vocab", root=root)
    assert small.returncode == 2 and small.stdout == ""
    assert small.stderr == ("error: model.vocab_size=256 is smaller than the vocabulary of data.path's tokenizer "
                            "(4096); set model.vocab_size=4096 or more\n")
    assert not (root / "small-vocab").exists()

    res = slurm.launcher("gpus=4", "model=gpt_small", f"data.path={data}", "model.vocab_size=4096",
                         f"train.steps={STEPS}", "train.log_every=5", "train.warmup_steps=5", "train.eval_every=0",
                         f"train.checkpoint_every={STEPS}", "name=bpe", root=root)
    assert res.returncode == 0, res.stderr
    assert slurm.wait(job_id_of(res.stdout), timeout=300) == "COMPLETED"
    logged = [json.loads(line) for line in (root / "bpe" / "metrics.jsonl").read_text().splitlines()][:-1]
    assert [r["step"] for r in logged] == list(range(5, STEPS + 1, 5))
    assert logged[0]["loss"] > 7.0  # about ln 4096 = 8.3 at the start: the 4096-token vocabulary is in use
    assert logged[-1]["loss"] < logged[0]["loss"] - 1.0, [r["loss"] for r in logged]

    out = slurm.launcher("sample", "bpe", "--prompt", "def ", "--tokens", "40", root=root, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"# bpe, step {STEPS}, bpe:4096 tokenizer, on cpu" in out.stderr
    assert out.stdout.startswith("def ") and out.stdout.endswith("\n")
    continuation = out.stdout[len("def "):-1]
    ids = Tokenizer.from_file(str(data / "tokenizer.json")).encode(continuation).ids
    # Decoded with the BPE, the text is made of its multi-byte tokens (byte-level decoding would drop every
    # id above 255 and leave stray bytes).
    assert continuation.strip() and all(ch.isprintable() or ch in "\n\t" for ch in continuation)
    assert len(continuation) > len(ids) and max(ids) >= 256


def _byte_dataset(slurm, data: Path, root: Path) -> list[dict]:
    """The json package's sources as byte tokens in shards of 20,000 (40,000 bytes); the shards' records."""
    prep = slurm.launcher("data", "prepare", str(data), str(STDLIB / "json"), "--glob", "*.py", "--shard-tokens",
                          "20000", root=root)
    assert prep.returncode == 0, prep.stderr
    return json.loads((data / "metadata.json").read_text())["shards"]


def _the_verdict(slurm, root: Path, name: str, job: str) -> tuple[dict, dict]:
    """The run's one attempt's end and its final verdict, once its job has FAILED (with the record if not)."""
    run_dir = root / name
    assert slurm.wait(job, timeout=240) == "FAILED", record(run_dir)
    final = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "failed" and e.get("final")], 30,
                     "verdict")[0]
    kinds = [e["event"] for e in events(run_dir)]
    assert kinds.count("attempt") == 1 and kinds.count("attempt_ended") == 1 and "retrying" not in kinds, kinds
    ended = next(e for e in events(run_dir) if e["event"] == "attempt_ended")
    assert (ended["outcome"], ended["short"], final["short"]) == ("FAILED", "bad data", "bad data"), ended
    assert final["error"] == ended["cause"] and "not retried" in final["reason"], final
    row = runs_json(slurm, root)[name]
    assert (row["status"], row["reason"]) == ("FAILED", "bad data"), row
    return ended, final


# What is done to shard 1 (rank 1's to checksum, of 3 shards on 2 ranks) while the job is held, and what the
# attempt's start says of it.
DAMAGE = {
    "cut": (lambda f, size: f.truncate(size // 2),
            "has 20,000 bytes, not the 40,000 (20,000 tokens) that metadata.json records: cut short, grown or "
            "replaced; prepare the dataset again"),
    "changed": (lambda f, size: (f.seek(size // 2), f.write(b"\x07\x00" * 8)),  # BEL: in no source
                "has changed since it was written: its size is right but its CRC-32 is not the one metadata.json "
                "records; prepare the dataset again"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_shard_damaged_while_the_job_waits_fails_its_attempt_naming_the_file(damage, slurm, tmp_path):
    """The bug report's first case: a shard cut to half its size (an even number of bytes) trained to COMPLETED
    on other data. Damaged after the launch checked it, while the job is held, it is found at the attempt's
    start; a changed shard only by the rank whose share of the checksums it is, and every rank fails with it."""
    data, root = tmp_path / "data", tmp_path / "runs"
    shards = _byte_dataset(slurm, data, root)
    assert len(shards) == 3
    res = slurm.launcher("gpus=2", "train.steps=20", f"data.path={data}", "+cluster.sbatch_flags.hold=true",
                         f"name={damage}", root=root)
    assert res.returncode == 0 and res.stderr == "", res.stderr  # whole at launch: no error, no warning
    job = job_id_of(res.stdout)
    shard = data / shards[1]["file"]
    harm, said = DAMAGE[damage]
    with open(shard, "r+b") as f:
        harm(f, shards[1]["bytes"])
    slurm.run("scontrol", "release", job)
    ended, final = _the_verdict(slurm, root, damage, job)
    message = f"DatasetError: shard {shard} {said}"
    assert ended["cause"].endswith(message) and ended["step"] is None, ended  # before the first step
    failed = [e for e in events(root / damage) if e["event"] == "failed" and not e.get("final")]
    assert sorted(e["rank"] for e in failed) == [0, 1] and {e["error"] for e in failed} == {message}
    assert "started" not in [e["event"] for e in events(root / damage)]
    assert final["reason"] == "the data is damaged: every node and try would read it alike, not retried"
    described = slurm.launcher("describe", damage, root=root)
    assert described.returncode == 0 and message in described.stdout


def test_ids_past_the_vocabulary_written_while_training_fail_it_naming_the_file(slurm, tmp_path):
    """The bug report's third case: ids above the vocabulary failed with torch's 'IndexError: index out of range
    in self' at step 50. Written over every shard (same size) while the run trains, they end the attempt at the
    step that reads them, naming the shard and the token, and a run that has trained steps is not retried."""
    data, root = tmp_path / "data", tmp_path / "runs"
    shards = _byte_dataset(slurm, data, root)
    res = slurm.launcher("gpus=2", "train.steps=5000", "train.log_every=5", "train.eval_every=0",
                         f"data.path={data}", "name=ids", root=root, env=UNTIL_STOPPED)
    assert res.returncode == 0, res.stderr
    job = job_id_of(res.stdout)
    wait_for(lambda: (root / "ids" / "metrics.jsonl").is_file(), 120, "the first steps", interval=0.2)
    for shard in shards:
        with open(data / shard["file"], "r+b") as f:
            f.write((300).to_bytes(2, "little") * shard["tokens"])  # every token id 300, the size unchanged
        assert (data / shard["file"]).stat().st_size == shard["bytes"]
    ended, final = _the_verdict(slurm, root, "ids", job)
    found = re.search(r"DatasetError: shard (\S+) holds token id 300 at token [\d,]+, not below "
                      r"model.vocab_size=256: set model.vocab_size to its tokenizer's vocabulary, or prepare the data "
                      r"again if it was damaged$", ended["cause"])
    assert found and found.group(1) in {str(data / s["file"]) for s in shards}, ended["cause"]
    assert ended["step"] >= 5 and final["reason"] == (
        "the data is damaged: every node and try would read it alike, not retried"), final
