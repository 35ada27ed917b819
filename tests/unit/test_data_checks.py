"""Launch-time data checks: a bad ``data.path`` is refused at composition, one line and exit 2, with nothing
submitted or recorded; plan and dry runs show the data's tokens and epochs. The faults are real: shards cut
short (to an even and an odd size), written over keeping their size, holding ids past the vocabulary, shard
records without checksums."""
from __future__ import annotations

import json
import shutil
import sysconfig
import zlib
from pathlib import Path

import numpy as np
import pytest

from launcher import cli
from launcher.core import dataset
from launcher.core.config import DataConfig
from launcher.core.dataset import CHECKED, DatasetError, verify
from launcher.train.data import TokenData

# One worker makes its prepared datasets (a module-scoped fixture) for all the tests here.
pytestmark = pytest.mark.xdist_group("data_checks")

STDLIB_JSON = Path(sysconfig.get_paths()["stdlib"]) / "json"
SHARD = 20_000  # bytes of each full shard of the ``bpe`` dataset: 10,000 uint16 tokens


def write_over(path: Path, offset: int, data: bytes) -> None:
    """Change bytes of a file in place, keeping its size."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
    assert path.stat().st_size == size


def legacy_copy(source: Path, target: Path) -> None:
    """``source`` with shard records of file and tokens only (as an unreleased ``data prepare`` wrote them)."""
    shutil.copytree(source, target)
    meta = json.loads((target / "metadata.json").read_text())
    meta["shards"] = [{key: s[key] for key in ("file", "tokens")} for s in meta["shards"]]
    (target / "metadata.json").write_text(json.dumps(meta))


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> Path:
    """``bpe``: a BPE of 300 tokens (uint16); ``wide``: byte-level stored as uint32; plus broken copies."""
    root = tmp_path_factory.mktemp("datasets")
    assert cli.main(["data", "prepare", str(root / "bpe"), str(STDLIB_JSON), "--glob", "*.py",
                     "--tokenizer", "bpe:300", "--shard-tokens", "10000"]) == 0
    assert cli.main(["data", "prepare", str(root / "wide"), str(STDLIB_JSON), "--glob", "*.py",
                     "--dtype", "uint32"]) == 0
    (root / "nometa").mkdir()
    (root / "empty.bin").write_bytes(b"")
    (root / "odd.bin").write_bytes(b"\x01\x00\x02")
    (root / "tiny.bin").write_bytes(b"\x01\x00" * 100)
    (root / "short.bin").write_bytes(b"\x01\x00" * 2_483)  # a val split of 124 tokens (data.val_fraction 0.05)
    damage = {"halved": lambda f: f.truncate(SHARD // 2), "odd": lambda f: f.truncate(SHARD // 2 + 1),
              "grown": lambda f: (f.seek(0, 2), f.write(b"\x00\x00")), "lost": None, "garbled": None}
    for name, cut in damage.items():
        shutil.copytree(root / "bpe", root / name)
        if cut:
            with open(root / name / "tokens_00001.bin", "r+b") as f:
                cut(f)
    (root / "lost" / "tokens_00000.bin").unlink()
    (root / "garbled" / "metadata.json").write_text('{"dtype": "uint16"')
    shutil.copytree(root / "bpe", root / "changed")
    write_over(root / "changed" / "tokens_00002.bin", 12_344, b"\x07\x00\x07\x00")  # ids 7, 7: valid, but not these
    legacy_copy(root / "bpe", root / "legacy")
    return root


BAD = [
    (["data.path={root}/missing"], "data.path={root}/missing does not exist; make one with 'launcher data prepare"),
    (["data.path={root}/nometa"], "is a directory without metadata.json"),
    (["data.path={root}/empty.bin"], "data.path={root}/empty.bin is empty (0 bytes)"),
    (["data.path={root}/odd.bin"], "has 3 bytes, not a whole number of uint16 tokens (2 bytes each)"),
    (["data.path={root}/odd.bin", "data.dtype=uint32"], "not a whole number of uint32 tokens"),
    (["data.path={root}/wide"], "data.dtype=uint16 does not match data.path={root}/wide, whose tokens are uint32"),
    (["data.path={root}/bpe", "data.dtype=uint32"], "does not match data.path={root}/bpe, whose tokens are uint16"),
    (["data.path={root}/tiny.bin"], "has 100 tokens, 1 train samples of seq_len + 1 = 65 tokens, fewer than the global batch 16"),
    (["data.path={root}/bpe"], "model.vocab_size=256 is smaller than the vocabulary of data.path's tokenizer (300); set model.vocab_size=300"),
    (["data.path={root}/halved", "model.vocab_size=300"],
     "shard {root}/halved/tokens_00001.bin has 10,000 bytes, not the 20,000 (10,000 tokens) that metadata.json records: cut short, grown or replaced; prepare the dataset again"),
    (["data.path={root}/odd", "model.vocab_size=300"], "shard {root}/odd/tokens_00001.bin has 10,001 bytes, not the 20,000"),
    (["data.path={root}/grown", "model.vocab_size=300"], "shard {root}/grown/tokens_00001.bin has 20,002 bytes, not the 20,000"),
    (["data.path={root}/legacy", "model.vocab_size=300"], "{root}/legacy/metadata.json is damaged (ValueError: a field has a wrong value); prepare the dataset again"),
    (["data.path={root}/changed", "model.vocab_size=300"],
     "shard {root}/changed/tokens_00002.bin has changed since it was written: its size is right but its CRC-32 is not the one metadata.json records; prepare the dataset again"),
    (["data.path={root}/lost", "model.vocab_size=300"], "shard {root}/lost/tokens_00000.bin is missing; prepare the dataset again"),
    (["data.path={root}/garbled", "model.vocab_size=300"], "metadata.json is damaged (JSONDecodeError"),
    (["data.dtype=int8"], "data.dtype must be one of uint16, uint32; got 'int8'"),
    (["data.path={root}/short.bin", "model.seq_len=128"],
     "{root}/short.bin has 2,483 tokens, and its val split (data.val_fraction=0.05) 124, fewer than one sample of seq_len + 1 = 129: set data.val_fraction=0.052 or more, or train.eval_every=0 to train without evaluating"),
]  # fmt: skip


@pytest.mark.parametrize("args, message", BAD, ids=[" ".join(a).replace("{root}/", "") for a, _ in BAD])
def test_bad_data_is_refused_before_anything_is_recorded(args, message, datasets, tmp_path, capsys, monkeypatch):
    import launcher.submit.submitter

    monkeypatch.setenv("LAUNCHER_RUN_ROOT", str(tmp_path / "runs"))
    monkeypatch.setattr(launcher.submit.submitter, "launch", lambda *a, **k: pytest.fail("a bad data.path was submitted"))
    typed = [arg.format(root=datasets) for arg in args]
    assert cli.main(["gpus=8", *typed]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1, err
    assert message.format(root=datasets) in err
    assert not (tmp_path / "runs").exists()


def test_a_val_split_shorter_than_a_sample_is_only_refused_where_the_run_evaluates(datasets, capsys):
    """Every attempt of such a run would fail at its start; one that does not evaluate, or sets aside a val split
    of one sample, trains."""
    short = [f"data.path={datasets}/short.bin", "model.seq_len=128"]
    assert cli.main(["plan", *short]) == 2 and "fewer than one sample of seq_len + 1 = 129" in capsys.readouterr().err
    for fix in ("train.eval_every=0", "data.val_fraction=0.052"):
        assert cli.main(["gpus=8", *short, fix, "dry_run=true"]) == 0, capsys.readouterr().err
        capsys.readouterr()


def test_each_shard_records_its_size_checksums_and_largest_id(datasets):
    meta = json.loads((datasets / "bpe" / "metadata.json").read_text())
    assert len(meta["shards"]) > 3
    for shard in meta["shards"]:
        raw = (datasets / "bpe" / shard["file"]).read_bytes()
        ids = np.frombuffer(raw, dtype=np.uint16)
        assert set(shard) == {"file", "tokens", *CHECKED}
        assert (shard["tokens"], shard["bytes"], shard["max_id"]) == (len(ids), len(raw), int(ids.max()))
        assert shard["crc32"] == shard["sample_crc32"] == zlib.crc32(raw)  # a shard under 1 MiB is its own sample
    assert max(s["max_id"] for s in meta["shards"]) == 299  # the tokens of bpe:300 are 0..299


def test_ids_past_the_stated_vocabulary_are_refused(tmp_path, capsys):
    """A tokenizer.json may give a token an id beyond the vocabulary size it reports (ids need not be dense):
    the shards' largest id, not the tokenizer's word, is what the model's embedding must hold."""
    (tmp_path / "a.txt").write_text("a text with QQQ in it, " * 50)
    assert cli.main(["data", "prepare", str(tmp_path / "bpe"), str(tmp_path / "a.txt"), "--tokenizer", "bpe:300"]) == 0
    spec = json.loads((tmp_path / "bpe" / "tokenizer.json").read_text())
    spec["model"]["vocab"]["QQQ"] = 5000
    spec["added_tokens"].append({"id": 5000, "content": "QQQ", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": False, "special": True})
    (tmp_path / "sparse.json").write_text(json.dumps(spec))
    assert cli.main(["data", "prepare", str(tmp_path / "ds"), str(tmp_path / "a.txt"),
                     "--tokenizer", str(tmp_path / "sparse.json")]) == 0
    meta = json.loads((tmp_path / "ds" / "metadata.json").read_text())
    vocab = meta["tokenizer"]["vocab_size"]
    assert vocab < 5000 and meta["shards"][0]["max_id"] == 5000
    assert "model.vocab_size=5001 (or more)" in capsys.readouterr().out  # what prepare says to train with
    with pytest.raises(DatasetError) as refused:
        verify(DataConfig(path=str(tmp_path / "ds")), vocab_size=vocab)
    assert str(refused.value) == (f"shard {tmp_path}/ds/tokens_00000.bin holds token ids up to 5,000, not below "
                                  f"model.vocab_size={vocab:,}; set model.vocab_size=5001 or more")
    assert verify(DataConfig(path=str(tmp_path / "ds")), vocab_size=5001).tokens == meta["tokens"]


def test_ranks_share_the_checksums_and_a_large_share_is_sampled(tmp_path, monkeypatch):
    """Checksums are split among the checkers (ranks); a share above FULL_CHECK_BYTES is checked by sampled
    blocks, which find a change inside a block, while one between blocks is found as it is read (an id past
    the vocabulary; any other change is what sampling gives up)."""
    monkeypatch.setattr(dataset, "SAMPLE_BLOCK", 1024)  # 16 blocks of 1 KiB sample a shard over 16 KiB
    (tmp_path / "a.txt").write_bytes(bytes(range(128)) * 1000)
    assert cli.main(["data", "prepare", str(tmp_path / "ds"), str(tmp_path / "a.txt"), "--shard-tokens", "40000"]) == 0
    shards = json.loads((tmp_path / "ds" / "metadata.json").read_text())["shards"]
    assert [s["bytes"] for s in shards] == [80_000, 80_000, 80_000, 16_000]
    blocks = dataset.sample_ranges(80_000)
    assert len(blocks) == 16 and blocks[0] == (0, 1024) and blocks[-1] == (80_000 - 1024, 1024)
    data = DataConfig(path=str(tmp_path / "ds"))
    second = tmp_path / "ds" / "tokens_00001.bin"
    inside, between = (blocks[5][0] // 2 + 50) * 2, (blocks[5][0] // 2 + 1024) * 2  # token-aligned byte offsets
    assert blocks[5][0] + 1024 < between < blocks[6][0]
    was = second.read_bytes()[inside: inside + 2]
    write_over(second, inside, b"\x01\x00" if was != b"\x01\x00" else b"\x02\x00")
    assert verify(data, 256, share=0, shares=2).tokens == 128_000  # shards 0 and 2: whole, 160,000 bytes
    with pytest.raises(DatasetError, match="tokens_00001.bin has changed since it was written: its size is right "
                                           "but its CRC-32 is not the one"):
        verify(data, 256, share=1, shares=2)  # shards 1 and 3, whole
    monkeypatch.setattr(dataset, "FULL_CHECK_BYTES", 50_000)
    with pytest.raises(DatasetError, match="tokens_00001.bin has changed .* its CRC-32 of sampled blocks is not"):
        verify(data, 256, share=1, shares=2)
    write_over(second, inside, was)
    write_over(second, between, b"\x00\x01")  # id 256, past the byte vocabulary, between sampled blocks
    assert verify(data, 256, share=1, shares=2).tokens == 128_000
    tokens = TokenData(tmp_path / "ds", "uint16", seq_len=63, val_fraction=0.0, vocab_size=256)
    position = 40_000 + between // 2  # in the whole sequence; sample i holds tokens 63 i .. 63 i + 63
    tokens.batch("train", np.array([position // 63 - 2]))  # its neighbours read fine
    with pytest.raises(DatasetError) as caught:
        tokens.batch("train", np.array([0, position // 63]))
    assert str(caught.value) == (f"shard {second} holds token id 256 at token {between // 2:,}, not below "
                                 "model.vocab_size=256: set model.vocab_size to its tokenizer's vocabulary, or "
                                 "prepare the data again if it was damaged")


def test_plan_and_dry_runs_show_tokens_and_epochs(datasets, capsys):
    meta = json.loads((datasets / "bpe" / "metadata.json").read_text())
    tokens = meta["tokens"]
    train_samples = (tokens - int(tokens * 0.05) - 1) // 64  # gpt_tiny: seq_len 64; val_fraction 0.05
    epochs = 300 / (train_samples // 16)  # 300 steps of 16 sequences (8 GPUs x 2)
    args = [f"data.path={datasets}/bpe", "model.vocab_size=300", "train.steps=300"]
    assert cli.main([*args, "dry_run=json"]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert data == {"source": str(datasets / "bpe"), "tokenizer": "bpe:300", "vocab_size": 300, "tokens": tokens,
                    "epochs": pytest.approx(epochs), "first_read": None}
    line = f"data: {datasets}/bpe (bpe:300 tokenizer, vocabulary 300); {tokens:,} tokens; {epochs:.3g} epochs"
    assert cli.main([*args, "dry_run=true"]) == 0
    assert line in capsys.readouterr().out.splitlines()
    assert cli.main(["plan", *args]) == 0
    assert line in capsys.readouterr().out.splitlines()
    assert cli.main(["plan", "--json", *args]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["epochs"] == pytest.approx(epochs)
