"""A damaged run directory is contained: listed as DAMAGED with the file and how, one line from every
command on it, and nothing about the other runs lost (no Slurm needed: the runs are built by hand)."""
from __future__ import annotations

import json
import shutil
import os

import pytest
from omegaconf import OmegaConf

from launcher import cli
from launcher.core.config import ModelConfig, RunConfig
from launcher.compose.layout import single_node_plan
from launcher.core.metrics import FinalRow
from launcher.core.rundir import last_metrics, read_events, read_metrics
from launcher.core.run_index import RunRecord, load_record, mend_record, save_record
from launcher.slurm.output import JobRow

GOOD = ("alpha", "gamma")  # listed and usable around the damaged one, "beta"


def tiny_config(name: str) -> RunConfig:
    return RunConfig(model=ModelConfig(name="gpt_tiny", d_model=64, n_heads=2, n_layers=2, seq_len=32), name=name)


def make_run(root, name, submitted):
    """A 2-rank run stopped at step 20 of 40, as the launcher leaves it: record, config, plan, metrics, events, Slurm's answer."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    cfg = tiny_config(name)
    OmegaConf.save(OmegaConf.structured(cfg), run_dir / "config.yaml", resolve=True)
    (run_dir / "plan.json").write_text(json.dumps(single_node_plan(cfg, 2).to_dict()))
    save_record(RunRecord(name=name, run_dir=str(run_dir), model="gpt_tiny", gpus=2, nodes=1, gpus_per_node=2,
                          steps=40, cluster="local", submitted_at=submitted, job_id="7", sweep="sweep-x"))
    os.utime(run_dir / "run.json", (submitted, submitted))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        {"step": 10, "loss": 3.5, "step_time": 0.5, "tokens_per_s": 100.0, "tokens_per_s_per_gpu": 50.0, "mfu": None},
        {"step": 20, "loss": 3.0, "step_time": 0.5, "tokens_per_s": 100.0, "tokens_per_s_per_gpu": 50.0, "mfu": None},
        {"final": True, "step": 20, "loss": 3.0, "tokens_per_s": 100.0})))
    (run_dir / "events.jsonl").write_text(json.dumps({"time": submitted, "event": "submitted", "job_id": "7"}) + "\n")
    (run_dir / "slurm_state.json").write_text(json.dumps({"job_id": "7", "state": "COMPLETED", "source": "sacct"}))
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "rank_0.log").write_text(f"{name} trained\n")
    return run_dir


@pytest.fixture
def root(tmp_path, monkeypatch):
    """Three runs; Slurm answers that it knows none of their jobs (their final states are kept on disk)."""
    monkeypatch.setattr("launcher.slurm.client.Slurm.unreachable", lambda self: None)
    monkeypatch.setattr("launcher.slurm.client.Slurm.squeue", lambda self: [])
    monkeypatch.setattr("launcher.slurm.client.Slurm.sacct", lambda self, ids: [])
    for i, name in enumerate(("alpha", "beta", "gamma")):
        make_run(tmp_path, name, 1000.0 + i)
    return tmp_path


def truncated(path):
    """The file cut short a third of the way in, at the end of a line where it has lines (a YAML file so cut
    can still parse)."""
    text = path.read_text()
    return text[: text.rfind("\n", 0, len(text) // 3) + 1 or len(text) // 3]


# (file, how it is damaged, what the one line says). The record itself (run.json) gone: nothing is known.
RECORD_DAMAGE = [
    ("run.json", None, "run.json is missing"),
]
# run.json there but damaged: rebuilt from the run's own files (plan.json, config.yaml, events.jsonl).
REBUILT = [
    (lambda p: "{}", "run.json lacks name, run_dir, model, gpus"),
    (lambda p: "garbage\x00", "run.json is not valid JSON (Expecting value at line 1 column 1)"),
    (truncated, "run.json is not valid JSON"),
    (lambda p: "", "run.json is empty"),
    (lambda p: "[1, 2]", "run.json holds a JSON list, not an object"),
    (lambda p: p.read_text().replace('"gpus": 2', '"gpus": "two"'), "run.json has gpus='two', not a int"),
]
# The plan or config damaged: what the listing tells at a glance (it reads every plan, no config: YAML is slow
# to parse), and what the commands that read them say.
FILE_DAMAGE = [
    ("plan.json", lambda p: "{}", None, "plan.json lacks model, gpus"),
    ("plan.json", lambda p: "garbage", "plan.json is not valid JSON", "plan.json is not valid JSON"),
    ("plan.json", truncated, "plan.json is not valid JSON", "plan.json is not valid JSON"),
    ("plan.json", None, None, "plan.json is missing"),
    ("config.yaml", lambda p: "{}", None, "config.yaml lacks model, layout"),
    ("config.yaml", lambda p: p.read_text().replace("lr:", "lr: [oops]\n  x:"), None,
     "config.yaml does not fit the config schema"),
    ("config.yaml", lambda p: "model: [\n", None, "config.yaml is not valid YAML"),
    ("config.yaml", lambda p: "- a\n- b\n", None, "config.yaml holds a YAML list"),
    ("config.yaml", truncated, None, "config.yaml lacks"),
    ("config.yaml", None, None, "config.yaml is missing"),
]


def damage(root, file, how):
    path = root / "beta" / file
    if how is None:
        path.unlink()
    else:
        path.write_text(how(path))


def run_cli(capsys, *args, root):
    code = cli.main([*args, "--root", str(root)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def listed(capsys, root, *args, warned=None):
    """``runs --json``'s rows by name; its stderr empty, or (``warned``: a file and line) only warnings naming it."""
    code, out, err = run_cli(capsys, "runs", "--json", *args, root=root)
    assert code == 0 and (err == "" if warned is None else warned_only(err, warned)), err
    return {row["name"]: row for row in json.loads(out)}


