"""The web console without a browser or a cluster: its token and origin rules, its curves' downsampling, the
incremental reading of a growing metrics file, the pages' JSON from real run directories, and Slurm's answers
shared between callers (the browser tests are tests/cluster/test_console.py)."""
import importlib.util
import json
import os
import re
import stat
import threading
import time

import pytest
from starlette.testclient import TestClient

from launcher.compose.composer import compose_runs
from launcher.console import readers
from launcher.console.app import Console, application
from launcher.console.serve import write_token
from launcher.errors import LaunchError
from launcher.service.move import unmovable
from launcher.core.metrics import Row
import launcher.slurm.client as slurm_client
from launcher.slurm.client import Asking, SharedAnswers, SlurmError
from launcher.submit.submitter import write_run_files
from support.helpers import REPO, wait_for

TOKEN = "t0ken-of-this-start"


def client(tmp_path, host="127.0.0.1:8000"):
    console = Console([tmp_path], None, TOKEN, [host, "localhost:8000"])
    return TestClient(application(console), base_url=f"http://{host}")


def test_every_request_needs_the_token_and_the_first_page_moves_it_into_a_strict_cookie(tmp_path):
    web = client(tmp_path)
    for path in ("/", "/api/runs", "/static/console.js", "/api/run/x/curves"):
        answer = web.get(path)
        assert answer.status_code == 403 and "no valid token" in answer.text, path
    assert web.get("/?token=wrong").status_code == 403
    first = web.get(f"/?token={TOKEN}", follow_redirects=False)
    assert first.status_code == 303 and first.headers["location"] == "/"  # the token leaves the address
    cookie = first.headers["set-cookie"]
    assert cookie.startswith(f"launcher_console_8000={TOKEN};") and "HttpOnly" in cookie and "SameSite=strict" in cookie
    page = web.get("/")  # the client keeps the cookie, as a browser does
    assert page.status_code == 200 and "/static/console.js" in page.text
    assert web.get("/static/uPlot.iife.min.js").status_code == 200
    assert web.get("/api/runs").json() == {"rows": [], "page": 0, "more": False, "banners": []}


def test_another_host_and_a_cross_origin_action_are_refused(tmp_path):
    web = client(tmp_path)
    web.get(f"/?token={TOKEN}")
    rebound = web.get("/api/runs", headers={"host": "evil.example:8000"})
    assert rebound.status_code == 403 and "not 'evil.example:8000'" in rebound.text
    for origin in ({}, {"origin": "http://evil.example"}):
        answer = web.post("/api/run/x/stop", headers=origin)
        assert answer.status_code == 403 and "this console's own page" in answer.text, origin
    same = web.post("/api/run/x/stop", headers={"origin": "http://127.0.0.1:8000"})
    assert same.status_code == 400 and same.json()["error"].startswith("no run named 'x'"), same.text  # stop's own
    assert web.get("/api/run/x/stop").status_code == 405  # no GET changes anything


def test_the_token_file_is_the_users_own(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path / "home"))
    path = write_token("abc")
    assert path.read_text() == "abc\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_long_run_is_sent_downsampled_with_its_evaluations_and_its_newest_point():
    records = [{"step": s, "loss": 10.0 - s / 1e4, "lr": 1e-3, "tokens_per_s": 800.0,
                **({"eval_loss": 5.0 - s / 1e5} if s % 500 == 0 else {})} for s in range(1, 100_001)]
    records.append({"step": 100_000, "final": True, "loss": 0.0})
    curves = readers.curves(records, gpus=8, points=1000)
    assert len(curves["step"]) == 1000 and curves["logged"] == 100_000
    assert curves["step"][-1] == 100_000 and curves["loss"][-1] == 10.0 - 100_000 / 1e4  # not the final record's
    assert sum(v is not None for v in curves["eval_loss"]) == 200  # every bucket of 100 steps holds one evaluation
    assert curves["tokens_per_s_per_gpu"][0] == 100.0
    short = readers.curves(records[:5], gpus=1, points=1000)
    assert short["step"] == [1, 2, 3, 4, 5] and short["eval_loss"] == [None] * 5


