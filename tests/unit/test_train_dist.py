"""Distributed bring-up: reading the environment (Slurm or torchrun), and failing clearly.

The all-reduce check itself runs in every multi-rank test (parity, resume),
which assert its logged result.
"""
import datetime
import json
import os
import threading
import time

import pytest
import torch
import torch.distributed as dist

from launcher.core.events import encode
from launcher.train import dist as tdist
from launcher.train.dist import DistEnv
from launcher.train.preflight import JOINED, NAMED, NodeUnfit, check_in, summary
from support.train_harness import free_port


@pytest.fixture
def clean_env(monkeypatch):
    for var in list(os.environ):
        if var.startswith("SLURM") or var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                              "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(var)
    return monkeypatch


def test_slurm_environment(clean_env):
    clean_env.setenv("SLURM_PROCID", "5")
    clean_env.setenv("SLURM_LOCALID", "1")
    clean_env.setenv("SLURM_NTASKS", "8")
    clean_env.setenv("SLURM_JOB_NUM_NODES", "2")
    clean_env.setenv("SLURM_JOB_NODELIST", "node[7-8]")
    clean_env.setenv("SLURM_JOB_ID", "123456")
    clean_env.setenv("SLURMD_NODENAME", "node8")
    launch = tdist._launch_from_environ()
    assert (launch.rank, launch.local_rank, launch.world_size, launch.nodes, launch.node) == (5, 1, 8, 2, "node8")
    assert launch.master_host == "node7"
    assert launch.master_port == 20000 + 123456 % 12768  # no cluster name: the job id alone
    clean_env.setenv("SLURM_CLUSTER_NAME", "local2")
    assert tdist._launch_from_environ().master_port != launch.master_port
    assert all(20000 <= tdist._port_for_job(name, job) < 32768 for name in ("local", "local2") for job in range(9999))
    assert tdist.global_rank_from_environ() == 5
    clean_env.setenv("MASTER_PORT", "31111")
    assert tdist._launch_from_environ().master_port == 31111


