"""``cluster=auto`` without a cluster: sbatch --test-only's answers parsed, the candidates ranked (the soonest start,
ties to the lower step time), the words of each line, the candidates named or found, the bound on a silent one,
and what a launch refuses in one line (the real clusters' tests: tests/cluster/test_auto_cluster.py)."""
from __future__ import annotations

import threading
import time

import pytest

from launcher.cli import main
from launcher.compose.catalog import auto_asked
from launcher.errors import LaunchError
from launcher.service import auto
from launcher.slurm.output import JobRow, Node, SlurmError, parse_test_only
from launcher.submit.placement import Candidate, best_first, cannot, in_about, start_words
from support.helpers import REPO

NOW = 1_800_000_000.0


def test_sbatch_test_only_gives_the_start_nodes_and_partition():
    said = "sbatch: Job 197 to start at 2026-12-06T06:21:57 using 16 processors on nodes n[1-2] in partition gpu\n"
    answer = parse_test_only(said)
    assert answer.start == time.mktime((2026, 12, 6, 6, 21, 57, 0, 0, -1))
    assert (answer.nodes, answer.partition) == ("n[1-2]", "gpu")


@pytest.mark.parametrize("stderr, reason", [
    ("allocation failure: Requested node configuration is not available\n",
     "allocation failure: Requested node configuration is not available"),
    ("sbatch: error: Batch job submission failed: Job violates accounting/QOS policy\n",
     "Job violates accounting/QOS policy"),
])  # fmt: skip
def test_a_refusal_of_test_only_is_slurms_reason(stderr, reason):
    with pytest.raises(SlurmError, match=f"^{reason}$"):
        parse_test_only(stderr)


def test_the_soonest_start_wins_and_a_start_within_the_same_minute_goes_to_the_faster_cluster():
    slow_now = Candidate("slow", NOW + 5, step_s=0.9)
    fast_now = Candidate("fast", NOW + 40, step_s=0.3)
    unknown_now = Candidate("unknown", NOW, step_s=None)
    later = Candidate("later", NOW + 3600, step_s=0.1)
    refused = cannot("strict", "refused: no")
    ranked = best_first([refused, later, unknown_now, slow_now, fast_now], now=NOW)
    assert [c.cluster for c in ranked] == ["fast", "slow", "unknown", "later", "strict"]


def test_cannot_run_anywhere_keeps_the_order_given():
    ranked = best_first([cannot("b", "unreachable: x"), cannot("a", "refused: y")], now=NOW)
    assert [c.line for c in ranked] == ["b: unreachable: x", "a: refused: y"]


@pytest.mark.parametrize("seconds, words", [(20, "1 min"), (25 * 60, "25 min"), (3 * 3600 + 600, "3 h"),
                                            (5 * 86400, "5 days")])
def test_a_wait_in_round_words(seconds, words):
    assert in_about(seconds) == words


class FakeSlurm:
    """The two answers the words ask: the nodes (sinfo) and the queue (squeue)."""

    def __init__(self, used=0, pending=0, silent=False):
        self.used, self.pending, self.silent = used, pending, silent

    def nodes(self, timeout=None):
        if self.silent:
            raise SlurmError("sinfo: did not answer in 5 s")
        return [Node(f"n{i}", "gpu", True, 8, None, min(8, max(0, self.used - 8 * i)), "mixed", 8, 4096, "1:00:00",
                     None) for i in range(2)]

    def squeue(self):
        return [JobRow(str(i), "PENDING", "Priority", "", "", partition="gpu") for i in range(self.pending)] + \
            [JobRow("99", "PENDING", "JobHeldUser", "", "", partition="gpu")]


@pytest.mark.parametrize("asked, start, words", [
    (FakeSlurm(used=0), NOW + 2, "starts now (16 GPUs free)"),
    (FakeSlurm(used=16), NOW + 1800, "starts in about 30 min (16 of its 16 GPUs in use)"),
    (FakeSlurm(used=16, pending=4), NOW + 3 * 3600, "starts in about 3 h (behind 4 jobs waiting on partition 'gpu')"),
    (FakeSlurm(silent=True), NOW + 7200, "starts in about 2 h"),
])  # fmt: skip
def test_the_words_of_a_start(asked, start, words):
    assert start_words(asked, start, "gpu", now=NOW) == words