def test_a_growing_metrics_file_is_read_from_where_the_last_read_ended(tmp_path):
    tails = readers.Tails()
    path = tmp_path / "metrics.jsonl"
    assert tails.metrics(tmp_path) == []
    path.write_text('{"step": 1}\n{"step": 2}\n{"step"')  # a line being written
    assert [r["step"] for r in tails.metrics(tmp_path)] == [1, 2]
    with path.open("r+") as handle:  # spoil what was read already: a reader from the start would lose it
        handle.write("xxxxxxxxxxx")
        handle.seek(0, 2)
        handle.write(': 3}\n{"step": 4}\n')
    assert [r["step"] for r in tails.metrics(tmp_path)] == [1, 2, 3, 4]  # read on from where it stopped
    path.write_text('{"step": 1}\n')  # rewritten shorter: read again from the start
    assert [r["step"] for r in tails.metrics(tmp_path)] == [1]


def planted(root, count):
    """``count`` finished runs as scripts/bench_console.py plants them (records, settled states, events, metrics)."""
    spec = importlib.util.spec_from_file_location("bench_console", REPO / "scripts" / "bench_console.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench.plant(root, count)


def test_the_runs_page_filters_and_pages_the_runs_newest_first(tmp_path):
    names = planted(tmp_path, 120)
    first = readers.runs_page([tmp_path], {})
    assert [row["name"] for row in first["rows"]] == names[::-1][:50] and first["more"] and first["banners"] == []
    assert first["rows"][0]["status"] == "COMPLETED" and first["rows"][0]["loss"] == 3.0  # its last metrics
    assert first["rows"][0]["goodput"] is None  # without the console's tails, no metrics are read for it
    followed = readers.runs_page([tmp_path], {}, readers.Tails())["rows"][0]
    assert followed["goodput"] == 0.8 and not followed["remote"]  # 40 of the 50 s since submission trained
    last = readers.runs_page([tmp_path], {"page": "2"})
    assert [row["name"] for row in last["rows"]] == names[::-1][100:] and not last["more"]
    named = readers.runs_page([tmp_path], {"name": "-0006"})  # 0x60 to 0x6f
    assert [row["name"] for row in named["rows"]] == [n for n in names[::-1] if "-0006" in n] and len(named["rows"]) == 16
    swept = readers.runs_page([tmp_path], {"sweep": "sweep000", "status": "completed"})
    assert len(swept["rows"]) == 50 and swept["more"] and {r["sweep"] for r in swept["rows"]} == {"sweep000"}
    assert readers.runs_page([tmp_path], {"status": "RUNNING"})["rows"] == []
    with pytest.raises(LaunchError, match="--status NOPE: allowed"):
        readers.runs_page([tmp_path], {"status": "nope"})
    with pytest.raises(LaunchError, match="page must be a number, got 'x'"):
        readers.runs_page([tmp_path], {"page": "x"})


def test_slurms_answers_are_shared_for_their_age_and_a_failure_too():
    shared = SharedAnswers()
    shared.max_age_s = 30
    asked = []

    def ask():
        asked.append(1)
        return "answer"
    threads = [threading.Thread(target=lambda: shared.answer("conf", ("squeue",), ask)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(asked) == 1 and shared.calls == 1  # eight tabs at once: one squeue

    def fail():
        asked.append(1)
        raise SlurmError("scontrol ping: DOWN")
    for _ in range(3):
        with pytest.raises(SlurmError, match="DOWN"):
            shared.answer("down", ("scontrol", "ping"), fail)
    assert len(asked) == 2
    shared.forget("conf")
    shared.answer("conf", ("squeue",), ask)
    assert len(asked) == 3


def test_while_slurm_is_slow_a_refresh_gets_the_last_answer_dated_at_once_and_the_new_one_after():
    shared = SharedAnswers()
    shared.max_age_s, shared.wait_s = 0.01, 0.05
    answered, slow = threading.Event(), ["first"]

    def ask():
        if slow[0] != "first":
            answered.wait(10)  # a controller slow to answer, until the test lets it
        return slow[0]
    assert shared.answer("conf", ("squeue",), ask) == "first"
    slow[0] = "second"
    time.sleep(0.02)  # the first answer's age passes
    kept: list = []
    started = time.monotonic()
    assert shared.answer("conf", ("squeue",), ask, kept) == "first"  # at once, not after Slurm
    assert time.monotonic() - started < 5 and kept and kept[0].words(time.time()).startswith("as of ")
    assert shared.answer("conf", ("squeue",), ask, []) == "first" and shared.calls == 2  # one question out
    answered.set()
    shared.max_age_s = 60  # from here on the kept answer: the slow question's once it came
    wait_for(lambda: shared.answer("conf", ("squeue",), lambda: "never asked") == "second", 10, "the new answer")
    assert shared.calls == 2


def test_a_caller_waiting_for_an_answer_gets_it_though_an_action_forgot_the_kept_ones_meanwhile(monkeypatch):
    shared = SharedAnswers()
    shared.max_age_s = 30

    class ForgottenOnWaking(threading.Event):
        """The question's end as a waiter sees it when a Stop in another tab forgets every kept answer between the
        answer's coming and the waiter's reading it."""

        def wait(self, timeout=None):
            answered = super().wait(timeout)
            shared.forget()
            return answered
    monkeypatch.setattr(slurm_client, "Asking", lambda since: Asking(since, ForgottenOnWaking()))
    assert shared.answer("conf", ("squeue",), lambda: "answer") == "answer"


def test_the_console_is_one_line_when_its_stack_is_missing(tmp_path):
    code = ("import builtins, sys; real = builtins.__import__\n"
            "def fake(name, *a, **k):\n"
            "    if name == 'uvicorn': raise ImportError('no uvicorn', name='uvicorn')\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = fake\n"
            "from launcher.cli import main; sys.exit(main(['ui']))")
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "LAUNCHER_HOME": str(tmp_path)})
    assert res.returncode == 2 and res.stderr.startswith("error: launcher ui needs the console's web stack "
                                                          "(uvicorn is missing): pip install"), res.stderr
    assert json.dumps(res.stderr).count("\\n") == 1


def test_other_commands_do_not_load_the_web_stack_and_the_benchmark_runs_quick(tmp_path):
    import subprocess
    import sys

    env = {**os.environ, "LAUNCHER_RUN_ROOT": str(tmp_path)}
    code = "import sys; from launcher.cli import main; main(['runs']); print(sorted(m for m in sys.modules " \
           "if m.split('.')[0] in ('starlette', 'uvicorn', 'anyio')))"
    listed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env)
    assert listed.stdout.strip().endswith("[]"), listed.stdout + listed.stderr
    bench = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_console.py"), "--quick"],
                           capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert bench.returncode == 0, bench.stderr
    assert re.fullmatch(r"console first page with 300 runs: [\d.]+ s cold, [\d.]+ s warm, 50 rows; budget 1\.0 s: "
                        r"[\d.]+x of it\n", bench.stdout), bench.stdout


