"""``launcher data prepare OUT INPUT...``: turn text into a dataset a run trains on with ``data.path=OUT``.

numpy, tokenizers and pyarrow are imported inside the command (launcher/dataset/), so no other command
pays for them.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from launcher.core.config import StoreConfig
from launcher.core.dataset import TOKEN_DTYPES
from launcher.core.store import is_remote
from launcher.job.secret_store import secrets_dir, store_secrets
from launcher.dataset.prepare import Request, prepare
from launcher.dataset.sources import AUTO, FORMATS

EPILOG = """examples:
  launcher data prepare data/books ~/books/                       # byte-level: one token per byte
  launcher data prepare data/books ~/books/ --tokenizer bpe:4096  # train a BPE of 4096 tokens on them
  launcher data prepare data/web crawl.parquet --tokenizer ~/gpt2/tokenizer.json --field content
  launcher gpus=4 model=gpt_small data.path=data/books model.vocab_size=4096"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    actions = parser.add_subparsers(dest="action", title="actions", metavar="ACTION", required=True)
    prep = actions.add_parser("prepare", help="tokenize inputs into token shards + metadata.json in OUT",
                              epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    prep.add_argument("out", metavar="OUT", help="the dataset directory to create, or s3://BUCKET/PREFIX (the "
                      "store as the AWS CLI finds it: AWS_ENDPOINT_URL, AWS_PROFILE, ...; or --endpoint-url)")
    prep.add_argument("inputs", type=Path, nargs="+", metavar="INPUT", help="files or directories (recursive)")
    prep.add_argument("--tokenizer", default="byte", metavar="SPEC",
                      help="byte (default), bpe:N (train a byte-level BPE of N tokens on the inputs, saved as "
                           "OUT/tokenizer.json) or a Hugging Face tokenizer.json file")
    prep.add_argument("--format", choices=(AUTO, *FORMATS), default=AUTO,
                      help="how to read the inputs; auto (default) goes by file name: "
                           + "; ".join(f"{f}: {' '.join(ends)}" for f, ends in FORMATS.items())
                           + " (anything else: text)")
    prep.add_argument("--field", default="text", help="the text field of JSON-lines and Parquet (default: text)")
    prep.add_argument("--glob", help="file pattern inside directories (default: the format's file endings)")
    prep.add_argument("--dtype", choices=tuple(TOKEN_DTYPES),
                      help="token type (default: uint16 if the vocabulary fits, else uint32)")
    prep.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard (default 100M)")
    prep.add_argument("--overwrite", action="store_true", help="replace an existing dataset OUT (once done)")
    prep.add_argument("--endpoint-url", help="an S3-compatible store's URL, for an s3:// OUT (default: as the AWS CLI "
                                             "resolves it)")


def main(args: argparse.Namespace) -> int:
    remote = is_remote(args.out)
    if remote:
        store_secrets(secrets_dir())  # the credentials a run's tasks will have
    made = prepare(Request(out=args.out if remote else Path(args.out), inputs=args.inputs, tokenizer=args.tokenizer,
                           format=args.format, field=args.field, glob=args.glob, dtype=args.dtype,
                           shard_tokens=args.shard_tokens, overwrite=args.overwrite,
                           store=StoreConfig(endpoint_url=args.endpoint_url)))
    meta = made.meta
    for skipped in made.skipped:
        print(skipped.line())
    out, tokenizer = args.out if remote else Path(args.out).expanduser().resolve(), meta["tokenizer"]
    shards = len(meta["shards"])
    print(f"wrote {meta['tokens']:,} {meta['dtype']} tokens in {shards} shard{'s' * (shards != 1)} from "
          f"{len(meta['sources'])} files to {out}")
    print(f"tokenizer: {tokenizer['spec']}, vocabulary {tokenizer['vocab_size']:,}"
          + (f" ({out}/{tokenizer['file']})" if tokenizer["file"] else ""))
    dtype = "" if meta["dtype"] == "uint16" else f" data.dtype={meta['dtype']}"
    # A tokenizer.json may use ids past the vocabulary size it reports: the embedding must hold the largest.
    vocab = max(tokenizer["vocab_size"], 1 + max(s["max_id"] for s in meta["shards"]))
    print(f"train with: launcher data.path={out}{dtype} model.vocab_size={vocab} (or more)")
    return 0
