"""``plan`` learns from measured runs (launcher/core/measured.py, launcher/forecast/learned.py): a completed run's
forecast kept beside what it measured, the correction of a similar run's plan and its words, the launch gate's
caution, and ``launcher plan --accuracy``'s numbers, on real run files (forecast.json, plan.json and config.yaml as
the launch writes them, metrics rows as the trainer appends them); the behaviour on the local cluster:
tests/cluster/test_learned_forecast.py."""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
from pathlib import Path
from typing import List

import pytest

from launcher import cli
from launcher.compose.composer import compose_runs
from launcher.core.measured import (Forecast, Measured, _schema, measured_path, read_forecast, read_measured,
                                    record_completed)
from launcher.core.metrics import FinalRow, Row
from launcher.core.rundir import METRICS, append_metrics
from launcher.forecast.gate import fit_findings, time_budget
from launcher.forecast.learned import SIMILAR_SIZE, StepTime, corrected_step, seconds
from launcher.forecast.target import hardware_for, precision_of
from launcher.submit.submitter import write_run_files

H100 = ("cluster=slurm", "cluster.gpu_type=h100")
GIB = 2**30


@pytest.fixture
def root(tmp_path, monkeypatch):
    path = tmp_path / "runs"
    path.mkdir(mode=0o700)
    monkeypatch.setenv("LAUNCHER_RUN_ROOT", str(path))
    return path


def composed(root: Path, *overrides: str):
    (run,) = compose_runs([*overrides, f"run_root={root}"])
    return run


def completed(root: Path, run, name: str, step: float | None = None, memory: float | None = None,
              tokens: float = 1000.0) -> dict:
    """A run of ``run``'s shape that completed, measuring ``step`` times the formula's step time and ``memory``
    times its memory per GPU (in the trainer's GB): its files as the launch writes them, its rows as rank 0
    appends them, and its line appended as the job's end step appends it. Returns its forecast."""
    run_dir = root / name
    run_dir.mkdir()
    write_run_files(run, run_dir)
    forecast = read_forecast(run_dir)
    measured_step = forecast.step_time_s * step if step else None
    peak_gb = forecast.mem_per_gpu_gib * memory * GIB / 1e9 if memory else None
    append_metrics(run_dir / METRICS, Row(step=5, loss=5.0, step_time=measured_step, peak_mem_gb=peak_gb))
    append_metrics(run_dir / METRICS, FinalRow.after(Row(step=10, loss=4.0), step_time=measured_step,
                                                     peak_mem_gb=peak_gb, tokens_per_s=tokens, steps_run=10))
    assert record_completed(run_dir) is not None
    return forecast.to_dict()


def output(capsys, *argv: str) -> str:
    """What ``launcher ARGV`` prints, run in this process; it must exit 0."""
    capsys.readouterr()
    assert cli.main(list(argv)) == 0
    return capsys.readouterr().out


def test_a_completed_run_keeps_its_forecast_beside_what_it_measured(root):
    run = composed(root, *H100, "model=gpt_tiny", "gpus=8")
    forecast = completed(root, run, "tiny-a", step=0.8, memory=0.5)
    (line,) = read_measured(root, "slurm")
    assert forecast["gpu"] == "h100" and forecast["params"] == run.plan.params and forecast["gpus"] == 8
    assert line.run == "tiny-a" and line.forecast.to_dict() == forecast
    assert line.step_time_s == pytest.approx(0.8 * forecast["step_time_s"])
    assert line.peak_mem_gib == pytest.approx(0.5 * forecast["mem_per_gpu_gib"])
    assert line.tokens_per_s == 1000.0
    # A run without a final row (failed, or still training) adds nothing.
    unfinished = root / "tiny-b"
    unfinished.mkdir()
    write_run_files(run, unfinished)
    append_metrics(unfinished / METRICS, Row(step=5, loss=5.0, step_time=0.1))
    assert record_completed(unfinished) is None and len(read_measured(root, "slurm")) == 1


