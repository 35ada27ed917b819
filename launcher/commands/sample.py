"""``launcher sample RUN [--prompt TEXT] [--tokens N]``: what has the model learned? Text generated from the
run's newest complete checkpoint, decoded with the tokenizer its data was made with.

Runs here, not on Slurm: a GPU if this machine has one, else the CPU. torch is imported only inside the
command (launcher/train/generate.py), so the rest of the launcher stays torch-free; it needs the package's
``[train]`` extra, as the cluster's environment does.
"""
from __future__ import annotations

import argparse
import math
import sys

from launcher.views.trained_model import run_tokenizer, with_checkpoint
from launcher.core.checkpoints import step_of
from launcher.core.startup import long_lived_imports
from launcher.errors import LaunchError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="RUN", help="run name (or unique prefix)")
    parser.add_argument("--prompt", default="", help="text to continue (default: a new document)")
    parser.add_argument("--tokens", type=int, default=200, help="tokens to generate (default 200)")
    parser.add_argument("--temperature", type=float, default=0.8, help="sampling temperature > 0 (default 0.8)")
    parser.add_argument("--top-k", type=int, default=50, help="sample among the k most likely tokens; 0: all")
    parser.add_argument("--seed", type=int, default=0, help="random seed: the same seed gives the same text")
    parser.add_argument("--step", type=int, help="the checkpoint of this step (default: the newest good one)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto (default): cuda if available, else cpu")


def main(args: argparse.Namespace) -> int:
    if args.tokens < 1:
        raise LaunchError(f"--tokens must be at least 1, got {args.tokens}")
    if not (math.isfinite(args.temperature) and args.temperature > 0):
        raise LaunchError(f"--temperature must be a positive number, got {args.temperature}")
    if args.top_k < 0:
        raise LaunchError(f"--top-k must be 0 (all tokens) or more, got {args.top_k}")
    rec, cfg, checkpoint = with_checkpoint(args, "sample")
    codec = run_tokenizer(cfg.data)
    prompt = codec.encode(args.prompt) if args.prompt else [codec.eot if codec.eot is not None else
                                                             codec.encode("\n")[0]]
    if max(prompt) >= cfg.model.vocab_size:
        raise LaunchError(f"the prompt has token {max(prompt)}, outside the model's vocabulary of "
                          f"{cfg.model.vocab_size}")

    with long_lived_imports():
        import torch  # lazy: keeps torch, numpy out of start-up

        from launcher.train.generate import generate, load_model  # lazy: keeps torch, numpy out of start-up

    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    model = load_model(cfg.model, checkpoint, device)
    print(f"# {rec.name}, step {step_of(checkpoint)}, {codec.spec} tokenizer, on {device.type}", file=sys.stderr)
    out = generate(model, prompt, args.tokens, args.temperature, args.top_k, args.seed, stop=codec.eot)
    print(args.prompt + codec.decode(out))
    return 0
