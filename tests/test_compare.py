"""``launcher compare``: figures from the runs' own metrics, on synthetic runs and on a real sweep."""
from __future__ import annotations

import csv
import io
import json
import re
import time

import pytest

from launcher import cli
from launcher.core.rundir import RunRecord, save_record


def fake_run(root, name, model, gpus, intervals, final=True, sweep="sweep-t"):
    """A run directory whose metrics.jsonl holds ``intervals`` = [(step, step_time, tokens_per_s, loss)]."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    save_record(RunRecord(name=name, run_dir=str(run_dir), model=model, gpus=gpus, nodes=max(1, gpus // 8),
                          gpus_per_node=min(gpus, 8), steps=intervals[-1][0], cluster="local",
                          submitted_at=time.time(), job_id=None, sweep=sweep))
    lines = [{"step": s, "step_time": t, "tokens_per_s": tps, "tokens_per_s_per_gpu": tps / gpus, "loss": loss,
              "mfu": None} for s, t, tps, loss in intervals]
    if final:
        steady = lines[1:]
        lines.append({"final": True, "step": lines[-1]["step"], "loss": lines[-1]["loss"],
                      "tokens_per_s": sum(r["tokens_per_s"] for r in steady) / len(steady),
                      "tokens_per_s_per_gpu": sum(r["tokens_per_s_per_gpu"] for r in steady) / len(steady),
                      "mfu": None})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (run_dir / "events.jsonl").write_text(json.dumps({"event": "finished" if final else "started"}) + "\n")


def test_speedup_efficiency_and_time_to_step_by_hand(tmp_path, capsys):
    fake_run(tmp_path, "a1", "gpt_tiny", 1, [(10, 9.0, 50, 4.0), (20, 1.0, 100, 3.0), (30, 1.0, 100, 2.5)])
    fake_run(tmp_path, "a4", "gpt_tiny", 4, [(10, 9.0, 50, 4.0), (20, 1.25, 320, 3.1), (30, 1.25, 320, 2.6)])
    fake_run(tmp_path, "b8", "gpt_small", 8, [(10, 2.0, 80, 5.0), (20, 2.0, 80, 4.0)], final=False)
    assert cli.main(["compare", "--sweep", "sweep-t", "--root", str(tmp_path), "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["a1"]["speedup"] == 1.0 and rows["a1"]["scaling_efficiency"] == 1.0
    assert rows["a4"]["speedup"] == pytest.approx(3.2)  # 320 / 100 tokens/s
    assert rows["a4"]["scaling_efficiency"] == pytest.approx(0.8)  # 3.2 / 4 GPUs
    assert rows["a4"]["median_step_time"] == 1.25  # the first (warm-up) interval is left out
    # The highest step all runs reached is 20 (b8 is still going): 10 steps x 9.0 s + 10 x 1.0 s.
    assert rows["a1"]["time_to_common_step"] == pytest.approx(100.0)
    assert rows["b8"]["time_to_common_step"] == pytest.approx(40.0)
    assert rows["b8"]["speedup"] == 1.0 and rows["b8"]["tokens_per_s"] == 80  # median of intervals so far

    assert cli.main(["compare", "a1", "a4", "b8", "--root", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "RUNNING" not in table and "(so far 20/20)" in table and "3.20x" in table and "80%" in table
    assert cli.main(["compare", "a1", "a4", "--root", str(tmp_path), "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["name"] for r in rows] == ["a1", "a4"] and float(rows[1]["speedup"]) == pytest.approx(3.2)


def test_compare_needs_runs(tmp_path, capsys):
    assert cli.main(["compare", "--root", str(tmp_path)]) == 2
    assert "name at least one run, or --sweep ID" in capsys.readouterr().err


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
    for gpus in (1, 2, 4):
        expected = finals[gpus]["tokens_per_s"] / finals[1]["tokens_per_s"]
        assert rows[gpus]["speedup"] == pytest.approx(expected)
        assert rows[gpus]["scaling_efficiency"] == pytest.approx(expected / gpus)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

    table = slurm.launcher("compare", "--sweep", sweep, root=tmp_path).stdout
    assert table.count("gpt_tiny") == 3 and "COMPLETED" in table