def warned_only(err, where):
    """Whether stderr holds warnings of the damaged line ``where`` (``.../events.jsonl line 2``) and nothing else."""
    lines = err.splitlines()
    return bool(lines) and all(line.startswith("warning: ") and where in line and line.endswith(
        "; skipped, the rest is read") for line in lines)


@pytest.mark.parametrize("file, how, reason", RECORD_DAMAGE)
def test_a_damaged_record_is_listed_as_damaged_and_every_command_says_so_in_one_line(root, capsys, file, how,
                                                                                     reason):
    damage(root, file, how)
    rows = listed(capsys, root)
    assert list(rows) == ["gamma", "beta", "alpha"]  # newest first, none hidden
    assert (rows["beta"]["status"], rows["beta"]["job_id"]) == ("DAMAGED", None) and reason in rows["beta"]["reason"]
    assert [rows[name]["status"] for name in GOOD] == ["COMPLETED", "COMPLETED"]
    assert rows["alpha"]["step"] == 20 and rows["alpha"]["loss"] == 3.0
    code, out, _ = run_cli(capsys, "runs", root=root)
    beta = next(line for line in out.splitlines() if line.startswith("beta "))
    assert code == 0 and f"DAMAGED ({reason}" in beta and sum(" COMPLETED " in line for line in out.splitlines()) == 2
    assert set(listed(capsys, root, "--status", "DAMAGED")) == {"beta"}
    assert set(listed(capsys, root, "--status", "COMPLETED")) == set(GOOD)
    assert "beta" in listed(capsys, root, "--model", "gpt_tiny")  # its model cannot be known: shown, not hidden
    for args in (["describe", "beta"], ["describe", "bet"], ["logs", "beta"], ["compare", "alpha", "beta"],
                 ["stop", "beta"], ["resume", "beta"], ["delete", "beta", "--yes"]):
        assert_one_line_error(capsys, root, args, f"run beta is damaged: {root / 'beta' / reason}")
    assert (root / "beta").is_dir()  # delete removed nothing it could not vouch for
    assert_others_work(capsys, root)


