"""``launcher compare``: figures from the runs' own metrics, on synthetic runs and on a real sweep."""
from __future__ import annotations

import json
import re

import pytest



def test_sweep_on_the_cluster_compares_and_plots(slurm, tmp_path):
    res = slurm.launcher("-m", "gpus=1,2,4", "model=gpt_tiny", "train.steps=30", "train.log_every=5",
                         root=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    sweep = re.search(r"Submitted sweep (\S+):", res.stdout).group(1)
    records = [json.loads(p.read_text()) for p in tmp_path.glob("*/run.json")]
    for rec in records:
        assert slurm.wait(rec["job_id"], timeout=300) == "COMPLETED"

    png = tmp_path / "compare.png"
    out = slurm.launcher("compare", "--sweep", sweep, "--json", "--plot", str(png), root=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = {r["gpus"]: r for r in json.loads(out.stdout)}
    assert sorted(rows) == [1, 2, 4]
    finals = {}
    for rec in records:
        metrics = [json.loads(line) for line in (tmp_path / rec["name"] / "metrics.jsonl").read_text().splitlines()]
        finals[rec["gpus"]] = metrics[-1]
        assert metrics[-1]["final"] and rows[rec["gpus"]]["final_loss"] == metrics[-1]["loss"]
    for rec in records:
        plan = json.loads((tmp_path / rec["name"] / "plan.json").read_text())
        row = rows[rec["gpus"]]
        assert row["tokens_per_s"] * row["median_step_time"] == pytest.approx(plan["tokens_per_step"])
        expected = row["tokens_per_s"] / rows[1]["tokens_per_s"]
        assert row["speedup"] == pytest.approx(expected)
        assert row["scaling_efficiency"] == pytest.approx(expected / rec["gpus"])
        assert row["sweep"] == sweep
        assert ("CPU" in row["mfu_note"]) if row["mfu"] is None else row["mfu_note"] is None  # CPU, or real GPUs
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

    table = slurm.launcher("compare", "--sweep", sweep[:-2], root=tmp_path).stdout  # a unique prefix
    assert table.count("gpt_tiny") == 3 and "COMPLETED" in table
    assert ("MFU n/a: on the local cluster" in table) == (rows[1]["mfu"] is None)
