"""``launcher export``: a 2-rank run's sharded checkpoint becomes a Hugging Face model directory that transformers
loads as GPT2LMHeadModel and that computes what our model computes: the same logits (fp32, within 1e-4) and the
same greedy continuation; its tokenizer loads with AutoTokenizer and encodes as the run's did. Sharded above a
size, in bf16 on request; every refusal is one line and leaves nothing behind."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from launcher import cli
from launcher.core.checkpoints import step_dir
from launcher.core.config import load_run_config
from launcher.dataset.tokenizer import BYTE
from launcher.train.hf_export import numel
from launcher.train.generate import generate, load_model
from launcher.train.hf import gpt2_tensors
from support.train_harness import as_run

# The cluster tier without Slurm: real multi-rank training on gloo, seconds of CPU a test (docs/development.md).
# One worker makes its exported reference run (a module-scoped fixture) for all the tests here.
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("export")]

transformers = pytest.importorskip("transformers")

PROMPT = "import os\ndef "
STDLIB = Path(json.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def exported(reference_run, tmp_path_factory):
    """The reference run recorded as ``ref`` and exported in fp32 to OUT: (root, run directory, OUT)."""
    root = tmp_path_factory.mktemp("runs")
    run_dir = as_run(root, "ref", reference_run)
    out = root.parent / "ref-hf"
    assert cli.main(["export", "ref", str(out), "--root", str(root)]) == 0
    return root, run_dir, out


def ours(run_dir, step=6):
    cfg = load_run_config(run_dir / "config.yaml")
    return cfg, load_model(cfg.model, step_dir(run_dir, step), torch.device("cpu"))


def test_the_export_loads_in_transformers_and_computes_the_same_logits(exported):
    _, run_dir, out = exported
    cfg, model = ours(run_dir)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "GPT2LMHeadModel"
    config = json.loads((out / "config.json").read_text())
    assert config["activation_function"] == "gelu" and config["n_positions"] == cfg.model.seq_len
    ids = torch.randint(0, cfg.model.vocab_size, (2, cfg.model.seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        difference = (hf(ids).logits - model(ids)).abs().max().item()
    assert difference <= 1e-4


def test_greedy_generation_and_the_tokenizer_agree_with_the_runs(exported):
    _, run_dir, out = exported
    _, model = ours(run_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    prompt = tokenizer(PROMPT, return_tensors="pt").input_ids
    assert prompt[0].tolist() == BYTE.encode(PROMPT)  # byte-level: id = byte value
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    greedy = hf.generate(prompt, max_new_tokens=15, do_sample=False, attention_mask=torch.ones_like(prompt))
    mine = generate(model, BYTE.encode(PROMPT), 15, 1.0, 1, 0)  # within seq_len 32: no window
    assert greedy[0, prompt.shape[1]:].tolist() == mine
    assert tokenizer.decode(greedy[0]) == PROMPT + BYTE.decode(mine)


def test_the_model_card_says_what_the_model_is(exported):
    _, _, out = exported
    card = (out / "README.md").read_text()
    assert card.startswith("# ref\n") and "| steps | 6 of 6 |" in card and "| tokenizer | byte |" in card
    assert "| tokens seen | 1,536 (256 per step) |" in card and "| final eval loss | " in card
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
         "special_tokens_map.json", "README.md"])
    assert oct(out.stat().st_mode & 0o777) == "0o755"


def test_sharded_and_bf16_exports_load_and_agree(exported, tmp_path):
    root, run_dir, _ = exported
    _, model = ours(run_dir, step=3)
    out = tmp_path / "sharded"
    assert cli.main(["export", "ref", str(out), "--root", str(root), "--step", "3", "--max-shard-size", "20KB"]) == 0
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and files == sorted(p.name for p in out.glob("model-*-of-*.safetensors"))
    tensors = gpt2_tensors(load_run_config(run_dir / "config.yaml").model)
    assert index["metadata"]["total_size"] == 4 * sum(numel(t) for t in tensors) == sum(
        os.path.getsize(out / f) - 8 - int.from_bytes((out / f).read_bytes()[:8], "little") for f in files)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.arange(16).unsqueeze(0)
    with torch.no_grad():
        assert (hf(ids).logits - model(ids)).abs().max().item() <= 1e-4
    half = tmp_path / "bf16"
    assert cli.main(["export", "ref", str(half), "--root", str(root), "--dtype", "bf16"]) == 0
    assert transformers.AutoModelForCausalLM.from_pretrained(half).dtype == torch.bfloat16


def test_refusals_are_one_line_and_leave_nothing(exported, tmp_path, capsys):
    root, run_dir, out = exported
    capsys.readouterr()

    def refused(*args):
        assert cli.main(["export", "ref", *args, "--root", str(root)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
        return err

    assert f"{out} exists and is not empty; choose another OUT, or --force" in refused(str(out))
    assert "no complete checkpoint at step 4 (its checkpoints: 3, 6)" in refused(str(tmp_path / "a"), "--step", "4")
    assert "--max-shard-size 'big'" in refused(str(tmp_path / "b"), "--max-shard-size", "big")
    assert "holds the run ref itself" in refused(str(run_dir.parent), "--force")
    assert "--to-local copies an export from a remote cluster; ref is a run on this machine" in refused(
        str(tmp_path / "d"), "--to-local", str(tmp_path / "e"))
    shard = sorted((run_dir / "checkpoints" / "step_00000003").glob("__0_*.distcp"))[0]
    saved = shard.read_bytes()
    shard.write_bytes(saved[:-1] + bytes([saved[-1] ^ 0xFF]))
    try:
        assert f"checkpoint at step 3 is damaged: {shard.name}" in refused(str(tmp_path / "c"), "--step", "3")
    finally:
        shard.write_bytes(saved)
    bpe = tmp_path / "bpe"
    assert cli.main(["data", "prepare", str(bpe), str(STDLIB / "json"), "--glob", "*.py", "--tokenizer",
                     "bpe:300"]) == 0
    capsys.readouterr()  # its progress lines
    (bpe / "tokenizer.json").unlink()
    config = run_dir / "config.yaml"
    saved_config = config.read_text()
    config.write_text(saved_config.replace(f"path: {load_run_config(config).data.path}", f"path: {bpe}"))
    try:
        assert f"{bpe / 'tokenizer.json'} is missing" in refused(str(tmp_path / "f"))
    finally:
        config.write_text(saved_config)
    shutil.rmtree(bpe)
    capsys.readouterr()
    assert not [p for p in tmp_path.iterdir()]  # nothing written, not even a hidden work directory
    assert cli.main(["export", "ref", str(out), "--root", str(root), "--force"]) == 0  # replaced whole
    assert transformers.AutoModelForCausalLM.from_pretrained(out) is not None


def test_exports_while_training_are_written_beside_the_run_and_a_failed_one_is_an_event(reference_config, tmp_path):
    """train.export_every=3 with keep_checkpoints=1: the step-3 checkpoint is pruned by the step-6 save, yet its
    export (reading files linked aside) completes; both load. With RUN/hf a file, the exports fail and the run
    still finishes, each failure an event."""
    from support import train_workers
    from support.helpers import events
    from support.train_harness import launch_forked, make_run_dir

    config = {**reference_config, "train": {**reference_config["train"], "export_every": 3, "keep_checkpoints": 1}}
    run_dir = make_run_dir(tmp_path / "run", config, world_size=2, micro_batch=2)
    launch_forked(train_workers.train_run, (run_dir,), world_size=2)
    exported = [e for e in events(run_dir) if e["event"] == "exported"]
    assert sorted(e["step"] for e in exported) == [3, 6] and not (run_dir / "hf" / ".held").exists() or \
        not list((run_dir / "hf" / ".held").iterdir())
    assert not (run_dir / "checkpoints" / "step_00000003").exists()  # pruned while its export read it
    _, model = ours(run_dir)
    hf = transformers.AutoModelForCausalLM.from_pretrained(run_dir / "hf" / "step_00000006").eval()
    ids = torch.arange(20).unsqueeze(0)
    with torch.no_grad():
        assert (hf(ids).logits - model(ids)).abs().max().item() <= 1e-4
    assert transformers.AutoModelForCausalLM.from_pretrained(run_dir / "hf" / "step_00000003") is not None

    broken = make_run_dir(tmp_path / "broken", config, world_size=2, micro_batch=2)
    (broken / "hf").write_text("not a directory")
    launch_forked(train_workers.train_run, (broken,), world_size=2)
    kinds = [e["event"] for e in events(broken)]
    assert kinds.count("export_failed") == 2 and "finished" in kinds and "exported" not in kinds


def exports_of(run_dir: Path) -> list:
    """The pids of the export processes of ``run_dir`` still running on this machine."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(run_dir).encode() in argv and any(b"launcher.train.hf_export" in arg for arg in argv):
            found.append(int(proc.name))
    return found


