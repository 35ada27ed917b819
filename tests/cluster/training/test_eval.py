"""``launcher eval``: a 2-rank run's checkpoint scored on held-out tokens in one process. On the run's own data
only its validation split is read, any other data whole; either way the windows read are spread evenly over it
(launcher/train/data.py eval_windows); the loss is the windows' mean cross-entropy, as the model computes it; the
result lands in the run's events and ``describe``. Data made with another tokenizer is refused in one line."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from launcher import cli
from launcher.core.checkpoints import step_dir
from launcher.core.config import load_run_config
from launcher.train.data import TokenData, eval_windows
from launcher.train.generate import load_model
from support.train_harness import as_run
from support.helpers import events as read_events

# The cluster tier without Slurm: real multi-rank training on gloo, seconds of CPU a test (docs/development.md).
pytestmark = pytest.mark.slurm

STDLIB = Path(json.__file__).resolve().parents[1]


@pytest.fixture
def ref(reference_run, tmp_path):
    return tmp_path, as_run(tmp_path, "ref", reference_run)


def expected(run_dir, data_path, split_fraction, windows, step):
    cfg = load_run_config(run_dir / "config.yaml")
    data = TokenData(Path(data_path), cfg.data.dtype, cfg.model.seq_len, split_fraction, cfg.model.vocab_size)
    model = load_model(cfg.model, step_dir(run_dir, step), torch.device("cpu"))
    split = "val" if split_fraction else "train"
    spread = eval_windows(windows, data.num_samples(split))
    assert len(spread) == windows and spread[-1] > data.num_samples(split) * (windows - 1) / windows  # to its end
    with torch.no_grad():
        losses = [model(*map(torch.from_numpy, data.batch(split, np.array([i])))).item() for i in spread]
    return sum(losses) / len(losses)


def test_the_runs_own_data_is_scored_on_its_validation_split_and_recorded(ref, capsys):
    root, run_dir = ref
    cfg = load_run_config(run_dir / "config.yaml")
    assert cli.main(["eval", "ref", "--root", str(root), "--data", cfg.data.path, "--tokens", "320", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["run"], result["step"], result["split"], result["tokens"]) == ("ref", 6, "val", 320)
    assert result["loss"] == pytest.approx(expected(run_dir, cfg.data.path, cfg.data.val_fraction, 10, 6), abs=1e-5)
    assert result["perplexity"] == pytest.approx(math.exp(result["loss"]), rel=1e-4)
    recorded = read_events(run_dir)[-1]
    assert recorded["event"] == "evaluated" and recorded["loss"] == result["loss"]
    assert cli.main(["describe", "ref", "--root", str(root)]) == 0
    assert f"loss {result['loss']:.4f}  perplexity" in capsys.readouterr().out
    assert cli.main(["export", "ref", str(root / "ref-hf"), "--root", str(root)]) == 0  # the card says it
    assert f"| held-out loss | {result['loss']:.4f}, perplexity {result['perplexity']} on 320 tokens of " \
        f"{cfg.data.path} (launcher eval) |" in (root / "ref-hf" / "README.md").read_text()


def test_other_data_is_read_whole_and_another_tokenizer_is_refused(ref, tmp_path, capsys):
    root, run_dir = ref
    from support.train_harness import make_tokens

    other = make_tokens(tmp_path / "other.bin", files=3)
    assert cli.main(["eval", "ref", "--root", str(root), "--data", str(other), "--tokens", "96", "--step", "3",
                     "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["split"], result["tokens"], result["step"]) == ("all", 96, 3)
    assert result["loss"] == pytest.approx(expected(run_dir, other, 0.0, 3, 3), abs=1e-5)

    bpe = tmp_path / "bpe"
    assert cli.main(["data", "prepare", str(bpe), str(STDLIB / "json"), "--glob", "*.py", "--tokenizer",
                     "bpe:300"]) == 0
    capsys.readouterr()
    assert cli.main(["eval", "ref", "--root", str(root), "--data", str(bpe)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: --data {bpe} was made with the bpe:300 tokenizer, ref's data with byte: evaluate on data "
                   "prepared with the run's tokenizer\n")
    for args, words in ([["--data", str(tmp_path / "nope")], "does not exist"],
                        [["--data", str(other), "--step", "5"], "no complete checkpoint at step 5"],
                        [["--data", str(other), "--tokens", "-1"], "--tokens must be 0 (all) or more, got -1"]):
        assert cli.main(["eval", "ref", "--root", str(root), *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and words in err, err
    kinds = [e["event"] for e in read_events(run_dir)]
    assert kinds.count("evaluated") == 1  # the refusals recorded nothing