@pytest.mark.parametrize("how, reason", REBUILT)
def test_a_damaged_run_json_is_rebuilt_from_the_runs_own_files_and_mended_by_the_next_writer(root, capsys, how,
                                                                                              reason):
    damage(root, "run.json", how)
    rows = listed(capsys, root)
    assert list(rows) == ["gamma", "beta", "alpha"]
    beta = rows["beta"]
    assert (beta["status"], beta["job_id"], beta["model"], beta["gpus"], beta["steps"], beta["step"], beta["loss"]) \
        == ("COMPLETED", "7", "gpt_tiny", 2, 100, 20, 3.0), beta  # steps: config.yaml's (the record said 40)
    assert f"record rebuilt from events.jsonl and plan.json: {reason}" in beta["reason"]
    code, out, _ = run_cli(capsys, "describe", "beta", root=root)
    assert code == 0 and "Run beta: Slurm job 7" in out and f"Record: rebuilt from events.jsonl and plan.json ({reason}" \
        in out
    code, out, _ = run_cli(capsys, "logs", "beta", root=root)
    assert (code, out) == (0, "beta trained\n")
    mend_record(root / "beta")  # what the job's end step and a resubmission do first
    mended = load_record(root / "beta")
    assert (mended.name, mended.job_id, mended.submitted_at, mended.rebuilt) == ("beta", "7", 1001.0, None)
    assert "rebuilt" not in json.loads((root / "beta" / "run.json").read_text())
    assert_others_work(capsys, root)


@pytest.mark.parametrize("file, how, listing, reason", FILE_DAMAGE)
def test_a_damaged_plan_or_config_is_said_by_the_commands_that_need_it(root, capsys, file, how, listing, reason):
    damage(root, file, how)
    rows = listed(capsys, root)
    assert list(rows) == ["gamma", "beta", "alpha"]
    if listing:  # unreadable at a glance: the listing says so
        assert rows["beta"]["status"] == "DAMAGED" and listing in rows["beta"]["reason"]
    else:  # readable but not what the run needs: listed from its record; describe says what is wrong
        assert (rows["beta"]["status"], rows["beta"]["step"]) == ("COMPLETED", 20)
    assert_one_line_error(capsys, root, ["describe", "beta"], f"run beta is damaged: {root / 'beta' / reason}")
    assert_one_line_error(capsys, root, ["resume", "beta"], "run beta is damaged: ")
    assert_others_work(capsys, root)


def assert_one_line_error(capsys, root, args, message):
    code, out, err = run_cli(capsys, *args, root=root)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], (args, err)


def assert_others_work(capsys, root):
    code, out, _ = run_cli(capsys, "describe", "alpha", root=root)
    assert code == 0 and "Run alpha: Slurm job 7" in out and "loss 3" in out
    code, out, _ = run_cli(capsys, "logs", "gamma", root=root)
    assert (code, out) == (0, "gamma trained\n")
    code, out, _ = run_cli(capsys, "compare", "alpha", "gamma", "--json", root=root)
    assert code == 0 and [(s["name"], s["steps_done"]) for s in json.loads(out)] == [("alpha", 20), ("gamma", 20)]
    code, out, _ = run_cli(capsys, "compare", "--sweep", "sweep-x", "--json", root=root)
    assert code == 0 and {s["name"] for s in json.loads(out)} >= set(GOOD)


@pytest.mark.parametrize("bad", ["garbage\n", '{"step": 15, "loss"\n', "[1, 2]\n", '"text"\n', "{}\n",
                                 '{"step": "15", "loss": 1.0}\n', '{"step": 15, "loss": "low"}\n'])
def test_a_damaged_metrics_line_is_skipped_and_the_rest_used(root, capsys, bad):
    path = root / "alpha" / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + bad + "".join(lines[1:]) + bad.rstrip("\n"))  # in the middle, and a torn last line
    assert [m.step for m in read_metrics(root / "alpha")] == [10, 20, 20]
    assert isinstance(last_metrics(root / "alpha"), FinalRow)
    rows = listed(capsys, root, warned=f"{path} line 2 ")
    assert (rows["alpha"]["status"], rows["alpha"]["step"], rows["alpha"]["loss"]) == ("COMPLETED", 20, 3.0)
    assert_others_work(capsys, root)


@pytest.mark.parametrize("bad", ["garbage\n", "[1]\n", "{}\n", '{"time": "noon", "event": "finished"}\n',
                                 '{"time": 1, "event": "sub'])
