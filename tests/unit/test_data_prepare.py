"""``launcher data prepare``: every input kind and tokenizer gives the tokens it should, with metadata that
says how they were made; training reads the shards as one sequence; every bad input is one line, exit 2,
and leaves no output."""
from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from launcher import cli
from launcher.core.dataset import END_OF_TEXT
from launcher.dataset.tokenizer import sha256
from launcher.train.data import TokenData

# One worker makes its prepared corpus (a module-scoped fixture) for all the tests here.
pytestmark = pytest.mark.xdist_group("data_prepare")

STDLIB_JSON = Path(sysconfig.get_paths()["stdlib"]) / "json"


def prepare(capsys, *args) -> tuple[int, str, str]:
    code = cli.main(["data", "prepare", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def tokens_of(out: Path) -> np.ndarray:
    meta = json.loads((out / "metadata.json").read_text())
    return np.concatenate([np.fromfile(out / s["file"], dtype=meta["dtype"]) for s in meta["shards"]])


@pytest.fixture(scope="module")
def bpe_dataset(tmp_path_factory) -> Path:
    """A byte-level BPE of 512 tokens trained on the json package's sources, in shards of 5,000 tokens."""
    out = tmp_path_factory.mktemp("bpe") / "ds"
    assert cli.main(["data", "prepare", str(out), str(STDLIB_JSON), "--glob", "*.py", "--tokenizer", "bpe:512",
                     "--shard-tokens", "5000"]) == 0
    return out


def test_byte_level_text_directory(tmp_path, capsys):
    texts = tmp_path / "texts"
    (texts / "sub").mkdir(parents=True)
    (texts / "b.txt").write_bytes(b"caf\xe9 second")  # latin-1, not UTF-8: byte-level keeps the bytes as they are
    (texts / "a.txt").write_text("first é")
    (texts / "sub" / "c.md").write_text("third")
    (texts / "skip.py").write_text("not a text file by name")
    (texts / "empty.txt").write_text("")
    code, out, _ = prepare(capsys, tmp_path / "ds", texts)
    assert code == 0
    assert "wrote 24 uint16 tokens in 1 shard from 3 files" in out and "model.vocab_size=256" in out
    assert bytes(tokens_of(tmp_path / "ds").astype(np.uint8)) == "first é".encode() + b"caf\xe9 second" + b"third"
    meta = json.loads((tmp_path / "ds" / "metadata.json").read_text())
    assert meta["tokens"] == 24 and meta["dtype"] == "uint16"
    assert meta["tokenizer"] == {"kind": "byte", "spec": "byte", "vocab_size": 256, "file": None, "sha256": None,
                                 "end_of_text": None}
    assert [Path(s["path"]).name for s in meta["sources"]] == ["a.txt", "b.txt", "c.md"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "texts"]  # no temporary directory left
    assert f"skipped 1 file in {texts} that no format's ending names (skip.py); to read them too, give --glob '*'" \
        in out


def test_files_a_directory_holds_without_a_known_ending_are_counted_and_named_not_dropped_silently(tmp_path, capsys):
    """17 licence files beside one ``.txt``: the 17 were dropped without a word."""
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "story.txt").write_text("once")
    for n in range(17):
        (texts / f"LICENSE-{n:02d}").write_text("licence text")
    code, out, _ = prepare(capsys, tmp_path / "ds", texts)
    assert code == 0 and out.splitlines()[0] == (
        f"skipped 17 files in {texts} that no format's ending names (LICENSE-00, LICENSE-01, LICENSE-02, ...); "
        "to read them too, give --glob '*' (read as text unless named otherwise)")
    code, out, _ = prepare(capsys, tmp_path / "all", texts, "--glob", "*")
    assert code == 0 and "skipped" not in out and "from 18 files" in out


def test_jsonl_and_parquet_field(tmp_path, capsys):
    (tmp_path / "a.jsonl").write_text('{"body": "one", "id": 1}\n\n{"body": "two"}\n')
    pq.write_table(pa.table({"body": ["three", None, "four"], "n": [1, 2, 3]}), tmp_path / "b.parquet")
    code, _, _ = prepare(capsys, tmp_path / "ds", tmp_path / "a.jsonl", tmp_path / "b.parquet", "--field", "body")
    assert code == 0
    assert bytes(tokens_of(tmp_path / "ds").astype(np.uint8)) == b"onetwothreefour"


def test_bpe_is_trained_saved_and_recorded(bpe_dataset):
    meta = json.loads((bpe_dataset / "metadata.json").read_text())
    record = meta["tokenizer"]
    assert record["kind"] == "bpe" and record["spec"] == "bpe:512" and record["vocab_size"] == 512
    assert record["sha256"] == sha256(bpe_dataset / "tokenizer.json")
    tokenizer = Tokenizer.from_file(str(bpe_dataset / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == 512 and record["end_of_text"] == tokenizer.token_to_id(END_OF_TEXT)
    tokens = tokens_of(bpe_dataset)
    assert meta["tokens"] == len(tokens) and tokens.max() < 512
    assert [s["tokens"] for s in meta["shards"]][:-1] == [5000] * (len(meta["shards"]) - 1)
    # One document per file, each ended by end-of-text; decoding gives the files back exactly.
    files = [Path(s["path"]) for s in meta["sources"]]
    ends = np.flatnonzero(tokens == record["end_of_text"])
    assert len(ends) == len(files)
    first = tokenizer.decode(tokens[: ends[0]].tolist())
    assert first == files[0].read_text()
    assert len(tokens) < 0.5 * sum(f.stat().st_size for f in files)  # merges: far fewer tokens than bytes


def test_a_tokenizer_file_gives_the_same_tokens(bpe_dataset, tmp_path, capsys):
    code, out, _ = prepare(capsys, tmp_path / "ds", STDLIB_JSON, "--glob", "*.py", "--tokenizer",
                           bpe_dataset / "tokenizer.json")
    assert code == 0 and "vocabulary 512" in out
    meta = json.loads((tmp_path / "ds" / "metadata.json").read_text())
    assert meta["tokenizer"]["kind"] == "file" and meta["tokenizer"]["vocab_size"] == 512
    # No end-of-text between documents: a user's tokenizer does not say which token that would be.
    bpe, eot = tokens_of(bpe_dataset), json.loads((bpe_dataset / "metadata.json").read_text())["tokenizer"]["end_of_text"]
    assert meta["tokenizer"]["end_of_text"] is None
    assert np.array_equal(tokens_of(tmp_path / "ds"), bpe[bpe != eot])


def test_training_reads_the_shards_as_one_sequence(bpe_dataset):
    whole = tokens_of(bpe_dataset)
    data = TokenData(bpe_dataset, "uint16", seq_len=64, val_fraction=0.1, vocab_size=512)
    n_train = len(whole) - int(len(whole) * 0.1)
    assert len(data.splits["train"]) == n_train and data.splits["val"][0] == whole[n_train]
    x, y = data.batch("train", np.array([78, 0]))  # sample 78 spans shards 0 and 1 (5,000 tokens each)
    assert np.array_equal(x[0], whole[78 * 64: 79 * 64]) and np.array_equal(y[0], whole[78 * 64 + 1: 79 * 64 + 1])
    x, _ = data.batch("val", np.array([2]))
    assert np.array_equal(x[0], whole[n_train + 128: n_train + 192])


def test_overwrite_replaces_a_dataset_only_when_asked(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("abc")
    assert prepare(capsys, tmp_path / "ds", tmp_path / "a.txt")[0] == 0
    (tmp_path / "a.txt").write_text("abcdef")
    code, _, err = prepare(capsys, tmp_path / "ds", tmp_path / "a.txt")
    assert code == 2 and "already exists; add --overwrite to replace it" in err
    assert prepare(capsys, tmp_path / "ds", tmp_path / "a.txt", "--overwrite")[0] == 0
    assert len(tokens_of(tmp_path / "ds")) == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "ds"]


def _bad_inputs(tmp: Path) -> None:
    (tmp / "ok.txt").write_text("some text")
    (tmp / "empty.txt").write_text("")
    (tmp / "emptydir").mkdir()
    (tmp / "corrupt.parquet").write_bytes(b"PAR1 this is not parquet at all PAR1")
    pq.write_table(pa.table({"body": ["x"]}), tmp / "nofield.parquet")
    (tmp / "bad.jsonl").write_text('{"text": "ok"}\nnot json\n')
    (tmp / "nofield.jsonl").write_text('{"body": "x"}\n')
    (tmp / "tokenizer.json").write_text('{"this": "is not a tokenizer"}')
    (tmp / "exists").mkdir()


BAD = [
    (["missing.txt"], "input missing.txt does not exist"),
    (["empty.txt"], "input empty.txt is empty"),
    (["emptydir"], "input emptydir is a directory without non-empty input files"),
    (["corrupt.parquet"], "input corrupt.parquet is not a readable Parquet file"),
    (["nofield.parquet"], "has no 'text' column (columns: body); choose one with --field"),
    (["bad.jsonl"], "input bad.jsonl line 2 is not JSON"),
    (["nofield.jsonl"], "line 1 has no string 'text' field"),
    (["ok.txt", "--tokenizer", "tokenizer.json"], "--tokenizer tokenizer.json is not a Hugging Face tokenizer.json"),
    (["ok.txt", "--tokenizer", "nope.json"], "--tokenizer nope.json: no such file; use byte, bpe:N"),
    (["ok.txt", "--tokenizer", "bpe:0"], "--tokenizer bpe:0: N of bpe:N must be a whole number from 257 to"),
    (["ok.txt", "--tokenizer", "bpe:abc"], "--tokenizer bpe:abc: N of bpe:N must be a whole number"),
    (["ok.txt", "--shard-tokens", "0"], "--shard-tokens must be a positive number of tokens, got 0"),
    (["ok.txt", "--format", "csv"], "argument --format: invalid choice: 'csv'"),
]  # fmt: skip


@pytest.mark.parametrize("args, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_exit_2_and_no_output(args, message, tmp_path, capsys, monkeypatch):
    _bad_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = prepare(capsys, "ds", *args)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no ds, no temporary directory


def test_an_existing_output_is_not_touched(tmp_path, capsys):
    _bad_inputs(tmp_path)
    code, _, err = prepare(capsys, tmp_path / "exists", tmp_path / "ok.txt")
    assert code == 2 and "output" in err and "already exists" in err and err.count("\n") == 1
    assert list((tmp_path / "exists").iterdir()) == []


def test_progress_off_a_terminal_is_plain_lines():
    import io

    from launcher.dataset.progress import Progress

    stream = io.StringIO()
    progress = Progress("tokenizing", total=3_000_000, stream=stream)
    progress.add(1_000_000)  # within the first 10 s: nothing yet
    progress.done()
    assert stream.getvalue().startswith("tokenizing: 100.0% (3.0 of 3.0 MB, ")
    assert stream.getvalue().count("\n") == 1 and "\r" not in stream.getvalue() and "\033" not in stream.getvalue()