def test_a_remote_runs_files_are_followed_from_their_offsets_in_one_answer(tmp_path):
    """The cluster's side of a remote run's page (launcher/remote/agent.py ``follow``), and the console's copy."""
    from launcher.remote.agent import follow

    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "run.json").write_text("{}")
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (run / "logs" / "rank_0.log").write_text("one\ntwo\n")
    first = follow({"run_dir": str(run), "job_id": "7"})
    assert [r["step"] for r in first["metrics"]] == [1, 2] and not first["again"]
    assert first["log"]["text"] == "one\ntwo\n" and first["log"]["offset"] == 8
    with (run / "metrics.jsonl").open("a") as handle:
        handle.write('{"step": 3}\n')
    with (run / "logs" / "rank_0.log").open("a") as handle:
        handle.write("three\n")
    second = follow({"run_dir": str(run), "metrics_offset": first["metrics_offset"], "log_offset": 8})
    assert [r["step"] for r in second["metrics"]] == [3] and second["log"]["text"] == "three\n"
    tails = readers.Tails()
    key = ("site", str(run))
    tails.add(key, first["metrics"], first["metrics_offset"], first["again"])
    assert [r["step"] for r in tails.add(key, second["metrics"], second["metrics_offset"], False)] == [1, 2, 3]
    (run / "metrics.jsonl").write_text('{"step": 9}\n')  # rewritten shorter
    third = follow({"run_dir": str(run), "metrics_offset": second["metrics_offset"]})
    assert third["again"] and [r["step"] for r in third["metrics"]] == [9]
    assert [r["step"] for r in tails.add(key, third["metrics"], third["metrics_offset"], True)] == [9]
    with pytest.raises(LaunchError, match="no run directory .*none on this cluster"):
        follow({"run_dir": str(tmp_path / "none")})