def test_an_attempt_preempted_while_it_exports_stops_the_export_and_the_next_attempt_redoes_it(reference_config,
                                                                                             tmp_path):
    """Preempted just after the step-3 export began: the ranks act on it at the next save (step 6: its steps are
    far shorter than the 10 s between agreements), which ends the attempt requeued, the export of step 3 stopped (not
    left running as an orphan of the ended job) and that of step 6 held; the resumed attempt exports both as it
    begins, then 9."""
    from support import train_workers
    from support.helpers import events
    from support.train_harness import launch_forked, make_run_dir

    config = {**reference_config, "train": {**reference_config["train"], "export_every": 3, "steps": 9}}
    run_dir = make_run_dir(tmp_path / "run", config, world_size=2, micro_batch=2)
    launch_forked(train_workers.train_run_preempted_in_export, (run_dir, 3), world_size=2)
    kinds = [(e["event"], e.get("step")) for e in events(run_dir)]
    assert ("requeued", 6) in kinds and not [k for k in kinds if k[0].startswith("export")], kinds
    held = run_dir / "hf" / ".held"
    assert sorted(p.name for p in held.iterdir() if p.is_dir()) == ["step_00000003", "step_00000006"]
    assert not (run_dir / "hf" / "step_00000003").exists()
    assert not exports_of(run_dir)  # its export ended with the attempt
    launch_forked(train_workers.train_run, (run_dir,), world_size=2)
    exported = [e["step"] for e in events(run_dir) if e["event"].startswith("export")]
    assert sorted(exported) == [3, 6, 9] and [e["event"] for e in events(run_dir)].count("exported") == 3
    assert not list((run_dir / "hf" / ".held").iterdir())
    assert transformers.AutoModelForCausalLM.from_pretrained(run_dir / "hf" / "step_00000003") is not None


