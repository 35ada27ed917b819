"""Export on the local cluster: gpt_tiny on the default byte-level corpus and gpt_small on a BPE
dataset of 512 tokens train briefly as Slurm jobs on 2 ranks; each is exported, loads with transformers'
AutoModelForCausalLM and AutoTokenizer, computes our model's logits (fp32, within 1e-4), and continues a prompt
greedily with the same text as ``launcher sample --top-k 1``."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from support.helpers import wait_status

# One worker makes its two trained runs (a module-scoped fixture) for all the tests here.
pytestmark = pytest.mark.xdist_group("export")

transformers = pytest.importorskip("transformers")
STDLIB = Path(json.__file__).resolve().parents[1]
PROMPT = "def load(self"
RUNS = {"tiny": ("model=gpt_tiny", "train.steps=10", "train.checkpoint_every=5", "train.export_every=5"),
        "small": ("model=gpt_small", "train.steps=6", "model.vocab_size=512")}


@pytest.fixture(scope="module")
def trained(slurm, tmp_path_factory):
    """The run root with both runs COMPLETED (the BPE dataset prepared first)."""
    root, data = tmp_path_factory.mktemp("runs"), tmp_path_factory.mktemp("bpe") / "data"
    prep = slurm.launcher("data", "prepare", str(data), str(STDLIB / "json"), "--glob", "*.py", "--tokenizer",
                          "bpe:512", root=root, timeout=300)
    assert prep.returncode == 0, prep.stderr
    for name, overrides in RUNS.items():
        extra = [f"data.path={data}"] if name == "small" else []
        res = slurm.launcher(*overrides, *extra, "gpus=2", "train.log_every=2", f"name={name}", root=root)
        assert res.returncode == 0, res.stderr
    for name in RUNS:
        wait_status(slurm, root, name, {"COMPLETED"}, timeout=300)
    return root


@pytest.mark.parametrize("name", sorted(RUNS))
def test_an_export_loads_in_transformers_and_agrees_with_the_run(slurm, trained, tmp_path, name):
    out = tmp_path / f"{name}-hf"
    res = slurm.launcher("export", name, str(out), root=trained)
    assert res.returncode == 0, res.stderr
    from launcher.core.checkpoints import latest_checkpoint
    from launcher.core.config import load_run_config
    from launcher.train.generate import load_model

    cfg = load_run_config(trained / name / "config.yaml")
    ours = load_model(cfg.model, latest_checkpoint(trained / name), torch.device("cpu"))
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, cfg.model.vocab_size, (2, cfg.model.seq_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (hf(ids).logits - ours(ids)).abs().max().item() <= 1e-4

    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    prompt = tokenizer(PROMPT, return_tensors="pt").input_ids
    greedy = hf.generate(prompt, max_new_tokens=24, do_sample=False, attention_mask=torch.ones_like(prompt))
    sampled = slurm.launcher("sample", name, "--prompt", PROMPT, "--tokens", "24", "--top-k", "1", root=trained)
    assert sampled.returncode == 0, sampled.stderr
    assert sampled.stdout == tokenizer.decode(greedy[0], skip_special_tokens=True) + "\n"
    assert json.loads((out / "config.json").read_text())["activation_function"] == "gelu"


def test_exports_while_training_run_beside_the_ranks_and_are_recorded(trained):
    """On Slurm, the main rank's background exports finish before the job step ends (the task waits for them)."""
    from support.helpers import events

    done = {e["step"]: e for e in events(trained / "tiny") if e["event"] == "exported"}
    assert sorted(done) == [5, 10] and all(Path(e["path"]).is_dir() for e in done.values())
    hf = transformers.AutoModelForCausalLM.from_pretrained(done[10]["path"])
    assert hf.config.n_layer == 2


def test_eval_scores_the_runs_own_validation_split_and_describe_shows_it(slurm, trained):
    from launcher.core.config import load_run_config

    data = load_run_config(trained / "small" / "config.yaml").data.path
    res = slurm.launcher("eval", "small", "--data", data, "--json", root=trained)
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    assert (result["step"], result["split"], result["device"]) == (6, "val", "cpu") and 0 < result["loss"] < 10
    described = slurm.launcher("describe", "small", root=trained)
    assert f"step        6  loss {result['loss']:.4f}" in described.stdout, described.stdout
