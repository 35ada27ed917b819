"""A strict site's accounts, QOS and limits (launcher/slurm/limits.py): read from what sacctmgr and scontrol print,
judged before submitting, and kept for a few minutes. The same rules on a real strict cluster:
tests/cluster/test_strict_site.py."""
from __future__ import annotations

import dataclasses

import pytest

from launcher.slurm.limits import (CACHE_TTL_S, Limits, Request, SiteRules, cached, enforce_words, judge_site,
                                   largest_run, parse_associations, parse_partition_rules, parse_qos, tres)
from launcher.slurm.output import JobRow

# What Slurm 22.05 prints for slurm/up.sh --strict (format= as launcher/slurm/client.py asks).
QOS_OUT = "normal||gres/gpu=8||||||\nbig|||||||||\nshort|gres/gpu=4|||gres/gpu=32|node=1|00:30:00|2|10\n"
ASSOC_OUT = "lab||big,normal,short|normal||||||\nroot||normal|||||||\n"
PARTITIONS_OUT = (
    "PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL Default=YES QoS=N/A MaxNodes=UNLIMITED\n"
    "PartitionName=debug AllowGroups=ALL AllowAccounts=lab AllowQos=normal,short Default=NO QoS=short "
    "DenyQos=big MaxNodes=1\n")


def rules(**changes) -> SiteRules:
    base = SiteRules("alice", ("associations", "limits", "qos"), "lab", parse_associations(ASSOC_OUT),
                     parse_qos(QOS_OUT), parse_partition_rules(PARTITIONS_OUT))
    return dataclasses.replace(base, **changes)


def request(**changes) -> Request:
    return dataclasses.replace(Request(gpus=8, nodes=1, cpus=8, minutes=60, account=None, qos=None, partition="gpu"),
                               **changes)


def job(job_id: str, gpus: int, state: str = "RUNNING", user: str = "alice", qos: str = "normal") -> JobRow:
    return JobRow(job_id, state, "", "", "", user=user, gpus=gpus, qos=qos)


def test_what_slurm_prints_is_read_by_name():
    assert tres("cpu=16,gres/gpu:h100=8,node=2") == {"cpu": 16, "gres/gpu:h100": 8, "gres/gpu": 8, "node": 2}
    assert tres("") == {}
    qos = parse_qos(QOS_OUT)
    assert qos["normal"] == Limits(per_user={"gres/gpu": 8})
    assert qos["short"] == Limits(per_job={"gres/gpu": 4}, group={"gres/gpu": 32}, min_per_job={"node": 1},
                                  max_wall_min=30, max_jobs=2, max_submit=10)
    lab, root = parse_associations(ASSOC_OUT)
    assert (lab.account, lab.partition, lab.qos, lab.default_qos) == ("lab", "", ("big", "normal", "short"), "normal")
    assert (root.qos, root.default_qos) == (("normal",), "")
    parts = parse_partition_rules(PARTITIONS_OUT)
    assert parts["gpu"].allow_accounts is None and parts["gpu"].qos == ""
    assert (parts["debug"].allow_accounts, parts["debug"].allow_qos, parts["debug"].qos, parts["debug"].deny_qos) == \
        (("lab",), ("normal", "short"), "short", ("big",))
    assert enforce_words("AccountingStorageEnforce = associations,limits,qos\n") == ("associations", "limits", "qos")
    assert enforce_words("AccountingStorageEnforce = none\n") == ()
    assert SiteRules.from_json(rules().to_json()) == rules()


