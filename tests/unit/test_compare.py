"""``launcher compare``: figures from the runs' own metrics, on synthetic runs and on a real sweep."""
from __future__ import annotations

import csv
import io
import json
import time

import pytest

from launcher import cli
from launcher.commands.compare import step_time
from launcher.core.run_index import RunRecord, save_record


def fake_run(root, name, model, gpus, intervals, final=True, sweep="sweep-t", cluster="local", mfu_per_step=None):
    """A run directory whose metrics.jsonl holds ``intervals`` = [(step, step_time, tokens_per_s, loss)]; each
    interval's MFU is ``mfu_per_step / step_time`` when that is given (as training measures it), else null."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    save_record(RunRecord(name=name, run_dir=str(run_dir), model=model, gpus=gpus, nodes=max(1, gpus // 8),
                          gpus_per_node=min(gpus, 8), steps=intervals[-1][0], cluster=cluster,
                          submitted_at=time.time(), job_id=None, sweep=sweep))
    lines = [{"step": s, "step_time": t, "tokens_per_s": tps, "tokens_per_s_per_gpu": tps / gpus, "loss": loss,
              "mfu": mfu_per_step / t if mfu_per_step else None} for s, t, tps, loss in intervals]
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


def test_step_time_and_tokens_per_s_come_from_the_same_intervals(tmp_path, capsys):
    # 512 tokens per step; the steady step times (the first interval is warm-up) are 1.0, 2.0, 4.0, 1.5 s, median
    # 1.75 s. The median of the intervals' tok/s on its own would be 298.7, and the final record's whole-run
    # figure 200: neither agrees with a 1.75 s step.
    times = [5.0, 1.0, 2.0, 4.0, 1.5]
    fake_run(tmp_path, "r", "gpt_tiny", 2, [(10 * (i + 1), t, 512 / t, 3.0) for i, t in enumerate(times)])
    assert cli.main(["compare", "r", "--root", str(tmp_path), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert row["median_step_time"] == 1.75 and row["tokens_per_step"] == pytest.approx(512)
    assert row["tokens_per_s"] * row["median_step_time"] == pytest.approx(512)
    assert row["tokens_per_s_per_gpu"] * 2 == pytest.approx(row["tokens_per_s"])
    assert row["mfu"] is None and row["mfu_note"].startswith("on the local cluster CPU processes stand in for GPUs")

    assert cli.main(["compare", "r", "--root", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "STEP TIME (median)" in lines[0] and "TOK/S (median)" in lines[0]
    cells = lines[2].split()
    assert cells[4:8] == ["1.750", "s", "293", "146"] and cells[8] == "n/a"
    assert lines[3:] == [
        "(median): STEP TIME is the median over the log intervals after the first (warm-up); TOK/S and TOK/S/GPU are "
        "taken at that step time, so TOK/S x STEP TIME = tokens per step",
        "MFU n/a: on the local cluster CPU processes stand in for GPUs, and a CPU has no peak FLOP/s to divide by"]
    assert [step_time(t) for t in (0.00433, 0.0667, 1.75, None)] == ["4.3 ms", "66.7 ms", "1.750 s", ""]


def test_mfu_is_taken_at_the_median_step_time_and_its_absence_explained(tmp_path, capsys):
    fake_run(tmp_path, "gpu", "gpt_tiny", 8, [(10, 9.0, 50, 4.0), (20, 1.0, 400, 3.0), (30, 3.0, 133, 2.9),
                                              (40, 2.0, 200, 2.8)], cluster="slurm", mfu_per_step=0.8)
    fake_run(tmp_path, "site", "gpt_tiny", 8, [(10, 1.0, 50, 4.0), (20, 1.0, 50, 3.0)], cluster="slurm")
    (tmp_path / "site" / "config.yaml").write_text("cluster:\n  name: slurm\n  gpu_type: mi300x\n")
    fake_run(tmp_path, "here", "gpt_tiny", 2, [(10, 1.0, 50, 4.0), (20, 1.0, 50, 3.0)], mfu_per_step=0.3)
    assert cli.main(["compare", "here", "--root", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["hardware"] == "local cluster: real GPUs"  # it measured an MFU
    assert cli.main(["compare", "gpu", "site", "--root", str(tmp_path), "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["gpu"]["mfu"] == pytest.approx(0.4) and rows["gpu"]["mfu_note"] is None  # 0.8 / the 2.0 s median
    assert rows["site"]["mfu"] is None and "no peak FLOP/s known" in rows["site"]["mfu_note"]
    assert rows["site"]["hardware"] == "cluster slurm: mi300x GPUs"
    assert rows["gpu"]["hardware"] == "cluster slurm: GPU type not set"
    assert cli.main(["compare", "gpu", "site", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "40.0%" in out and "MFU n/a (site): no peak FLOP/s known" in out


def test_the_plot_reads_without_the_table(tmp_path):
    from launcher.status.scaling import compare
    from launcher.views.scaling_plot import figure
    from launcher.core.run_index import list_records

    fake_run(tmp_path, "one", "gpt_tiny", 1, [(10, 2.0, 50, 4.0), (20, 1.0, 100, 3.0)], sweep="sweep-p")
    fake_run(tmp_path, "four", "gpt_tiny", 4, [(10, 2.0, 50, 4.0), (20, 1.25, 320, 3.1)], sweep="sweep-p")
    fig = figure(compare(list_records(tmp_path)))
    speed, loss = fig.axes
    assert fig._suptitle.get_text() == "Sweep sweep-p\nlocal cluster: CPU processes stand in for GPUs"
    assert (speed.get_xscale(), speed.get_yscale()) == ("linear", "linear")
    assert [t.get_text() for t in speed.get_xticklabels()] == ["1", "4"]
    fig.canvas.draw()
    assert any(t.get_text() == "200" for t in speed.get_yticklabels())
    assert [t.get_text() for t in speed.get_legend().get_texts()] == [
        "gpt_tiny: measured", "gpt_tiny: ideal (linear from 1 GPU)"]
    assert sorted(t.get_text() for t in speed.texts) == ["100", "320"]  # each point labelled with its tokens/s
    assert [t.get_text() for t in loss.get_legend().get_texts()] == ["one (1 GPU)", "four (4 GPUs)"]
    ideal = speed.get_lines()[1].get_ydata()
    assert list(ideal) == [100, 400]