def test_a_similar_run_is_corrected_and_says_so_and_others_are_not(root, capsys):
    run = composed(root, *H100, "model=gpt_tiny", "gpus=8")
    for name, ratio in (("a", 0.8), ("b", 0.85), ("c", 0.9)):
        completed(root, run, name, step=ratio, memory=0.5)
    h200 = composed(root, "cluster=slurm", "cluster.gpu_type=h200", "model=gpt_tiny", "gpus=8")
    completed(root, h200, "other-gpu", step=3.0, memory=3.0)  # another GPU type: not similar
    big = composed(root, *H100, "model=gpt_small", "gpus=8")
    assert big.plan.params > SIMILAR_SIZE * run.plan.params  # another size: not similar
    completed(root, big, "other-size", step=3.0, memory=3.0)

    out = output(capsys, "plan", *H100, "model=gpt_tiny", "gpus=8")
    formula = read_forecast(root / "a").step_time_s
    corrected = formula * 0.85
    assert (f"step time {seconds(corrected)} (formula {seconds(formula)}, corrected by 3 runs on this "
            "cluster: measured/formula 0.85 +- 0.05)") in out
    assert "memory per GPU" in out and "measured/formula 0.50 +- 0.00" in out
    data = json.loads(output(capsys, "plan", "--json", *H100, "model=gpt_tiny", "gpus=8"))
    assert data["step_time_s"] == pytest.approx(formula)  # the formula's figures stay what they were
    assert data["corrected"]["step_time_s"] == pytest.approx(corrected)
    assert data["corrected"]["step_ratio"] == {"mean": pytest.approx(0.85), "spread": pytest.approx(0.05),
                                               "runs": 3}
    dry = output(capsys, *H100, "model=gpt_tiny", "gpus=8", "dry_run=true")
    assert f"step time {seconds(corrected)} (formula {seconds(formula)}, corrected by 3 runs" in dry
    # No similar run (an A100 here has none): nothing new is said.
    a100 = ("cluster=slurm", "cluster.gpu_type=a100", "model=gpt_tiny", "gpus=8")
    assert "corrected by" not in output(capsys, "plan", *a100)
    assert "corrected by" not in output(capsys, *a100, "dry_run=true")
    assert json.loads(output(capsys, "plan", "--json", *a100))["corrected"] is None


def test_the_step_time_is_corrected_by_the_similar_runs_and_is_the_formulas_without_them(root):
    def step(*overrides: str) -> StepTime:
        run = composed(root, "model=gpt_tiny", "gpus=8", *overrides)
        return corrected_step(run.config, run.plan, hardware_for(run.config.cluster, precision_of(run.config)))

    formula = completed(root, composed(root, *H100, "model=gpt_tiny", "gpus=8"), "a", step=0.8)["step_time_s"]
    assert step(*H100) == (pytest.approx(formula), pytest.approx(0.8 * formula))
    assert step(*H100, "cluster.ssh=login.example") == (pytest.approx(formula),) * 2  # its runs' file is there
    a100 = step("cluster=slurm", "cluster.gpu_type=a100")
    assert a100.corrected == a100.formula is not None  # no similar run
    assert step("cluster=slurm") == (None, None)  # a GPU of unknown speed


def test_the_gate_takes_the_measured_memory_only_where_it_is_more_cautious(root):
    def findings(*overrides: str):
        return [f.text for f in fit_findings(0, composed(root, *H100, "model=gpt_tiny", "gpus=8", *overrides), None)
                if f.refuses]

    shape = composed(root, *H100, "model=gpt_tiny", "gpus=8")
    formula_gib = read_forecast_of(root, shape)
    roomy, tight = f"cluster.gpu_memory_gb={formula_gib * 1.5:.3f}", f"cluster.gpu_memory_gb={formula_gib * 0.9:.3f}"
    assert findings(roomy) == [] and len(findings(tight)) == 1  # the formula alone
    completed(root, shape, "low", memory=0.5)  # measured below the formula: changes nothing either way
    assert findings(roomy) == [] and len(findings(tight)) == 1
    for name in ("high-1", "high-2"):
        completed(root, shape, name, memory=2.5)  # mean ratio (0.5 + 2.5 + 2.5) / 3 = 1.83: more cautious
    (refusal,) = findings(roomy)
    assert (f"memory per GPU {formula_gib * 5.5 / 3:,.2f} GiB (formula {formula_gib:,.2f} GiB, corrected by 3 runs "
            "on this cluster: measured/formula 1.83 +- 1.15), more than the GPU's") in refusal
    assert "force=true" in refusal
    assert findings(roomy, "train.micro_batch=auto") == []  # training halves its micro-batch where it runs out
    assert [f.refuses for f in fit_findings(0, composed(root, *H100, "model=gpt_tiny", "gpus=8", roomy,
                                                        "force=true"), None)] == [False]
    # The local cluster's ranks are CPUs: their resident memory says nothing of the stand-in GPU's.
    local = composed(root, "model=gpt_tiny", "gpus=1")
    long = composed(root, "model=gpt_tiny", "gpus=1", "train.steps=1000000")
    assert time_budget(long) is None  # a million steps of the stand-in H100's
    for name in ("cpu-1", "cpu-2"):
        completed(root, local, name, step=1e6, memory=3.0)
    assert [f for f in fit_findings(0, local, None) if f.refuses] == []
    # Its step time is learned all the same: the time budget's warning takes it.
    assert "s per step (H100 stand-in, corrected by its cluster's completed runs) take" in time_budget(long)


