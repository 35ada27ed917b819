"""The Slurm adapter's parsers and the launch checks' messages (Slurm's output given as text, no cluster)."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

import launcher

from launcher.compose.composer import compose_runs
from launcher.slurm.client import Slurm
from launcher.slurm.fit import explain_rejection, mem_mb, refusal
from launcher.slurm.output import (Partition, SlurmError, array_elements, field_rows, max_job_nodes, minutes,
                                   parse_nodes, parse_sacct, parse_squeue, partitions_of, sbatch_reason,
                                   start_epoch, tres_gpus)

SINFO = """\
a-node1|gpu*|gpu:h100:8(S:0-1)|gpu:h100:3(IDX:0-2)|mixed|64|512000|2-00:00:00|1-4|
a-node2|gpu*|gpu:h100:8(S:0-1)|gpu:h100:0(IDX:N/A)|idle|64|512000|2-00:00:00|1-4|
a-node2|debug|gpu:h100:8(S:0-1)|gpu:h100:0(IDX:N/A)|idle|64|512000|30:00|1-infinite|
a-cpu1|cpu|(null)|gpu:0|down*|128|256000|infinite|1-infinite|
"""


def test_sinfo_nodes_are_parsed_by_field_name():
    nodes = parse_nodes(SINFO)
    first = nodes[0]
    assert (first.name, first.partition, first.default, first.gpus, first.gpu_type, first.gpus_used, first.state,
            first.cpus, first.mem_mb, first.max_time, first.max_nodes) == \
        ("a-node1", "gpu", True, 8, "h100", 3, "mixed", 64, 512000, "2-00:00:00", 4)
    assert (nodes[3].gpus, nodes[3].gpu_type, nodes[3].max_nodes) == (0, None, None)


def test_partitions_are_summed_from_nodes():
    parts = {p.name: p for p in partitions_of(parse_nodes(SINFO))}
    assert parts["gpu"] == Partition(name="gpu", default=True, nodes=2, gpus_per_node=8, gpu_type="h100",
                                     cpus_per_node=64, mem_mb_per_node=512000, max_nodes=4, max_time="2-00:00:00",
                                     gpu_types=("h100",))
    assert (parts["gpu"].max_time_min, parts["debug"].max_time_min, parts["cpu"].max_time_min) == (2880, 30, None)
    assert (parts["debug"].nodes, parts["debug"].default, parts["cpu"].gpus_per_node) == (1, False, 0)


@pytest.mark.parametrize("text, expected", [("infinite", None), ("30:00", 30), ("4:00:00", 240), ("1-00:00:00", 1440),
                                            ("2-12:30:00", 3630), ("UNLIMITED", None)])
def test_time_limits_in_minutes(text, expected):
    assert minutes(text) == expected


def test_job_size_and_short_rows():
    assert (max_job_nodes("1-infinite"), max_job_nodes("1-16")) == (None, 16)
    with pytest.raises(SlurmError, match="unexpected Slurm output"):
        field_rows("a|b", ("A", "B", "C"))


def test_sacct_and_squeue_rows_by_name():
    (row,) = parse_sacct("42|42|FAILED|None|1:0|2026-01-01T00:00:00|2026-01-01T00:01:00|00:01:00|n[1-2]\n")
    assert (row.job_id, row.state, row.exit_code, row.nodes, row.elapsed, row.source) == \
        ("42", "FAILED", "1:0", "n[1-2]", "00:01:00", "sacct")
    (row,) = parse_squeue("7|7|PENDING|JobHeldUser||N/A|0:00|ana|gpu|cpu=16,node=2,billing=16,gres/gpu=16|0.5|\n")
    assert (row.job_id, row.state, row.reason, row.start, row.source) == ("7", "PENDING", "JobHeldUser", "N/A", "squeue")
    assert (row.user, row.partition, row.gpus, row.priority) == ("ana", "gpu", 16, 0.5)


def test_a_jobs_gpus_from_its_trackable_resources_typed_or_not():
    assert tres_gpus("cpu=2,mem=4G,node=1,billing=2,gres/gpu=2") == 2
    assert tres_gpus("cpu=8,node=1,gres/gpu=8,gres/gpu:h100=8") == 8  # the total, not the total and its type
    assert tres_gpus("cpu=8,gres/gpu:h100=4,gres/gpu:a100=2") == 6
    assert tres_gpus("cpu=1,mem=4G,node=1,billing=1") == 0 and tres_gpus("") == 0


def test_array_elements_are_rows_of_their_own_named_as_their_runs_records_name_them():
    """A started element is ``123_4`` with a job id of its own; pending ones share a row, ``123_[5-7%2]``, which
    stands for each of them (the record of element 6's run names ``123_6``)."""
    rows = parse_squeue("123_4|127|RUNNING|None|n1|2026-01-01T00:00:00|0:05|ana|gpu|gres/gpu=1|0.5|\n"
                        "123_[5-7%2]|123|PENDING|JobArrayTaskLimit||N/A|0:00|ana|gpu|gres/gpu=1|0.5|\n")
    assert [(r.job_id, r.unique_id, r.state) for r in rows] == \
        [("123_4", "127", "RUNNING"), ("123_5", "123", "PENDING"), ("123_6", "123", "PENDING"),
         ("123_7", "123", "PENDING")]
    rows = parse_sacct("123_0|124|COMPLETED|None|0:0|a|b|00:00:09|n1\n123_[1,3-4]|123|PENDING|None|0:0|||0:00|\n")
    assert [(r.job_id, r.unique_id) for r in rows] == [("123_0", "124"), ("123_1", "123"), ("123_3", "123"),
                                                        ("123_4", "123")]
    assert array_elements("42") == ["42"] and array_elements("42_3") == ["42_3"]


def test_a_start_is_slurms_local_time_and_with_now_given_only_one_ahead_is_planned():
    now = time.mktime((2026, 12, 3, 12, 0, 0, 0, 0, -1))
    assert start_epoch("2026-12-03T14:05:00", now) == now + 2 * 3600 + 5 * 60
    assert start_epoch("2026-12-03T12:00:00", now) is None  # not ahead: the scheduler has not planned it
    assert start_epoch("2026-12-03T12:00:00") == now  # sbatch --test-only's: a start now
    assert start_epoch("N/A", now) is start_epoch("Unknown") is start_epoch("") is None


def test_sbatch_reason_is_slurms_words_alone():
    err = ("sbatch: error: CPU count per node can not be satisfied\n"
           "sbatch: error: Batch job submission failed: Requested node configuration is not available\n")
    assert sbatch_reason(err) == "Requested node configuration is not available"
    assert sbatch_reason("") == "sbatch failed"


@pytest.mark.parametrize("text, mb", [("100G", 102400), ("512M", 512), ("2048", 2048), ("1T", 1048576), ("x", None)])
def test_memory_sizes(text, mb):
    assert mem_mb(text) == mb


PART = Partition(name="gpu", default=True, nodes=4, gpus_per_node=8, gpu_type=None, cpus_per_node=16,
                 mem_mb_per_node=65536, max_nodes=2, max_time="1:00:00")


def run_of(*overrides):
    (run,) = compose_runs(["model=gpt_tiny", "cluster=slurm", "cluster.time_limit_min=60", "cluster.mem_per_gpu=8G",
                           "cluster.cpus_per_gpu=2", *overrides])
    return run


@pytest.mark.parametrize("overrides, message", [
    ([], None),
    (["gpus=32"], "gpus=32 needs 4 nodes; partition 'gpu' allows at most 2 per job (MaxNodes)"),
    (["cluster.time_limit_min=90"], "cluster.time_limit_min=90 is above partition 'gpu''s MaxTime of 60 min"),
    (["cluster.cpus_per_gpu=4"], "gpus=8 as 1 node x 8 tasks x 4 CPUs, 8G per GPU needs 32 CPUs per node; "
                                 "partition 'gpu' nodes have 16 CPUs; lower cluster.cpus_per_gpu (at most 2)"),
    (["cluster.cpus_per_gpu=4", "cluster.overcommit=true"], None),
    (["cluster.mem_per_gpu=10G"], "needs 81920 MB per node (cluster.mem_per_gpu=10G); partition 'gpu' nodes have "
                                  "65536 MB; lower cluster.mem_per_gpu (at most 8192M)"),
    (["cluster.gpu_type=a100"], "cluster.gpu_type=a100: partition 'gpu' names no GPU type (untyped gres gpu); set "
                                "cluster.gpu_type=null"),
    (["cluster.gpu_type=a100", "+typed=h100"], "cluster.gpu_type=a100: partition 'gpu' has GPUs of type h100; set "
                                               "cluster.gpu_type=h100"),
    (["cluster.gpu_type=a100", "+typed=h100,l40s"], "cluster.gpu_type=a100: partition 'gpu' has GPUs of type h100, "
                                                    "l40s; set cluster.gpu_type to one of them"),
    (["cluster.gpu_type=h100", "+typed=h100,l40s"], None),
])
def test_refusals_name_the_value_and_what_to_change(overrides, message):
    typed = next((o.split("=", 1)[1] for o in overrides if o.startswith("+typed=")), None)
    run = run_of(*(o for o in overrides if not o.startswith("+typed=")))
    part = dataclasses.replace(PART, gpu_types=tuple(typed.split(","))) if typed else PART
    found = refusal(run.plan, run.config.cluster, part)
    assert found is None if message is None else message in found, found


def test_an_sbatch_rejection_is_explained_in_one_line():
    run = run_of()
    text = explain_rejection("Invalid account or account/partition combination specified", run.plan,
                             run.config.cluster, PART)
    assert text == ("Slurm refused gpus=8 as 1 node x 8 tasks x 2 CPUs, 8G per GPU on partition 'gpu' "
                    "(4 nodes x 8 GPUs, 16 CPUs, 65536 MB each): Invalid account or account/partition combination "
                    "specified; set cluster.account to an account you may use on this partition")
    small = dataclasses.replace(PART, cpus_per_node=4)  # a refusal the checks know is said in their words
    assert explain_rejection("Requested node configuration is not available", run.plan, run.config.cluster,
                             small).startswith("gpus=8 as 1 node x 8 tasks x 2 CPUs, 8G per GPU needs 16 CPUs")
    assert "\n" not in explain_rejection("x", run.plan, run.config.cluster, None)


def test_only_the_adapter_runs_slurm_tools():
    """launcher/slurm/client.py is the one module of the launcher that names a Slurm tool to run; it,
    launcher/submit/git.py (git) and launcher/remote/ssh.py (ssh) are the only ones that start a process (what runs
    on a remote cluster goes through ssh.py), besides launcher/train/hf_export.py, whose main rank starts its own Python
    to export a checkpoint beside training, and launcher/submit/checks.py, which asks the tasks' Python what it has. The tasks' code (launcher/train/) runs no tool at all: a rank may be in a
    container without Slurm's client, so the requeue and the progress comment are the batch shell's
    (launcher/job/recovery.py, launcher/job/comment.py)."""
    package = Path(launcher.__file__).parent
    tools = [f'["{tool}"' for tool in ("sinfo", "squeue", "sacct", "scontrol", "scancel", "sbatch")]
    offenders = [str(path.relative_to(package)) for path in package.rglob("*.py")
                 if path.relative_to(package).as_posix() != "slurm/client.py"
                 and (("subprocess" in path.read_text()
                       and path.relative_to(package).as_posix() not in ("submit/git.py", "remote/ssh.py",
                                                                         "train/hf_export.py", "submit/checks.py"))
                      or any(tool in path.read_text() for tool in tools))]
    assert offenders == []


def test_a_job_submitted_from_an_array_element_is_not_handed_the_elements_variables(monkeypatch):
    """A retry of an element is a plain job: were SLURM_ARRAY_* handed on by sbatch, its steps would take it for
    the element (launcher/job/claim.py names a job by them)."""
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "478")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    monkeypatch.setenv("SLURM_JOB_ID", "479")
    env = Slurm("/etc/slurm.conf").env
    assert not [name for name in env if name.startswith("SLURM_ARRAY_")]
    assert (env["SLURM_JOB_ID"], env["SLURM_CONF"]) == ("479", "/etc/slurm.conf")
