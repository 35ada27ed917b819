"""Tokenizers of datasets: ``byte`` (one token per byte), a Hugging Face ``tokenizer.json`` the user gives,
or ``bpe:N``, a byte-level BPE of N tokens trained offline on the inputs with the ``tokenizers`` package.

Whatever made a dataset is recorded in its metadata with the sha256 of its file, which is saved beside the
shards, so ``launcher sample`` decodes a run's output with exactly the tokenizer its data was made with.
``tokenizers`` is imported only when a tokenizer file is used: byte-level data needs nothing but numpy.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from launcher.core.dataset import BYTE_VOCAB, END_OF_TEXT, TOKENIZER_FILE
from launcher.errors import LaunchError

BPE_SIZES = (BYTE_VOCAB + 1, 1 << 20)  # 256 bytes + end-of-text at least; ids stay far inside uint32
_BPE = re.compile(r"bpe:(-?\d+)")
CHOICES = "byte, bpe:N (a BPE of N tokens trained on the inputs) or a tokenizer.json file"


class Codec:
    """Text to token ids and back, and the record that goes into the dataset's metadata."""

    def __init__(self, kind: str, spec: str, vocab_size: int, hf: Any = None, eot: Optional[int] = None):
        self.kind, self.spec, self.vocab_size, self.hf, self.eot = kind, spec, vocab_size, hf, eot

    def encode_batch(self, texts: List[str]) -> List[Sequence[int]]:
        """Token ids of each text: a numpy array of bytes (byte-level) or a list of ids."""
        if self.hf is None:
            import numpy as np  # lazy: keeps numpy out of start-up

            return [np.frombuffer(_raw_bytes(text), dtype=np.uint8) for text in texts]
        return [enc.ids for enc in self.hf.encode_batch([unicode(text) for text in texts])]

    def encode(self, text: str) -> List[int]:
        return [int(i) for i in self.encode_batch([text])[0]]

    def decode(self, ids: Iterable[int]) -> str:
        if self.hf is None:
            return bytes(i for i in ids if 0 <= i < BYTE_VOCAB).decode("utf-8", errors="replace")
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, directory: Path) -> Dict[str, Any]:
        """Save the tokenizer's file in ``directory``; its metadata record."""
        record: Dict[str, Any] = {"kind": self.kind, "spec": self.spec, "vocab_size": self.vocab_size,
                                  "file": None, "sha256": None, "end_of_text": self.eot}
        if self.hf is not None:
            path = directory / TOKENIZER_FILE
            self.hf.save(str(path))
            record.update(file=TOKENIZER_FILE, sha256=sha256(path))
        return record


BYTE = Codec("byte", "byte", BYTE_VOCAB)


# Text files are decoded with "surrogateescape", so that byte-level tokens are exactly the file's bytes
# even where it is not UTF-8; the tokenizers package takes only valid Unicode.
_ESCAPED = re.compile("[\udc80-\udcff]")


def _raw_bytes(text: str) -> bytes:
    try:
        return text.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate from a JSON escape: not a byte of any file
        return text.encode("utf-8", errors="replace")


def unicode(text: str) -> str:
    """``text`` with the bytes that were not UTF-8 as U+FFFD, for the tokenizers package."""
    if not _ESCAPED.search(text):
        return text
    return _raw_bytes(text).decode("utf-8", errors="replace")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def bpe_size(spec: str) -> Optional[int]:
    """N of ``bpe:N`` (checked), or None when ``spec`` is not a BPE spec."""
    match = _BPE.fullmatch(spec)
    if not match and not spec.startswith("bpe:"):
        return None
    low, high = BPE_SIZES
    if not match or not low <= int(match.group(1)) <= high:
        raise LaunchError(f"--tokenizer {spec}: N of bpe:N must be a whole number from {low} to {high:,} "
                          f"(the 256 bytes, end-of-text and the merges)")
    return int(match.group(1))


def from_spec(spec: str, texts: Callable[[], Iterable[str]]) -> Codec:
    """The tokenizer ``spec`` names; ``texts`` streams the inputs, read only to train ``bpe:N``."""
    if spec == "byte":
        return BYTE
    size = bpe_size(spec)
    if size is not None:
        return train_bpe(spec, size, texts())
    path = Path(spec).expanduser()
    if not path.is_file():
        raise LaunchError(f"--tokenizer {spec}: no such file; use {CHOICES}")
    return Codec("file", str(path.resolve()), *_from_file(path, f"--tokenizer {spec}"))


def _from_file(path: Path, label: str) -> tuple:
    """(vocabulary size, tokenizer) of a tokenizer.json; LaunchError if it is not one."""
    from tokenizers import Tokenizer  # lazy: keeps tokenizers out of start-up

    try:
        hf = Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust side raises a plain Exception for a malformed file
        lines = str(err).strip().splitlines()
        raise LaunchError(f"{label} is not a Hugging Face tokenizer.json ({lines[0][:150] if lines else err!r})"
                          ) from None
    return hf.get_vocab_size(), hf


def train_bpe(spec: str, size: int, texts: Iterable[str]) -> Codec:
    """A byte-level BPE (GPT-2's scheme: every byte is a token, so any text encodes) of ``size`` tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # lazy: keeps tokenizers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=[END_OF_TEXT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(map(unicode, texts), trainer=trainer)
    return Codec("bpe", spec, hf.get_vocab_size(), hf, hf.token_to_id(END_OF_TEXT))


def load(record: Dict[str, Any], directory: Path) -> Codec:
    """The tokenizer a dataset's metadata names, checked against its recorded hash."""
    if record.get("file") is None:
        return BYTE
    path = directory / record["file"]
    if not path.is_file():
        raise LaunchError(f"{path} is missing: the dataset's tokenizer is gone; prepare the data again")
    if sha256(path) != record.get("sha256"):
        raise LaunchError(f"{path} is not the tokenizer the data was made with (its sha256 differs from "
                          f"{directory / 'metadata.json'}); prepare the data again")
    vocab, hf = _from_file(path, str(path))
    return Codec(record["kind"], record.get("spec", str(path)), vocab, hf, record.get("end_of_text"))