def test_a_damaged_event_line_is_skipped_and_the_rest_used(root, capsys, bad):
    path = root / "alpha" / "events.jsonl"
    middle = bad.rstrip("\n") + "\n"  # a damaged line in the middle, and as the torn last line
    path.write_text(path.read_text() + middle + json.dumps({"time": 2000.0, "event": "finished"}) + "\n" + bad)
    assert [e.kind for e in read_events(root / "alpha") if e] == ["submitted", "finished"]
    code, out, err = run_cli(capsys, "describe", "alpha", root=root)
    assert code == 0 and "finished" in out and warned_only(err, f"{path} line 2 ")  # once per command, per file
    assert listed(capsys, root, warned=f"{path} line 2 ")["alpha"]["status"] == "COMPLETED"


@pytest.mark.parametrize("kept", ["[1]", "garbage", "", "{}"])
def test_a_damaged_kept_slurm_state_is_asked_again(root, capsys, monkeypatch, kept):
    (root / "alpha" / "slurm_state.json").write_text(kept)
    monkeypatch.setattr("launcher.slurm.client.Slurm.sacct", lambda self, ids: [JobRow("7", "COMPLETED", "", "n1", "")])
    assert listed(capsys, root)["alpha"]["status"] == "COMPLETED"


def test_a_directory_that_never_became_a_run_is_not_listed(root, capsys):
    (root / "half-launched").mkdir()  # a launch in progress: no record and no events yet
    (root / "half-launched" / "config.yaml").write_text("name: x\n")
    assert list(listed(capsys, root)) == ["gamma", "beta", "alpha"]


def test_a_copied_run_directory_is_damaged_and_no_command_reaches_the_original_through_it(root, capsys):
    """cp -a RUN RUN-copy: the copy's record names the original's directory and job. Listed as DAMAGED, "a copy
    of" the original; stop, resume and delete through it are refused, and the original is untouched."""
    shutil.copytree(root / "beta", root / "beta-copy", symlinks=True)
    rows = listed(capsys, root)
    assert rows["beta-copy"]["status"] == "DAMAGED" and "is a copy of run beta" in rows["beta-copy"]["reason"]
    assert rows["beta"]["status"] == "COMPLETED"
    for args in (["stop", "beta-copy"], ["resume", "beta-copy"], ["delete", "beta-copy", "--yes"]):
        assert_one_line_error(capsys, root, args, f"run beta-copy is damaged: {root / 'beta-copy' / 'run.json'} "
                                                  "is a copy of run beta")
    assert (root / "beta" / "run.json").exists() and (root / "beta-copy").is_dir()


def test_logs_shows_rank_0_and_the_end_of_each_rank_the_attempt_blamed(root, capsys):
    """At 1,024 ranks, the logs worth reading: rank 0's whole, then the last lines of the ranks the newest attempt
    blamed (one raised, one froze); an earlier attempt's culprit is not shown again, and --rank shows one."""
    run_dir = root / "alpha"
    record = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**record, "gpus": 4}))  # ranks 0..3
    for rank in (1, 2, 3):
        (run_dir / "logs" / f"rank_{rank}.log").write_text("".join(f"rank {rank} line {i}\n" for i in range(100)))
    with (run_dir / "events.jsonl").open("a") as f:
        for event in ({"event": "attempt", "attempt": 1, "job_id": "6"}, {"event": "failed", "rank": 1, "job_id": "6"},
                      {"event": "attempt", "attempt": 2, "job_id": "7"}, {"event": "failed", "rank": "3"},
                      {"event": "stalled", "ranks": [2]}):
            f.write(json.dumps({"time": 1001.0, **event}) + "\n")
    assert cli.main(["logs", "alpha", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("==> rank 0 <==\nalpha trained\n==> rank 2 (failed) <==\nrank 2 line 60\n")
    assert "rank 3 line 99\n" in out and "rank 3 line 59\n" not in out and "rank 1 " not in out
    assert cli.main(["logs", "alpha", "--root", str(root), "--rank", "0"]) == 0
    assert capsys.readouterr().out == "alpha trained\n"
