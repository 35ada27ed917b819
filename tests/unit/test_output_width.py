"""Every command's output fits the terminal (launcher/views/width.py): at COLUMNS=80 and 100, over long names, long
reasons and many clusters, each line ``runs``, ``clusters``, ``plan``, a dry run, ``compare`` and ``describe``
print is within the width; the whole of a shortened cell stays in ``--json``; a dry run's script is folded into the
same script. A refusal or finding on stderr is one line for a script and wrapped on a terminal."""
from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from launcher import cli
from launcher.compose.layout import single_node_plan
from launcher.core.config import ModelConfig, RunConfig
from launcher.core.run_index import RunRecord, save_record
from launcher.service.clusters import ClusterUsage
from launcher.status.job_state import JobState
from launcher.status.usage import PartitionUsage
from launcher.views.width import fit_table, fold_script, wrap

WIDTHS = (80, 100)
LONG = "lr-sweep-of-a-long-experiment-name-gpt_small-on-sixteen-gpus"  # a run name has at most 64 characters
WAITING = "waiting for 16 GPUs on partition 'gpu': 16 of its 16 are in use, behind 5 jobs of higher priority"
CAUSE = ("it failed because every node of partition 'gpu' was drained by the administrator for maintenance of "
         "the network and the file system, and Slurm gave no time for their return")


def printed(capsys, monkeypatch, width: int, *args: str) -> list[str]:
    """stdout's lines of ``launcher ARGS`` on a terminal ``width`` columns wide."""
    monkeypatch.setenv("COLUMNS", str(width))
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    assert code in (0, 2), err
    return out.splitlines()


def assert_fits(lines: list[str], width: int) -> None:
    wide = [f"{len(line)}: {line}" for line in lines if len(line) > width]
    assert lines and not wide, "\n".join(wide)


def make_run(root, name: str, steps_done: int, sweep: str = "sweep-width") -> None:
    """A finished 2-rank gpt_tiny run as the launcher leaves it, whose events name a long cause."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    cfg = RunConfig(model=ModelConfig(name="gpt_tiny", d_model=64, n_heads=2, n_layers=2, seq_len=32), name=name)
    OmegaConf.save(OmegaConf.structured(cfg), run_dir / "config.yaml", resolve=True)
    (run_dir / "plan.json").write_text(json.dumps(single_node_plan(cfg, 2).to_dict()))
    save_record(RunRecord(name=name, run_dir=str(run_dir), model="gpt_tiny", gpus=2, nodes=1, gpus_per_node=2,
                          steps=steps_done, cluster="local", submitted_at=time.time(), job_id="1234567", sweep=sweep))
    rows = [{"step": s, "loss": 4.0 - s / 100, "step_time": 0.5, "tokens_per_s": 12345.0, "tokens_per_s_per_gpu":
             6172.5, "mfu": None} for s in range(10, steps_done + 1, 10)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    events = [{"time": time.time(), "event": "submitted", "job_id": "1234567"},
              {"time": time.time(), "event": "failed", "cause": CAUSE, "job_id": "1234567"}]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


@pytest.fixture
def runs(tmp_path):
    """Five runs of long names in a run root of their own; the quick tier's Slurm cannot be reached, so each
    reads UNKNOWN with a long reason."""
    for index in range(5):
        make_run(tmp_path, f"{LONG}-{index}", 20 + 10 * index)
    return tmp_path


def waiting(records):
    """Every run PENDING, with a reason as long as a busy partition's."""
    return {rec.name: JobState("PENDING", WAITING, "squeue") for rec in records}


@pytest.mark.parametrize("width", WIDTHS)
def test_runs_compare_and_describe_fit(runs, capsys, monkeypatch, width):
    root = str(runs)
    assert_fits(printed(capsys, monkeypatch, width, "runs", "--root", root), width)
    monkeypatch.setattr("launcher.service.runs.job_states", waiting)
    listed = printed(capsys, monkeypatch, width, "runs", "--root", root)
    assert_fits(listed, width)
    assert "PENDING" in listed[2] and "are in use" in "\n".join(listed)  # the reason, wrapped by words
    assert sum(line.startswith("lr-sweep-of-a-") for line in listed) == 5  # each name over the lines it needs
    assert_fits(printed(capsys, monkeypatch, width, "compare", "--sweep", "sweep-width", "--root", root), width)
    described = printed(capsys, monkeypatch, width, "describe", f"{LONG}-1", "--root", root)
    assert_fits(described, width)
    assert not any(line.startswith("  model:") for line in described)  # the config only with --config
    whole = printed(capsys, monkeypatch, width, "describe", f"{LONG}-1", "--config", "--root", root)
    assert_fits(whole, width)
    assert "Config:" in whole and "  model:" in whole
    rows = json.loads("\n".join(printed(capsys, monkeypatch, width, "runs", "--json", "--root", root)))
    assert {row["name"] for row in rows} == {f"{LONG}-{i}" for i in range(5)}  # --json: every cell whole