@pytest.mark.parametrize("changes, refusal", [
    ({"gpus": 16, "nodes": 2, "cpus": 16},
     "gpus=16 can never start under QOS normal, which allows at most 8 GPUs to each user at once "
     "(MaxTRESPerUser=gres/gpu=8): use gpus=8 or cluster.qos=big"),
    ({"qos": "short", "gpus": 8},
     "gpus=8 can never start under QOS short, which allows at most 4 GPUs per job (MaxTRESPerJob=gres/gpu=4): "
     "use gpus=4 or cluster.qos=big or cluster.qos=normal"),
    ({"qos": "short", "gpus": 4, "minutes": 60},
     "cluster.time_limit_min=60 is above QOS short's MaxWall of 30 min: lower cluster.time_limit_min: use "
     "cluster.qos=big or cluster.qos=normal"),
    ({"account": "physics"}, "cluster.account=physics is not one of your accounts (lab, root): set one of them"),
    ({"qos": "gold"}, "cluster.qos=gold is not one of account lab's QOS for you (big, normal, short): set one of them"),
    ({"account": "root", "qos": "big"},
     "cluster.qos=big is not one of account root's QOS for you (normal): set one of them"),
    ({"account": "root", "partition": "debug"},
     "partition 'debug' does not take jobs of account root: pick another partition or account"),
    ({"qos": "big", "partition": "debug"},
     "partition 'debug' does not take QOS big (it takes normal, short): set cluster.qos"),
])  # fmt: skip
def test_a_run_the_site_would_reject_or_never_start_is_refused_with_the_way_out(changes, refusal):
    assert judge_site(request(**changes), rules(), []).refusals == [refusal]


def test_a_run_within_every_limit_passes_and_one_behind_the_users_own_jobs_is_warned():
    assert judge_site(request(), rules(), []) == judge_site(request(), rules(), [job("7", 8, user="bob")])
    assert judge_site(request(), rules(), []).refusals == judge_site(request(), rules(), []).warnings == []
    waits = judge_site(request(gpus=4), rules(), [job("12", 4), job("13", 2, "PENDING"), job("14", 0, "PENDING"),
                                                  job("9", 8, "COMPLETED"), job("15", 8, qos="big")])
    assert waits.refusals == []
    assert waits.warnings == ["will wait: QOS normal allows each user 8 GPUs at once and your jobs 12, 13 hold or "
                              "ask for 6"]
    running = judge_site(request(qos="short", gpus=2, minutes=20), rules(),
                         [job("3", 1, qos="short"), job("4", 1, qos="short")])
    assert running.warnings == ["will wait: QOS short runs at most 2 jobs per user at once and 2 of yours run (3, 4)"]


def test_a_partitions_own_qos_and_the_submit_limit_count_too():
    # debug's own QOS is short: 4 GPUs per job, whatever the job's QOS
    found = judge_site(request(partition="debug", minutes=10), rules(), [])
    assert found.refusals == ["gpus=8 can never start under partition 'debug''s QOS short, which allows at most 4 "
                              "GPUs per job (MaxTRESPerJob=gres/gpu=4): use gpus=4"]
    queued = [job(str(n), 0, "PENDING", qos="short") for n in range(9)]
    found = judge_site(request(qos="short", gpus=1, minutes=10), rules(), queued)
    assert found.refusals[0].startswith("you have 9 jobs queued or running and QOS short takes at most 10 per user "
                                        "(MaxSubmitJobsPerUser); a run submits 2 (its job and its watcher)")


def test_where_nothing_is_enforced_nothing_is_refused_and_a_user_without_an_account_is_told():
    open_site = rules(enforce=(), associations=(), qos={})
    assert not open_site.enforced
    assert largest_run(open_site, "gpu", 16) == (16, "the partition")
    assert judge_site(request(), rules(associations=()), []).refusals == [
        "user alice has no association on this cluster (no Slurm account to run under): ask the site's admins for one"]
    # limits not enforced: the account and QOS still are, the sizes are not
    assert judge_site(request(gpus=64), rules(enforce=("associations", "qos")), []).refusals == []


def test_the_largest_run_names_what_sets_it():
    assert largest_run(rules(), "gpu", 16) == (8, "QOS normal, MaxTRESPerUser")
    assert largest_run(rules(), "gpu", 4) == (4, "the partition")
    assert largest_run(rules(default_account="root"), "debug", 8)[0] == 0


def test_the_rules_are_kept_for_a_few_minutes(tmp_path):
    path, asked = tmp_path / "cache" / "site-rules-x.json", []

    def ask():
        asked.append(1)
        return rules()

    assert cached(path, ask) == rules() and len(asked) == 1
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(path.parent.stat().st_mode & 0o777) == "0o700"
    assert cached(path, ask) == rules() and len(asked) == 1
    assert cached(path, ask, now=path.stat().st_mtime + CACHE_TTL_S + 1) == rules() and len(asked) == 2
    path.write_text("{damaged")
    assert cached(path, ask) == rules() and len(asked) == 3