def test_cluster_auto_is_a_string_test_and_a_sweep_over_clusters_is_not_it():
    assert auto_asked(["model=gpt_tiny", "cluster=auto"])
    assert not auto_asked(["cluster=a,b"]) and not auto_asked(["cluster=autumn"])


@pytest.fixture
def clusters(monkeypatch):
    monkeypatch.setattr(auto, "cluster_choices", lambda: ["local", "site-a", "site-b"])


def test_the_candidates_are_those_named_or_every_configured_cluster(clusters):
    assert auto.candidate_names(["cluster=auto"]) == ["local", "site-a", "site-b"]
    assert auto.candidate_names(["cluster=auto", "cluster.candidates=[site-b, 'local']"]) == ["site-b", "local"]
    with pytest.raises(auto.LaunchError, match=r"^cluster.candidates=\[x,local\] must name configured clusters "
                                               r"\(local, site-a, site-b\), not x$"):
        auto.candidate_names(["cluster.candidates=[x,local]"])
    with pytest.raises(auto.LaunchError, match=r"^cluster.candidates=\[a,: .*; name clusters as cluster.candidates"):
        auto.candidate_names(["cluster.candidates=[a,"])


def test_each_candidates_run_records_them_all():
    assert auto.for_candidate(["model=gpt_tiny", "cluster=auto", "cluster.candidates=[a,b]"], "b", ["a", "b"]) == \
        ["model=gpt_tiny", "cluster=b", "cluster.candidates=[a,b]"]


class Run:
    """As much of a composed run as asking needs: its cluster's name."""

    def __init__(self, name):
        self.config = type("Config", (), {"cluster": type("Cluster", (), {"name": name, "ssh": None})})()


def test_a_silent_candidate_is_one_line_and_the_others_do_not_wait_for_it(monkeypatch):
    release = threading.Event()

    def asked(run, timeout):
        if run.config.cluster.name == "silent":
            release.wait(30)
        return Candidate(run.config.cluster.name, NOW, words="starts now")

    monkeypatch.setattr(auto, "_asked", asked)
    started = time.monotonic()
    answers = auto.ask([Run("silent"), Run("free")], timeout=0.5)
    release.set()
    assert time.monotonic() - started < 5
    assert [a.line for a in answers] == ["silent: unreachable: no answer within 0.5 s", "free: starts now"]


def test_no_candidate_that_can_run_it_is_one_line_naming_each():
    placement = auto.Placement([cannot("a", "refused: gpus=16 can never start"), cannot("b", "unreachable: down")])
    assert placement.chosen is None
    assert placement.refusal().message == ("cluster=auto: none of the 2 candidate clusters can run it (a: refused: "
                                           "gpus=16 can never start; b: unreachable: down)")


