"""A pending job's reason in words (launcher/status/pending.py): Slurm's codes as users meet them."""
from __future__ import annotations

import time

import pytest

from launcher.slurm.output import JobRow, Node
from launcher.status.pending import Queue, eligible, expected_start, in_words

NOW = time.mktime((2026, 12, 3, 12, 0, 0, 0, 0, -1))


def job(job_id="9", reason="Resources", gpus=16, user="ana", state="PENDING", priority=0.5, start="N/A"):
    return JobRow(job_id, state, reason, "", start, source="squeue", user=user, partition="gpu", gpus=gpus,
                  priority=priority)


def node(name, gpus_used):
    return Node(name, "gpu", True, 8, "h100", gpus_used, "mixed", 64, 512000, "1:00:00", None)


def test_waiting_for_resources_says_how_many_gpus_are_in_use_from_one_sinfo():
    asked = []
    queue = Queue([job()], nodes=lambda: asked.append(1) or [node("n1", 8), node("n2", 4)])
    assert in_words(job(), queue, NOW) == ("waiting for 16 GPUs on partition 'gpu': 12 of its 16 are in use; it "
                                           "starts when other jobs end (fewer GPUs, or another partition, may "
                                           "start sooner)")
    assert asked == [1]
    assert in_words(job(), Queue([job()]), NOW) == "waiting for 16 GPUs on partition 'gpu' to come free"


def test_an_expected_start_is_said_only_where_slurm_has_planned_one():
    assert expected_start("2026-12-03T14:05:00", NOW) == "at 14:05"
    assert expected_start("2026-12-04T09:00:00", NOW) == "on 2026-12-04 at 09:00"
    assert expected_start("2026-12-03T11:00:00", NOW) == ""  # which starts Slurm has planned: test_slurm.py
    pending = job(reason="Priority", start="2026-12-03T14:05:00")
    assert in_words(pending, Queue([pending]), NOW).endswith("; Slurm expects it to start at 14:05")


@pytest.mark.parametrize("reason", ["Dependency", "BeginTime", "JobHeldUser", "JobHeldAdmin, held"])
def test_a_job_slurm_does_not_consider_for_a_start_stands_ahead_of_none(reason):
    assert eligible(job(reason="Priority")) and eligible(job(reason="Resources, waiting"))
    assert not eligible(job(reason=reason)) and not eligible(job(state="RUNNING", reason="None"))


def test_priority_counts_the_partitions_pending_jobs_ranked_before_it():
    mine = job(priority=0.5, reason="Priority")
    queue = Queue([mine, job("1", priority=0.9, user="bo"), job("2", priority=0.7, user="cy"),
                   job("3", priority=0.1, user="bo"), job("4", priority=0.99, state="RUNNING")])
    assert in_words(mine, queue, NOW) == "behind 2 jobs of higher priority on partition 'gpu'"


def test_a_per_user_gpu_limit_names_what_the_users_other_jobs_hold():
    mine = job(reason="QOSMaxGRESPerUser", gpus=8)
    queue = Queue([mine, job("1", state="RUNNING", gpus=4), job("2", state="RUNNING", gpus=4),
                   job("3", state="RUNNING", gpus=8, user="bo"), job("5", gpus=8)])
    assert in_words(mine, queue, NOW) == ("your other running jobs hold 8 GPUs in 2 jobs, the most GPUs your QOS "
                                          "(cluster.qos) allows you at once; it starts when they end (or stop one)")


def test_a_per_user_gpu_limit_with_nothing_else_running_can_never_start():
    mine = job(reason="QOSMaxGRESPerUser", gpus=16)
    said = in_words(mine, Queue([mine, job("3", state="RUNNING", gpus=8, user="bo")]), NOW)
    assert said.startswith("asks for more GPUs than your QOS (cluster.qos) allows you at once, and none of your "
                           "jobs holds any: it can never start as asked")
    assert "fewer GPUs or another QOS" in said


@pytest.mark.parametrize("code, words", [
    ("QOSMaxGRESPerJob", "asks for more GPUs than your QOS (cluster.qos) allows one job: it can never start"),
    ("AssocMaxNodePerJobLimit", "asks for more nodes than your account (cluster.account) allows one job"),
    ("QOSMaxWallDurationPerJobLimit", "asks for more run time than your QOS (cluster.qos) allows one job"),
    ("QOSMinGRES", "asks for fewer GPUs than your QOS (cluster.qos) requires of one job"),
    ("AssocGrpGRES", "the GPUs that your account (cluster.account) shares among its users are all in use"),
    ("QOSGrpNodeLimit", "the nodes that your QOS (cluster.qos) shares among its users are all in use"),
    ("QOSMaxGRESPerAccount", "the GPUs that your QOS (cluster.qos) shares among its users are all in use"),
    ("QOSMaxJobsPerUserLimit", "you run 0 other jobs, the most jobs your QOS (cluster.qos) allows you at once"),
    ("AssocMaxJobsLimit", "the most jobs your account (cluster.account) allows you at once"),
    ("ReqNodeNotAvail, UnavailableNodes:n[1-2]", "nodes it needs are down, drained or reserved "
                                                 "(UnavailableNodes:n[1-2]); it starts when the site returns them"),
    ("JobHeldUser", "held by its owner; release it with 'scontrol release 9'"),
    ("JobHeldAdmin", "held by the site's administrators; ask them to release job 9"),
    ("BeginTime", "held until its begin time"),
    ("Dependency", "waiting for the jobs it depends on to end"),
    ("PartitionTimeLimit", "its time limit is above partition 'gpu''s MaxTime: it can never start"),
    ("launch failed requeued held", "its launch failed and Slurm held it; 'launcher resume'"),
    ("QOSUsageThreshold", "QOSUsageThreshold (Slurm's reason)"),
    ("SomeNewCode", "SomeNewCode (Slurm's reason)"),
])
def test_each_code_users_meet_is_a_sentence_and_an_unknown_one_is_slurms(code, words):
    pending = job(reason=code)
    assert words in in_words(pending, Queue([pending]), NOW)


@pytest.mark.parametrize("code", ["", "None", "(null)"])
def test_no_reason_at_all_says_slurm_gives_none_yet(code):
    pending = job(reason=code)
    assert in_words(pending, Queue([pending]), NOW) == "waiting: Slurm gives no reason yet"


def test_jobs_slurm_does_not_consider_yet_stand_ahead_of_no_one():
    """The launcher's 0-GPU watcher of each run waits on a dependency, as a held job waits for its release: neither is
    counted among the jobs of higher priority."""
    mine = job(priority=0.5, reason="Priority")
    queue = Queue([mine, job("1", priority=0.9, gpus=0, reason="Dependency"),
                   job("2", priority=0.8, reason="JobHeldUser"), job("3", priority=0.7, reason="Resources")])
    assert in_words(mine, queue, NOW) == "behind 1 job of higher priority on partition 'gpu'"
