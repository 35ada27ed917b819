"""Launch-time data checks: a bad ``data.path`` is refused at composition, one line and exit 2, with nothing
submitted or recorded; plan and dry runs show the data's tokens and epochs."""
from __future__ import annotations

import json
import shutil
import sysconfig
from pathlib import Path

import pytest

from launcher import cli

STDLIB_JSON = Path(sysconfig.get_paths()["stdlib"]) / "json"


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> Path:
    """``bpe``: a BPE of 300 tokens (uint16); ``wide``: byte-level stored as uint32; plus broken copies."""
    root = tmp_path_factory.mktemp("datasets")
    assert cli.main(["data", "prepare", str(root / "bpe"), str(STDLIB_JSON), "--glob", "*.py",
                     "--tokenizer", "bpe:300", "--shard-tokens", "20000"]) == 0
    assert cli.main(["data", "prepare", str(root / "wide"), str(STDLIB_JSON), "--glob", "*.py",
                     "--dtype", "uint32"]) == 0
    (root / "nometa").mkdir()
    (root / "empty.bin").write_bytes(b"")
    (root / "odd.bin").write_bytes(b"\x01\x00\x02")
    (root / "tiny.bin").write_bytes(b"\x01\x00" * 100)
    for name, damage in {"truncated": "shard", "lost": "unlink", "garbled": "meta"}.items():
        shutil.copytree(root / "bpe", root / name)
        if damage == "shard":
            with open(root / name / "tokens_00000.bin", "r+b") as f:
                f.truncate(1000)
        elif damage == "unlink":
            (root / name / "tokens_00000.bin").unlink()
        else:
            (root / name / "metadata.json").write_text('{"dtype": "uint16"')
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
    (["data.path={root}/truncated", "model.vocab_size=300"], "shard tokens_00000.bin has 500 tokens; its metadata says 20,000"),
    (["data.path={root}/lost", "model.vocab_size=300"], "shard tokens_00000.bin is missing"),
    (["data.path={root}/garbled", "model.vocab_size=300"], "metadata.json is damaged (JSONDecodeError"),
    (["data.dtype=int8"], "data.dtype must be one of uint16, uint32; got 'int8'"),
]  # fmt: skip


@pytest.mark.parametrize("args, message", BAD, ids=[" ".join(a).replace("{root}/", "") for a, _ in BAD])
def test_bad_data_is_refused_before_anything_is_recorded(args, message, datasets, tmp_path, capsys, monkeypatch):
    import launcher.submit.launch

    monkeypatch.setenv("LAUNCHER_RUN_ROOT", str(tmp_path / "runs"))
    monkeypatch.setattr(launcher.submit.launch, "launch", lambda *a, **k: pytest.fail("a bad data.path was submitted"))
    typed = [arg.format(root=datasets) for arg in args]
    assert cli.main(["gpus=8", *typed]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1, err
    assert message.format(root=datasets) in err
    assert not (tmp_path / "runs").exists()


def test_plan_and_dry_runs_show_tokens_and_epochs(datasets, capsys):
    meta = json.loads((datasets / "bpe" / "metadata.json").read_text())
    tokens = meta["tokens"]
    train_samples = (tokens - int(tokens * 0.05) - 1) // 64  # gpt_tiny: seq_len 64; val_fraction 0.05
    epochs = 300 / (train_samples // 16)  # 300 steps of 16 sequences (8 GPUs x 2)
    args = [f"data.path={datasets}/bpe", "model.vocab_size=300", "train.steps=300"]
    assert cli.main([*args, "dry_run=json"]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert data == {"source": str(datasets / "bpe"), "tokenizer": "bpe:300", "vocab_size": 300, "tokens": tokens,
                    "epochs": pytest.approx(epochs)}
    line = f"data: {datasets}/bpe (bpe:300 tokenizer, vocabulary 300); {tokens:,} tokens; {epochs:.3g} epochs"
    assert cli.main([*args, "dry_run=true"]) == 0
    assert line in capsys.readouterr().out.splitlines()
    assert cli.main(["plan", *args]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == line
    assert cli.main(["plan", "--json", *args]) == 0
    assert json.loads(capsys.readouterr().out)["data"]["epochs"] == pytest.approx(epochs)