@pytest.mark.parametrize("flags, error", [
    (["--port", "70000"], "error: --port 70000: allowed 0 (a free one) to 65535"),
    (["--slurm-every", "0.5"], "error: --slurm-every 0.5: allowed 1 second or more"),
    (["--host", "no.such.host.invalid"], "error: cannot serve on no.such.host.invalid:0: "),
])  # fmt: skip
def test_a_bad_option_is_one_line_and_serves_nothing(flags, error, tmp_path):
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "launcher", "ui", *flags], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "LAUNCHER_HOME": str(tmp_path)}, timeout=60)
    assert res.returncode == 2 and res.stderr.startswith(error) and res.stderr.count("\n") == 1, res.stderr
    assert not (tmp_path / "console").exists()  # no token written for a console that never served


def test_a_run_pages_plan_sets_no_stand_ins_speed_beside_cpus_and_none_without_a_gpu_type(tmp_path):
    """The plan beside the measurement: the local cluster's H100 stand-in, labelled, and once the run has measured
    on CPUs (a row without MFU), its memory only; a GPU of unknown type, no speed at all and the line naming it."""
    (local,), (untyped,) = compose_runs(["model=gpt_tiny", "gpus=2"]), compose_runs(["model=gpt_tiny", "cluster=slurm"])
    for run, name in ((local, "local"), (untyped, "untyped")):
        (tmp_path / name).mkdir()
        write_run_files(run, tmp_path / name)
    ahead = readers.predicted(tmp_path / "local")
    assert ahead["gpu"] == "H100 stand-in" and ahead["stand_in"] and ahead["tokens_per_s"] > 0
    assert ahead["note"] == "planned for an H100 stand-in: the cluster's GPUs are virtual"
    beside = readers.predicted(tmp_path / "local", Row(step=10, step_time=1.69, tokens_per_s=19385.0, mfu=None))
    assert (beside["step_time_s"], beside["tokens_per_s"], beside["mfu"]) == (None, None, None)
    assert beside["memory_gb"] == ahead["memory_gb"] and beside["note"].endswith("its ranks train on CPUs, so no "
                                                                                 "stand-in's speed is set beside theirs")
    unknown = readers.predicted(tmp_path / "untyped", Row(step=10, step_time=1.69, mfu=None))
    figures = (unknown["gpu"], unknown["step_time_s"], unknown["tokens_per_s"], unknown["mfu"])
    assert figures == ("unknown", None, None, None)
    assert unknown["note"].startswith("no step time, tokens/s or MFU: GPU type unknown: set cluster.gpu_type=TYPE")


def test_an_empty_listing_says_how_many_runs_are_in_which_other_states(tmp_path, capsys):
    """``runs --status running`` right after a resume: runs exist, only in other states; and a row's tokens/s says
    whether it is the newest interval's or an ended attempt's mean."""
    from launcher import cli

    planted(tmp_path, 3)
    assert readers.runs_page([tmp_path], {"status": "RUNNING"})["left_out"] == {"COMPLETED": 3}
    assert readers.runs_page([tmp_path], {})["rows"][0]["rates_over"] == "interval"  # no final row planted
    assert cli.main(["runs", "--root", str(tmp_path), "--status", "running,pending"]) == 0
    assert capsys.readouterr().out == f"No runs in the states --status asks for; in {tmp_path}: 3 COMPLETED.\n"


