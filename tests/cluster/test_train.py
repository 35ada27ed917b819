"""End to end on the local cluster: gpt_tiny trains across 2 nodes x 2 tasks, reports progress where
plain squeue shows it, and leaves complete metrics and a checkpoint."""
from __future__ import annotations

import json
import re

from support.helpers import TASKS_WITHOUT_SLURM, job_id_of, wait_for

FIELDS = {"step", "loss", "eval_loss", "lr", "grad_norm", "step_time", "tokens_per_s", "tokens_per_s_per_gpu",
          "mfu", "peak_mem_gb"}


def test_gpt_tiny_trains_on_two_nodes_and_squeue_shows_its_progress(slurm, tmp_path):
    # The tasks cannot reach Slurm (as in a container without its client): the comment is set from the host.
    res = slurm.launcher("gpus=4", "model=gpt_tiny", "train.steps=120", "train.log_every=10",
                         "train.eval_every=40", "name=e2e", TASKS_WITHOUT_SLURM, root=tmp_path)
    assert res.returncode == 0, res.stderr
    job = job_id_of(res.stdout)
    comments = set()

    def left_the_queue():  # what squeue shows of the job meanwhile is kept in comments
        out = slurm.run("squeue", "-h", "-j", job, "-o", "%.10i %.40k", check=False).stdout.strip()
        comments.add(out.split(None, 1)[1] if " " in out.strip() else "")
        return not out

    wait_for(left_the_queue, 300, f"end of job {job} in squeue")
    assert slurm.wait(job) == "COMPLETED"
    progress = [c for c in comments if re.fullmatch(r"(step \d+/120|done 120/120) loss \d+\.\d+( tok/s \d+)?", c)]
    assert progress, f"squeue never showed the progress comment; saw {comments}"

    run_dir = tmp_path / "e2e"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged, final = records[:-1], records[-1]
    assert [r["step"] for r in logged] == list(range(10, 121, 10))
    assert all(FIELDS <= set(r) for r in logged) and final["final"] is True
    assert all(r["mfu"] is None for r in records)  # no MFU on CPU: no known peak
    assert logged[-1]["loss"] < logged[0]["loss"] - 1.0  # it learns (byte-level loss from ~5.5)
    assert [r["eval_loss"] is not None for r in logged] == [r["step"] % 40 == 0 for r in logged]
    assert (run_dir / "checkpoints" / "step_00000120").is_dir()
    nodes = {re.search(r"node (\S+) device", (run_dir / "logs" / f"rank_{r}.log").read_text()).group(1)
             for r in range(4)}
    assert nodes == set(slurm.nodes)