def read_forecast_of(root: Path, run) -> float:
    probe = root / ".probe"
    probe.mkdir()
    write_run_files(run, probe)
    gib = read_forecast(probe).mem_per_gpu_gib
    for path in probe.iterdir():
        path.unlink()
    probe.rmdir()
    return gib


def test_accuracy_prints_each_runs_error_before_and_after_leave_one_out(root, capsys):
    run = composed(root, *H100, "model=gpt_tiny", "gpus=8")
    # measured/formula of step time and memory, in the order the runs completed.
    ratios = {"r1": (0.5, 0.8), "r2": (0.6, 1.2), "r3": (0.7, 0.9), "r4": (0.55, 1.1)}
    for name, (step, mem) in ratios.items():
        formula = completed(root, run, name, step=step, memory=mem)
    with open(measured_path(root, "slurm"), "a") as f:
        f.write("not json\n{\"run\": 3}\n")  # damaged lines: skipped, the rest is read

    data = json.loads(output(capsys, "plan", "--accuracy", "--json"))
    (cluster,) = data["clusters"]
    assert cluster["cluster"] == "slurm"
    # Before: forecast/measured - 1 = 1/ratio - 1. After: the mean ratio of the runs before it, over this one's.
    names = list(ratios)
    before = {n: 1 / s - 1 for n, (s, _) in ratios.items()}
    after = {n: (statistics.fmean([ratios[m][0] for m in names[:i]]) if i else 1.0) / ratios[n][0] - 1
             for i, n in enumerate(names)}
    mem_before = {n: 1 / m - 1 for n, (_, m) in ratios.items()}
    rows = {r["run"]: r for r in cluster["runs"]}
    for name in names:
        assert rows[name]["step_time_s"]["error_before"] == pytest.approx(before[name])
        assert rows[name]["step_time_s"]["error_after"] == pytest.approx(after[name])
        assert rows[name]["step_time_s"]["formula"] == pytest.approx(formula["step_time_s"])
        assert rows[name]["mem_per_gpu_gib"]["error_before"] == pytest.approx(mem_before[name])
    assert rows["r3"]["step_time_s"]["ratio"] == {"mean": pytest.approx(0.55), "spread": pytest.approx(0.0707107),
                                                  "runs": 2}
    step = cluster["step_time_s"]
    assert step["median_before"] == pytest.approx(statistics.median(abs(v) for v in before.values()))
    assert step["worst_before"] == pytest.approx(1.0)  # r1: the formula was twice the measured step time
    assert step["median_after"] == pytest.approx(statistics.median(abs(v) for v in after.values()))
    assert step["worst_after"] == pytest.approx(1.0)  # r1 had no run before it: uncorrected
    assert step["median_after"] < step["median_before"]
    # The runs that used more memory than the formula said come first, then the others as they completed.
    assert [r["run"] for r in cluster["runs"]] == ["r2", "r4", "r1", "r3"]
    assert [r["over_memory"] for r in cluster["runs"]] == [True, True, False, False]

    text = output(capsys, "plan", "--accuracy")
    assert "cluster slurm: 4 completed runs on h100" in text
    assert (f"step time error: median {100 * step['median_before']:.1f}%, worst +100.0% (formula); "
            f"median {100 * step['median_after']:.1f}%, worst +100.0% (corrected)") in text
    assert ("used more memory than the formula said, listed first (that is the one that would have run out of "
            "memory on a bigger layout): r2, r4") in text
    table = text[text.index("run  "):].splitlines()
    assert [line.split()[0] for line in table[2:]] == ["r2", "r4", "r1", "r3"]
    assert "-16.7%" in table[2]  # r2: the formula's memory 1/1.2 of what it used
    assert json.loads(output(capsys, "plan", "--accuracy", "--json", "--root", str(root))) == data
    assert json.loads(output(capsys, "plan", "--accuracy", "--json", "--root", str(root / "r1"))) == {"clusters": []}


