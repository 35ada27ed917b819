"""``launcher resume RUN gpus=N`` (launcher/submit/relayout.py): a layout the run's global batch cannot take, or
anything but a GPU count, is refused in one line before anything of the run is written; an accepted one rewrites
the run's config, plan, run file and record for the new count, its global batch kept. Slurm is not reached here
(the quick tier's stubs): the resumed job itself runs in tests/cluster/test_stop.py."""
from __future__ import annotations

import json

import pytest

from launcher import cli
from launcher.compose.composer import compose_runs
from launcher.core.plan import read_plan
from launcher.core.run_index import RunRecord, create_run_dir, save_record
from launcher.submit.relayout import relayout
from launcher.submit.submitter import write_run_files


@pytest.fixture
def run(tmp_path):
    """A run of gpt_tiny on 2 GPUs (global batch 4), made as a launch makes it, without Slurm."""
    (composed,) = compose_runs(["gpus=2", "model=gpt_tiny", "train.steps=20", f"run_root={tmp_path}"])
    run_dir = create_run_dir(tmp_path, "tiny", explicit=True)
    write_run_files(composed, run_dir)
    record = RunRecord(name="tiny", run_dir=str(run_dir), model="gpt_tiny", gpus=2, nodes=1, gpus_per_node=2,
                       steps=20, cluster="local", submitted_at=1.0, job_id="7")
    save_record(record)
    return record


def files(run: RunRecord) -> dict:
    return {name: open(f"{run.run_dir}/{name}").read() for name in ("config.yaml", "plan.json", "run.yaml", "run.json")}


@pytest.mark.parametrize("layout, said", [
    (["gpus=3"], "gpus=3 cannot train tiny's global batch of 4 sequences, which a resume keeps (one share a GPU): use "
                 "gpus= one of 1, 2, 4"),
    (["gpus=0"], "gpus=0 is not a number of GPUs; resume takes a new number of GPUs, gpus=N (the run's global batch "
                 "is kept)"),
    (["model=gpt_small"], "resume takes a new number of GPUs, gpus=N (the run's global batch is kept), nothing else; "
                          "got 'model=gpt_small'"),
    (["gpus=4", "train.lr=1"], "resume takes a new number of GPUs, gpus=N (the run's global batch is kept), nothing "
                               "else; got 'gpus=4 train.lr=1'"),
])
def test_a_layout_the_run_cannot_take_is_refused_in_one_line_and_nothing_is_written(run, tmp_path, capsys, layout,
                                                                                   said):
    before = files(run)
    assert cli.main(["resume", "tiny", *layout, "--root", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: {said}\n"
    assert files(run) == before


def test_another_gpu_count_rewrites_the_run_for_it_keeping_its_global_batch(run):
    """gpus=4 is two nodes of two (conf/gpus/4.yaml); each GPU's share of the 4 sequences is 1, so the run's
    micro-batch of 2 becomes 1."""
    before = read_plan(run.run_dir)
    assert (before.micro_batch, before.grad_accum) == (2, 1)
    assert relayout(run, 4) == ("2 GPUs (1 x 2) to 4 GPUs (2 x 2)", [])
    after = read_plan(run.run_dir)
    assert (after.gpus, after.world_size, after.global_batch, after.micro_batch, after.grad_accum) == (4, 4, 4, 1, 1)
    record = json.loads(open(f"{run.run_dir}/run.json").read())
    assert (record["gpus"], record["nodes"], record["gpus_per_node"], record["job_id"]) == (4, 2, 2, "7")
    assert "gpus: 4" in open(f"{run.run_dir}/run.yaml").read()
