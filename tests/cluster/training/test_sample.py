"""``launcher sample`` and ``launcher eval``: the sharded checkpoint of a 2-rank run loads into one process with
exactly the weights the ranks trained (its eval loss is reproduced), generation is a function of the seed, and a
run without a checkpoint or a bad option is one line, exit 2."""
from __future__ import annotations

import json
import shutil

import pytest

from launcher import cli
from launcher.core.config import load_run_config
from launcher.core.plan import read_plan
from support.train_harness import as_run, metrics

# The cluster tier without Slurm: real multi-rank training on gloo, seconds of CPU a test (docs/development.md).
pytestmark = pytest.mark.slurm


def test_checkpoint_loads_into_one_process_with_the_trained_weights(reference_run, tmp_path, capsys):
    """``launcher eval`` on as many tokens as an evaluation reads reads the same windows (spread over the val
    split, launcher/train/data.py eval_windows), so one process reproduces the two ranks' ``eval_loss``."""
    cfg = load_run_config(reference_run / "config.yaml")
    plan = read_plan(reference_run)
    as_run(tmp_path, "ref", reference_run)
    tokens = cfg.train.eval_batches * plan.global_batch * cfg.model.seq_len
    assert cli.main(["eval", "ref", "--root", str(tmp_path), "--data", cfg.data.path, "--tokens", str(tokens),
                     "--step", "6", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    logged = {r["step"]: r for r in metrics(reference_run) if not r.get("final")}
    assert found["split"] == "val" and found["tokens"] == tokens
    assert found["loss"] == pytest.approx(logged[6]["eval_loss"], abs=1e-5)


def test_sample_prints_the_prompt_and_a_seeded_continuation(reference_run, tmp_path, capsys):
    as_run(tmp_path, "ref", reference_run)
    texts = []
    for seed in (0, 0, 1):
        assert cli.main(["sample", "ref", "--root", str(tmp_path), "--prompt", "import ", "--tokens", "30",
                         "--seed", str(seed)]) == 0
        out, err = capsys.readouterr()
        assert err == "# ref, step 6, byte tokenizer, on cpu\n"
        assert out.startswith("import ") and len(out) <= len("import ") + 30 + 1  # a byte is at most a character
        texts.append(out)
    assert texts[0] == texts[1] != texts[2]


BAD = [
    (["--tokens", "0"], "--tokens must be at least 1, got 0"),
    (["--temperature", "0"], "--temperature must be a positive number, got 0.0"),
    (["--temperature", "nan"], "--temperature must be a positive number, got nan"),
    (["--top-k", "-1"], "--top-k must be 0 (all tokens) or more, got -1"),
    (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
]


@pytest.mark.parametrize("args, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_options_are_one_line(args, message, tmp_path, capsys):
    assert cli.main(["sample", "anything", "--root", str(tmp_path), *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1 and message in err, err


def test_a_run_without_a_checkpoint_is_one_line(reference_run, tmp_path, capsys):
    run_dir = as_run(tmp_path, "fresh", reference_run)
    shutil.rmtree(run_dir / "checkpoints")
    assert cli.main(["sample", "fresh", "--root", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "error: fresh has no complete checkpoint yet (train.checkpoint_every=3); " \
                                "sample once one is saved\n"
    assert cli.main(["sample", "nope", "--root", str(tmp_path)]) == 2
    assert "nope" in capsys.readouterr().err
    assert json.loads((run_dir / "run.json").read_text())["name"] == "fresh"
