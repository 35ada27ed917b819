"""Your own data, end to end on the local cluster: text -> a bpe:4096 tokenizer and shards -> gpt_small on
4 ranks (2 nodes x 2) trains on them and its loss falls -> ``launcher sample`` prints text decoded with that
tokenizer. A model whose vocabulary is smaller than the tokenizer's is refused at launch."""
from __future__ import annotations

import json
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer

from helpers import job_id_of

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