def test_stop_and_resume_are_offered_only_where_the_commands_would_act():
    running = {"name": "r", "job_id": "7", "state": "RUNNING", "final_metrics": None}
    assert readers.refusals(running, 100) == {
        "stop": None, "resume": "r is RUNNING (job 7); nothing to resume (stop it first to restart it)",
        "move": "r is RUNNING (job 7); only a waiting (PENDING) run moves: it trains where it is", "delete": None}
    done = {**running, "state": "COMPLETED", "final_metrics": {"step": 100, "final": True, "loss": 2.0}}
    assert readers.refusals(done, 100) == {"stop": "r (job 7) is not active; nothing to stop.",
                                           "resume": "r already trained all 100 steps; nothing to resume",
                                           "move": unmovable("r", "7", "COMPLETED"), "delete": None}
    stopped = {**done, "state": "CANCELLED", "final_metrics": {"step": 40, "final": True, "loss": 2.5}}
    assert readers.refusals(stopped, 100)["resume"] is None


def test_the_clusters_page_names_the_default_the_run_behind_each_job_and_the_watchers(monkeypatch):
    from launcher.service import clusters
    from launcher.slurm.client import Slurm
    from launcher.slurm.output import JobRow
    from launcher.status.pending import Queue

    monkeypatch.setattr(clusters, "default_cluster", lambda: ("site", "config.yaml"))
    entry = clusters.ClusterUsage("local", ["site"], "/etc/slurm.conf", reachable=True)
    assert clusters.to_json(entry)["default_name"] == "site"
    assert clusters.to_json(clusters.ClusterUsage("ghost", [], None))["default_name"] is None
    monkeypatch.setattr(Slurm, "run", lambda self, args, timeout=None: "12|r1|\n13_[1-2]|sw0|\n14|r1.watch|\n")
    assert Slurm(None).job_names("ana") == {"12": "r1", "13_1": "sw0", "13_2": "sw0", "14": "r1.watch"}

    def row(job_id, state, reason, gpus=2):
        return JobRow(job_id, state, reason, "", "N/A", source="squeue", user="ana", partition="gpu", gpus=gpus)
    queue = Queue([row("12", "RUNNING", "None"), row("14", "PENDING", "Dependency", 0)])
    running = clusters.your_job(row("12", "RUNNING", "None"), "r1", queue)
    assert (running.name, running.watches, running.reason) == ("r1", None, "")  # not Slurm's "None"
    watcher = clusters.your_job(row("14", "PENDING", "Dependency", 0), "r1.watch", queue)
    assert watcher.watches == "r1"
    assert watcher.reason.startswith("the launcher's watcher of r1: it starts only if r1's job fails")
    waiting = clusters.your_job(row("15", "PENDING", ""), "r2", queue)
    assert waiting.reason == "waiting: Slurm gives no reason yet"


def test_a_rank_log_marks_where_each_attempt_begins(tmp_path):
    from launcher.core.events import Attempt
    from launcher.core.rundir import append_event
    from launcher.status.tails import with_attempts

    def at(stamp):
        return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))
    append_event(tmp_path, Attempt(attempt=1, job_id="7", time=at("2026-12-06 04:01:18")))
    append_event(tmp_path, Attempt(attempt=2, job_id="7", restart=1, time=at("2026-12-06 04:02:17")))
    start = "{} rank0 INFO launcher.train.dist: rank 0/2 local 0 node n1 device cpu threads 1 allreduce 3 ok\n"
    text = (start.format("2026-12-06 04:01:19,233") + "step 10\n" + start.format("2026-12-06 04:02:18,405")
            + "step 20\n")
    assert with_attempts(text, tmp_path).splitlines() == [
        "==== attempt 1 (job 7) ====", start.format("2026-12-06 04:01:19,233").strip(), "step 10",
        "==== attempt 2 (job 7, Slurm's restart 1) ====", start.format("2026-12-06 04:02:18,405").strip(), "step 20"]
    assert with_attempts("step 30\n", tmp_path / "absent") == "step 30\n"  # no start in it: no events read


def test_a_sweeps_page_sends_each_runs_loss_and_whether_it_has_anything_to_stop(tmp_path):
    names = planted(tmp_path, 3)
    page = readers.sweep_page([tmp_path], "sweep000", readers.Tails())
    assert sorted(page["losses"]) == sorted(names) and page["active"] == 0
    assert page["losses"][names[0]]["step"] == list(range(10, 101, 10))