@pytest.mark.parametrize("args, said", [
    (["-m", "cluster=auto", "gpus=1,2"], "error: cluster=auto places one run; a sweep (-m) names its clusters: "
                                         "-m cluster=a,b"),
    (["-m", "cluster=auto", "search=optuna", "train.lr=interval(1e-4, 3e-3)"],
     "error: cluster=auto places one run; a search (search=optuna) names its cluster: cluster=NAME"),
    (["cluster=auto", "cluster.candidates=[nowhere]", "dry_run=true"], "error: cluster.candidates=[nowhere] must name "
                                                                       "configured clusters"),
])  # fmt: skip
def test_a_launch_refuses_what_auto_cannot_place_in_one_line(capsys, args, said):
    assert main(["model=gpt_tiny", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(said) and err.count("\n") == 1, err


@pytest.fixture
def waiting(tmp_path, monkeypatch):
    """A waiting run's directory as cluster=auto placed it on ``local`` among ``local`` and ``local2`` (a site
    layer's second cluster); Slurm expects its job nowhere (the quick tier's Slurm does not answer)."""
    from launcher.compose.composer import compose_runs
    from launcher.core.config import load_run_config
    from launcher.submit.submitter import write_run_files

    monkeypatch.setenv("LAUNCHER_SITE_CONFIG", str(REPO / "slurm" / "site"))
    (run,) = compose_runs(["model=gpt_tiny", "gpus=1", "cluster=local", "cluster.candidates=[local,local2]"])
    write_run_files(run, tmp_path)
    monkeypatch.setattr(auto, "_known", {})
    return tmp_path, load_run_config(tmp_path / "config.yaml")


class Asker:
    """The candidates' answers, counting the times it was asked."""

    def __init__(self, *answers):
        self.answers, self.asked = list(answers), []

    def __call__(self, runs):
        self.asked.append([run.config.cluster.name for run in runs])
        return self.answers


def test_a_waiting_run_is_told_where_it_would_start_sooner_asked_once_a_minute(waiting):
    run_dir, cfg = waiting
    asker = Asker(Candidate("local2", time.time(), words="starts now (16 GPUs free)", step_s=0.1))
    found = auto.sooner(run_dir, cfg, "r", "7", asker)
    assert found.words.startswith("would start sooner on local2: now (16 GPUs free); ")
    assert found.words.endswith(" move r cluster=local2")
    assert auto.sooner(run_dir, cfg, "r", "7", asker) == found
    assert asker.asked == [["local2"]]  # the other candidate only, and once within the minute


def test_pages_asking_at_once_of_a_waiting_run_ask_its_candidates_once(waiting):
    run_dir, cfg = waiting
    release = threading.Event()

    class Slow(Asker):
        def __call__(self, runs):
            release.wait(10)
            return super().__call__(runs)
    asker = Slow(Candidate("local2", time.time(), words="starts now (16 GPUs free)", step_s=0.1))
    pages = [threading.Thread(target=auto.sooner, args=(run_dir, cfg, "r", "7", asker)) for _ in range(4)]
    for page in pages:
        page.start()
    release.set()
    for page in pages:
        page.join(10)
    assert asker.asked == [["local2"]]


def test_no_hint_where_it_starts_sooner_where_it_waits_or_nowhere_else(waiting, monkeypatch):
    run_dir, cfg = waiting
    monkeypatch.setattr(auto, "_expected", lambda cluster, job_id: time.time() + 60)
    assert auto.sooner(run_dir, cfg, "r", "7", Asker(Candidate("local2", time.time() + 3600, words="x"))) is None
    monkeypatch.setattr(auto, "_known", {})
    assert auto.sooner(run_dir, cfg, "r", "7", Asker(cannot("local2", "refused: no"))) is None
    cfg.cluster.candidates = []
    asker = Asker()
    assert auto.sooner(run_dir, cfg, "r", "7", asker) is None and asker.asked == []  # a run placed by name: nothing


def test_a_runs_request_placed_again_keeps_its_settings_among_its_candidates_or_those_named(waiting):
    run_dir, _ = waiting
    assert auto.again(run_dir) == ["model=gpt_tiny", "gpus=1", "tracking=none", "cluster=auto",
                                   "cluster.candidates=[local,local2]"]
    assert auto.again(run_dir, ["local2"])[-1] == "cluster.candidates=[local2]"


def test_move_to_auto_goes_to_the_other_candidate_where_it_starts_sooner_or_the_run_stays(waiting, monkeypatch):
    from launcher.core.run_index import RunRecord
    from launcher.service.move import target_of

    run_dir, _ = waiting
    rec = RunRecord(name="r", run_dir=str(run_dir), model="gpt_tiny", gpus=1, nodes=1, gpus_per_node=1, steps=6,
                    cluster="local", submitted_at=1.0, job_id="7")
    asker = Asker(Candidate("local2", time.time(), words="starts now (2 GPUs free)", step_s=0.1))
    monkeypatch.setattr(auto, "ask", asker)  # the candidates' answers (Slurm expects the waiting job nowhere)
    assert target_of(rec, "auto") == ("local2", ["local2: starts now (2 GPUs free)"])
    assert asker.asked == [["local2"]]  # every candidate but where it waits
    monkeypatch.setattr(auto, "ask", Asker(cannot("local2", "refused: QOS normal allows 8 GPUs")))
    with pytest.raises(LaunchError, match=r"^r stays on local: no other candidate would start it sooner \(local2: "
                                          r"refused: QOS normal allows 8 GPUs\)$"):
        target_of(rec, "auto")


def test_compositions_in_threads_at_once_all_compose():
    """The console's threads may each ask where a waiting run would start sooner: Hydra composes one at a time."""
    from launcher.compose.composer import compose_runs

    composed, threads = [], []
    for gpus in (1, 2, 3):
        threads.append(threading.Thread(target=lambda n=gpus: composed.append(
            compose_runs(["model=gpt_tiny", f"gpus={n}"])[0].plan.gpus)))
        threads[-1].start()
    for thread in threads:
        thread.join()
    assert sorted(composed) == [1, 2, 3]