def test_accuracy_refuses_overrides_other_than_the_cluster(root, capsys):
    assert cli.main(["plan", "--accuracy", "model=gpt_tiny"]) == 2
    assert "--accuracy takes only cluster=NAME, not model=gpt_tiny" in capsys.readouterr().err
    assert "no completed run of cluster nowhere" in output(capsys, "plan", "--accuracy", "cluster=nowhere")


def finished(root: Path, name: str) -> Path:
    """A tiny run's directory with its final row, its line not yet appended."""
    run_dir = root / name
    run_dir.mkdir()
    write_run_files(composed(root, *H100, "model=gpt_tiny", "gpus=8"), run_dir)
    append_metrics(run_dir / METRICS, FinalRow(step=10, step_time=0.1, peak_mem_gb=1.0, tokens_per_s=1.0))
    return run_dir


def test_the_file_is_never_written_or_read_through_a_planted_symlink(root, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("")
    os.symlink(victim, measured_path(root, "slurm"))
    assert record_completed(finished(root, "linked")) is None
    assert victim.read_text() == "" and read_measured(root, "slurm") == []


def test_a_planted_fifo_is_neither_waited_on_nor_written(root):
    os.mkfifo(measured_path(root, "slurm"))
    assert record_completed(finished(root, "piped")) is None and read_measured(root, "slurm") == []


@pytest.mark.skipif(os.geteuid() != 0, reason="gives the file to another user")
def test_a_file_of_another_user_is_appended_to_only_in_a_root_shared_with_its_group(root):
    other = 54321  # no user of this machine's: neither this one, nor root
    path = measured_path(root, "slurm")
    path.write_text("")
    os.chown(path, other, other)
    assert record_completed(finished(root, "theirs")) is None and path.read_text() == ""
    os.chown(root, -1, other)
    root.chmod(0o2700)  # setgid: the root's runs are shared with that group
    assert record_completed(finished(root, "shared")) is not None
    assert [m.run for m in read_measured(root, "slurm")] == ["shared"]


def test_a_line_with_a_field_of_the_wrong_type_is_skipped_and_a_valid_one_reads_back_equal(root, capsys):
    forecast = Forecast(cluster="slurm", gpu="h100", stand_in=False, model="gpt_tiny", params=10**6, gpus=8,
                        step_time_s=None, mem_per_gpu_gib=1.5, tokens_per_s=2e5)
    valid = Measured(run="valid", finished=2.0, forecast=forecast, step_time_s=0.1, peak_mem_gib=None,
                     tokens_per_s=1e5)
    wrong = [{**valid.to_dict(), "run": "text", "step_time_s": "fast"},
             {**valid.to_dict(), "run": "flag", "forecast": {**forecast.to_dict(), "params": True}},
             {**valid.to_dict(), "run": "null", "forecast": {**forecast.to_dict(), "mem_per_gpu_gib": None}},
             {key: value for key, value in valid.to_dict().items() if key != "tokens_per_s"}]
    measured_path(root, "slurm").write_text("".join(json.dumps(line) + "\n" for line in [*wrong, valid.to_dict()]))
    assert read_measured(root, "slurm") == [valid]
    assert "has step_time_s='fast', not float or None" in capsys.readouterr().err


def test_a_field_of_a_type_no_line_is_checked_against_is_refused_when_it_is_declared():
    @dataclasses.dataclass(frozen=True)
    class Tagged:
        tags: List[str]

    with pytest.raises(TypeError, match="Tagged.tags: a JSON line's value is not checked against"):
        _schema(Tagged)