def test_an_export_cut_short_is_redone_by_the_next_attempt(reference_run, tmp_path):
    """An attempt that ends while its export runs (requeued, failed) stops the export; the held checkpoint it leaves,
    and only that, makes the next attempt export that step again, clearing the work left half-written."""
    from support.helpers import events
    from launcher.train.hf_export import Exports

    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    cut = Exports(run_dir)
    cut.start(6)
    cut.stop()  # as the attempt's end does, long before an export that imports torch can finish
    held, out = run_dir / "hf" / ".held" / "step_00000006", run_dir / "hf" / "step_00000006"
    assert sorted(p.name for p in held.iterdir()) == sorted(p.name for p in step_dir(run_dir, 6).iterdir())
    assert not out.exists() and not [e for e in events(run_dir) if e["event"].startswith("export")]
    half = run_dir / "hf" / ".step_00000006.x1y2"  # what a killed export_run leaves beside its output
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"partial")

    Exports(run_dir).wait()  # the next attempt's, as it is made
    assert [(e["event"], e["step"]) for e in events(run_dir) if e["event"].startswith("export")] == [("exported", 6)]
    assert transformers.AutoModelForCausalLM.from_pretrained(out) is not None
    assert sorted(p.name for p in (run_dir / "hf").iterdir()) == [".held", "step_00000006", "step_00000006.log"]
    assert not list(held.parent.iterdir())
    Exports(run_dir).wait()  # nothing left to redo: nothing is exported again
    assert sum(e["event"] == "exported" for e in events(run_dir)) == 1