def test_torchrun_variables_win_over_slurm(clean_env):
    # torchrun inside an sbatch script: every process inherits SLURM_PROCID=0.
    for var, value in {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "node7", "SLURM_JOB_ID": "9",
                       "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                       "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"}.items():
        clean_env.setenv(var, value)
    launch = tdist._launch_from_environ()
    assert (launch.rank, launch.local_rank, launch.world_size, launch.nodes) == (3, 1, 4, 2)
    assert (launch.master_host, launch.master_port) == ("10.0.0.1", 29400)
    assert tdist.global_rank_from_environ() == 3


def test_no_launcher_is_a_world_of_one(clean_env):
    launch = tdist._launch_from_environ()
    assert (launch.rank, launch.world_size, launch.nodes, launch.master_host) == (0, 1, 1, "127.0.0.1")


def test_world_of_one_brings_up_and_checks(clean_env):
    env = tdist.init_distributed(timeout_s=30)
    try:
        assert (env.rank, env.world_size, env.device.type) == (0, 1, "cpu")
        assert tdist.check_allreduce(env) == 1
    finally:
        dist.destroy_process_group()


def test_the_ranks_register_with_a_store_that_libuv_serves(clean_env):
    """The rendezvous's store is rank 0's TCPStore on libuv's server (torch's own choice for a ``tcp://`` init
    method unless USE_LIBUV=0): measured linear to 1,024 clients, and it looks up no client's name, where the legacy
    server grows faster and looks up each client's name in its one thread (scripts/bench_rendezvous.py,
    docs/performance.md)."""
    clean_env.delenv("USE_LIBUV", raising=False)
    tdist.init_distributed(timeout_s=30)
    try:
        store = dist.distributed_c10d._get_default_store()
        while isinstance(store, dist.PrefixStore):
            store = store.underlying_store
        assert isinstance(store, dist.TCPStore) and store.libuvBackend
    finally:
        dist.destroy_process_group()


def test_rendezvous_failure_names_node_and_port(clean_env):
    port = free_port()  # nobody listens: rank 1 waits for a rank 0 that never comes
    for var, value in {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        clean_env.setenv(var, value)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"rank 1/2 on .*: rendezvous with rank 0 at 127.0.0.1 .* port {port} failed"):
        tdist.init_distributed(timeout_s=2)
    print(f"rendezvous gave up after {time.monotonic() - start:.2f} s (timeout_s=2)")
    assert not dist.is_initialized()


def test_unresolvable_host_is_named(clean_env):
    with pytest.raises(RuntimeError, match="cannot resolve the rendezvous host 'no-such-node.invalid'"):
        tdist._resolve("no-such-node.invalid")


@pytest.mark.parametrize("cpus_per_task, visible, node_cpus, ranks_on_node, threads", [
    ("4", 16, 16, 4, 4),     # Slurm's share of the task, however many cores it can see
    ("8", 2, 16, 4, 2),      # never more than it may run on
    (None, 16, 16, 8, 2),    # no --cpus-per-task, no binding: the node's cores shared by its ranks
    (None, 2, 16, 8, 2),     # bound to 2 cores by Slurm's task/affinity: those
    (None, 2, 2, 8, 1),      # 8 ranks on 2 cores: one each, not none
])
def test_a_rank_uses_the_cpus_slurm_gave_it(clean_env, cpus_per_task, visible, node_cpus, ranks_on_node, threads):
    clean_env.delenv("OMP_NUM_THREADS", raising=False)
    if cpus_per_task:
        clean_env.setenv("SLURM_CPUS_PER_TASK", cpus_per_task)
    clean_env.setattr(os, "sched_getaffinity", lambda pid: set(range(visible)))
    clean_env.setattr(os, "cpu_count", lambda: node_cpus)
    assert tdist.cpu_threads(ranks_on_node) == threads


def test_omp_num_threads_is_the_users_choice(clean_env):
    clean_env.setenv("OMP_NUM_THREADS", "3")
    clean_env.setenv("SLURM_CPUS_PER_TASK", "1")
    assert tdist.cpu_threads(8) is None


def test_the_preflight_record_stays_small_at_sixteen_thousand_ranks_and_names_the_slow_node(tmp_path):
    """Every status command reads the preflight event: at 16,384 ranks it holds a summary (the median, the
    slowest ranks, the flagged ones and their node), and every rank's figure goes to a table of its own."""
    everyone = [(f"node{rank // 8:04d}", 20.0 + (rank % 7) * 0.01) for rank in range(16384)]
    for rank in range(4096, 4104):  # one node's eight ranks, a tenth of the others' bandwidth
        everyone[rank] = ("node0512", 2.0)
    report = summary(everyone, "1234", tmp_path)
    assert len(json.dumps(encode(report))) < 2000  # every rank's figure would take about 0.5 MB
    assert (report.ranks, report.slow_count, report.slow_nodes) == (16384, 8, ["node0512"])
    assert report.slow_ranks == list(range(4096, 4104)) and len(report.slowest) == NAMED
    assert {row["node"] for row in report.slowest} == {"node0512"} and report.median_gbps == pytest.approx(20.03)
    table = json.loads((tmp_path / report.table).read_text())
    assert report.table == "preflight/1234.json" and len(table["ranks"]) == 16384
    assert table["ranks"][4100] == {"rank": 4100, "node": "node0512", "gbps": 2.0}


def test_a_rank_whose_checks_never_end_is_named_by_the_others_within_the_preflight_timeout(tmp_path):
    """Ranks 0 and 2 check in; rank 1 (on node b) joined but its device check never returned: within the timeout,
    rank 0 records that node, and every rank that waited raises NodeUnfit (the retry leaves node b out)."""
    server = dist.TCPStore("127.0.0.1", free_port(), None, True, timeout=datetime.timedelta(seconds=30),
                           wait_for_workers=False)
    port = server.port
    envs = [DistEnv(rank=r, local_rank=0, world_size=3, nodes=3, node="abc"[r], device=torch.device("cpu"))
            for r in range(3)]
    for env in envs:
        server.set(f"{JOINED}{env.rank}", env.node)
    raised = {}

    def rank(env):
        store = dist.TCPStore("127.0.0.1", port, None, False, timeout=datetime.timedelta(seconds=30))
        try:
            check_in(store, env, tmp_path, timeout_s=1.0)
        except NodeUnfit as err:
            raised[env.rank] = str(err)

    started = time.monotonic()
    threads = [threading.Thread(target=rank, args=(envs[r],)) for r in (0, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert time.monotonic() - started < 10 and sorted(raised) == [0, 2], raised
    failed = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["rank"], e["node"]) for e in failed] == [("preflight_failed", 1, "b")]  # rank 0's, once
    assert "rank 1 on b did not finish their preflight checks within 1 s" in failed[0]["problem"]


class _Clock:
    """The interrupt's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now


@pytest.mark.parametrize("signal_delay_s, within_s", [(120, 10.0), (8, 2.0), (0, 0.0)])
def test_the_ranks_agree_on_slurms_signal_as_often_as_steps_fit_in_the_bound(clean_env, tmp_path, signal_delay_s,
                                                                            within_s):
    """Between saves, the ranks agree (a host sync on a GPU) after the first step, then after as many steps as fit
    in 10 s (a quarter of a short warning) at the step time measured since the last agreement, growing from one
    step by doubling: a signal is acted on within that bound while steps keep their pace, at every step when they
    are slower than it, and a slowdown stretches an interval or two."""
    import signal

    from launcher.train import interrupt as module

    clock = _Clock()
    clean_env.setattr(module, "time", clock)
    handlers = {sig: signal.getsignal(sig) for sig in (module.preemption.SIGNAL, signal.SIGTERM)}
    env = tdist.init_distributed(timeout_s=30)
    try:
        agreement = module.Interrupt(env, tmp_path, signal_delay_s)
        assert agreement.within_s == within_s
        paces = [0.25] * 400 + [1.0] * 100  # seconds a step: then the steps slow down
        agreed = [0]
        for step, seconds in enumerate(paces, start=1):
            clock.now += seconds
            if agreement.due(step):
                assert not agreement.agreed(step)
                agreed.append(step)
        gaps = [(b - a, sum(paces[a:b])) for a, b in zip(agreed, agreed[1:])]
        if within_s:
            assert [n for n, _ in gaps[:4]] == [1, 1, 2, 4] and len(agreed) <= sum(paces) / within_s + 12
            # measured at the pace of the steps before: the bound holds while it lasts, and a slowdown (steps 4x
            # slower) stretches the interval it falls in and the next, which still mixes the two paces
            over = [seconds for _, seconds in gaps if seconds > within_s]
            assert len(over) <= 2 and max(over) <= 4 * within_s
            assert gaps[-1] == (int(within_s), within_s)  # the slower steps measured: the bound holds again
        else:
            assert agreed == list(range(len(paces) + 1))  # no warning to spare: every step
        agreement.heard = True  # Slurm's signal came
        step = next(s for s in range(len(paces) + 1, 10 * len(paces)) if agreement.due(s))
        assert agreement.agreed(step)
    finally:
        dist.destroy_process_group()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def test_a_stop_or_slurms_sigterm_is_saved_for_at_the_next_agreement_when_the_save_fits(clean_env, tmp_path):
    """Rank 0 answers a stop asked of its own job (not another's) at the next agreement; after a SIGTERM the
    ranks agree at every step; Slurm's (every rank heard it: here the one) is saved for when the save fits in what
    is left of KillWait, else training goes on and rank 0 records why (the save, or KillWait, or how long a save
    takes, unknown)."""
    import signal

    from launcher.core import stop_request
    from launcher.train import interrupt as module

    clock = _Clock()
    clean_env.setattr(module, "time", clock)
    clean_env.setenv("SLURM_JOB_ID", "77")
    handlers = {sig: signal.getsignal(sig) for sig in (module.preemption.SIGNAL, signal.SIGTERM)}
    env = tdist.init_distributed(timeout_s=30)

    def sigterm_after(agreement, seconds: float, step: int):
        signal.raise_signal(signal.SIGTERM)
        clock.now += seconds
        return agreement.agreed(step)

    try:
        clean_env.setenv("LAUNCHER_KILL_WAIT_S", "30")
        agreement = module.Interrupt(env, tmp_path, 120)
        stop_request.ask(tmp_path, "76", "ann", 300)  # another job's
        assert agreement.agreed(1) is None
        stop_request.ask(tmp_path, "77", "ann", 300)
        stopped = agreement.agreed(2)
        assert (stopped.kind, stopped.job_id, stopped.step, stopped.by) == ("stopped", "77", 2, "ann")
        stop_request.withdraw(tmp_path)
        step = 2
        while step < 100:  # steps of 0.1 s: the agreements grow apart
            step, clock.now = step + 1, clock.now + 0.1
            if agreement.due(step):
                assert agreement.agreed(step) is None
        assert not agreement.due(step + 1)
        agreement.saved_in(4.0)
        step = next(s for s in range(step, 1000) if agreement.due(s))
        ended = sigterm_after(agreement, 5.0, step)  # 4 s x 1.5 + 2 s fits in the 25 s left
        assert (ended.kind, ended.step, ended.saved, ended.left_s, ended.save_s) == ("terminated", step, True, 25.0,
                                                                                     4.0)
        assert agreement.due(step + 1)  # a SIGTERM heard: the ranks agree at every step until it is judged
        assert sigterm_after(agreement, 23.0, step + 1) is None  # 7 s left: trained on
        for kill_wait, saved in (("", 4.0), ("30", None)):
            clean_env.setenv("LAUNCHER_KILL_WAIT_S", kill_wait)
            agreement = module.Interrupt(env, tmp_path, 120)
            if saved:
                agreement.saved_in(saved)
            assert sigterm_after(agreement, 1.0, 7) is None
        said = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
        assert [(e["event"], e["step"], e["saved"], e["kill_wait_s"]) for e in said] == [
            ("terminated", step + 1, False, 30.0), ("terminated", 7, False, None), ("terminated", 7, False, 30.0)]
        assert [e["reason"].split(" (")[0].split(",")[0] for e in said] == [
            "a save", "Slurm's KillWait is unknown here", "no checkpoint was saved or loaded in this attempt yet"]
    finally:
        dist.destroy_process_group()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