def survey(clusters):
    """Twelve clusters of long names: reachable ones with several partitions and a site's limit, unreachable ones
    with a long error, each from a file of a long path."""
    entries = []
    for index in range(12):
        name = f"cluster-of-the-department-of-physics-{index}"
        origin = f"user: /home/someone/.config/launcher/cluster/{name}-with-a-longer-file-name.yaml"
        if index % 3 == 2:
            entries.append(ClusterUsage(name, [], None, error=f"cluster {name} is not reachable ({CAUSE})",
                                        origins=[origin]))
            continue
        parts = [PartitionUsage(f"gpu-partition-{p}", p == 0, "nvidia_h100_80gb_hbm3", 8, "2-00:00:00", 12, 30, 2,
                                96, 352, 64, 256, yours="64 (QOS normal-priority-queue, MaxTRESPerUser)")
                 for p in range(2)]
        entries.append(ClusterUsage(name, [f"{name}-alias"], None, reachable=True, partitions=parts,
                                    origins=[origin, origin], enforced=index % 2 == 0))
    return entries


@pytest.mark.parametrize("width", WIDTHS)
def test_clusters_fit(capsys, monkeypatch, width):
    monkeypatch.setattr("launcher.commands.clusters.survey", survey)
    lines = printed(capsys, monkeypatch, width, "clusters")
    assert_fits(lines, width)
    text = "\n".join(lines)
    assert "accounting enforces no account or QOS limit" in " ".join(text.split())  # said here, once
    assert text.count("accounting enforces") == 1


@pytest.mark.parametrize("width", WIDTHS)
def test_plan_and_a_dry_run_fit(capsys, monkeypatch, width):
    assert_fits(printed(capsys, monkeypatch, width, "plan", "model=gpt_tiny", "gpus=2", f"name={LONG}"), width)
    assert_fits(printed(capsys, monkeypatch, width, "plan", "-m", "model=gpt_tiny,gpt_small", "gpus=1,2"), width)
    dry = printed(capsys, monkeypatch, width, "model=gpt_tiny", "gpus=2", f"name={LONG}", "dry_run=true")
    script = next(i for i, line in enumerate(dry) if line.startswith("#!"))
    assert_fits([line for line in dry if not line.startswith("#SBATCH")], width)  # a directive cannot be continued
    whole = printed(capsys, monkeypatch, 1000, "model=gpt_tiny", "gpus=2", f"name={LONG}", "dry_run=true")
    unfolded = "\n".join(dry[script:]).replace(" \\\n    ", " ").replace("\\\n", "")
    assert unfolded == "\n".join(whole[whole.index(dry[script]):])


def test_a_folded_script_is_the_same_script_to_bash(tmp_path):
    line = ("printf '<%s>' --a 'one two  three' \"$HOME/x y\" ${NOPE:-a  b} $(echo c   d) "
            + " ".join(f"--option-{i}=value-{i}" for i in range(12)) + " 'last  one' /a-path/" + "long-" * 20
            + ' "/a/quoted/path/' + "more " * 6 + '" # a comment that stays whole')
    folded = fold_script(line, 40)
    assert len(folded.splitlines()) > 3 and all(len(part) <= 40 for part in folded.splitlines())
    said = [subprocess.run(["bash", "-c", text], capture_output=True, text=True).stdout for text in (line, folded)]
    assert said[0] == said[1] and "<one two  three>" in said[0], said
    assert fold_script("#SBATCH --output=" + "x" * 90, 40) == "#SBATCH --output=" + "x" * 90


def test_a_refusal_is_one_line_for_a_script_and_wrapped_on_a_terminal():
    argv = [sys.executable, "-m", "launcher", "model=gpt_tiny", "gpus=3", f"name={LONG}", "cluster=" + "n" * 60]
    env = {**os.environ, "COLUMNS": "50"}
    piped = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert piped.returncode == 2 and piped.stderr.count("\n") == 1 and len(piped.stderr) > 50, piped.stderr
    leader, follower = pty.openpty()
    with os.fdopen(leader, "rb", buffering=0) as terminal:
        proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=follower, env=env)
        os.close(follower)
        told = terminal.read(4096).decode().replace("\r", "").splitlines()
    assert proc.returncode == 2 and len(told) > 1 and all(len(line) <= 50 for line in told), told
    assert "".join("".join(told).split()) == "".join(piped.stderr.split())  # the same words


def test_a_table_wraps_its_free_text_then_leaves_out_columns_and_says_which():
    rows = [["a-long-name-of-a-run", "PENDING (waiting for 16 GPUs on partition 'gpu': 16 of its 16 are in use)",
             "1234567", "2026-12-06 04:00"]]
    headers = ["NAME", "STATUS", "JOB ID", "SUBMITTED"]
    assert fit_table(rows, headers, width=200).splitlines()[2].split()[0] == "a-long-name-of-a-run"  # it fits
    wrapped = fit_table(rows, headers, {"STATUS": 20}, ["SUBMITTED"], width=80).splitlines()
    assert all(len(line) <= 80 for line in wrapped) and "SUBMITTED" in wrapped[0]  # wrapping was enough
    assert set(rows[0][1].split()) <= set("\n".join(wrapped).split())  # by words, none cut
    narrow = fit_table(rows, headers, {"STATUS": 20}, ["SUBMITTED"], width=50).splitlines()
    assert all(len(line) <= 50 for line in narrow) and "SUBMITTED" not in narrow[0]
    assert "(left out to fit 50 columns: JOB ID, SUBMITTED;" in "\n".join(narrow)
    assert wrap("not checked: " + "word " * 30, 40).splitlines()[1].startswith("  word")


def test_a_command_run_on_a_remote_cluster_fits_this_terminal(monkeypatch):
    from launcher.remote.ship import launcher_argv
    from launcher.remote.ssh import Remote

    monkeypatch.setenv("COLUMNS", "77")
    assert " COLUMNS=77 " in launcher_argv(Remote("site", "me@site"), "launcher", ["runs"])[2]
