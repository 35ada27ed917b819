"""``launcher ui`` in a real browser (Debian's Chromium, driven by Playwright, which downloads nothing) against the
local cluster: the token, a second Unix user, a running run's row, curve, log and buttons (each enabled only where it
can act, asking first, saying what happened), a held run's reason, a grid sweep's page and its stop, the clusters
page's jobs, a search's best trial, an unreachable cluster's banner, and the load three tabs put on Slurm."""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.console import CHROMIUM, base_of, chromium, serving
from support.helpers import REPO, UNTIL_STOPPED, job_id_of, run_name, runs_json, wait_for

# One console and one browser for the module's tests, in one worker.
pytestmark = pytest.mark.xdist_group("console")
SECOND = "lconsole"
SLURM_EVERY_S = 5  # the console's --slurm-every here: a state change shows within it, not within the default 30 s


@pytest.fixture(scope="module")
def console(slurm, tmp_path_factory):
    """A console serving a run root of its own, as a user starts it; yields (URL with token, root, env)."""
    if not CHROMIUM.exists():
        pytest.skip("needs Debian's chromium (scripts/setup.sh installs it)")
    tmp = tmp_path_factory.mktemp("console")
    root, home, config = tmp / "runs", tmp / "home", tmp / "config"
    ghost = config / "launcher" / "cluster" / "ghost.yaml"  # a cluster whose controller is gone
    ghost.parent.mkdir(parents=True)
    ghost.write_text(f"name: ghost\nslurm_conf: {tmp / 'gone' / 'slurm.conf'}\ngpus_per_node: 8\n")
    env = {**slurm.env, "LAUNCHER_RUN_ROOT": str(root), "LAUNCHER_HOME": str(home), "XDG_CONFIG_HOME": str(config)}
    with serving(env, "--slurm-every", str(SLURM_EVERY_S)) as url:
        yield url, root, env


@pytest.fixture(scope="module")
def browser(console):
    with chromium() as browser:
        yield browser


@pytest.fixture
def page(browser, console):
    tab = browser.new_page(viewport={"width": 1300, "height": 1000})
    errors, ASKED[tab] = [], []
    tab.on("pageerror", lambda err: errors.append(str(err)))
    tab.on("dialog", lambda dialog: (ASKED[tab].append(dialog.message), dialog.accept()))  # a user who says yes
    tab.goto(console[0])
    yield tab
    del ASKED[tab]
    tab.close()
    assert not errors, errors


ASKED: dict = {}  # each tab's questions before it acted (confirm), in order


def launcher(console, *args, env=None):
    _, root, base = console
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=REPO, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=180)


def submitted(console, *args, env=None) -> tuple[str, str]:
    res = launcher(console, "model=gpt_tiny", *args, env=env)
    assert res.returncode == 0, res.stderr
    job = job_id_of(res.stdout)
    return run_name(console[1], job), job


def test_without_the_token_every_request_is_403_and_a_second_user_cannot_read_it(console, slurm):
    url, _, env = console
    for path in ("/", "/api/runs", "/static/console.js"):
        with pytest.raises(Exception, match="403"):
            import urllib.request

            urllib.request.urlopen(base_of(url) + path, timeout=10)
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root and useradd for the second user")
    made = subprocess.run(["useradd", "--user-group", "--no-create-home", "--shell", "/bin/sh", SECOND],
                          capture_output=True, text=True)
    assert made.returncode in (0, 9), made.stderr
    as_second = ["setpriv", f"--reuid={SECOND}", f"--regid={SECOND}", "--clear-groups"]
    token = Path(env["LAUNCHER_HOME"]) / "console" / "token"
    read = subprocess.run([*as_second, "cat", str(token)], capture_output=True, text=True)
    assert read.returncode != 0 and "Permission denied" in read.stderr, read
    asked = subprocess.run([*as_second, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                            base_of(url) + "/api/runs"], capture_output=True, text=True, timeout=30)
    assert asked.stdout == "403", asked


def test_a_running_run_is_listed_its_curve_grows_its_log_shows_and_stop_cancels_it(console, page, slurm, tmp_path):
    name, job = submitted(console, "gpus=2", "train.steps=100000", "train.log_every=2", env=UNTIL_STOPPED)
    row = page.locator(f'tr[data-run="{name}"]')
    row.wait_for(timeout=60_000)
    wait_for(lambda: "RUNNING" in row.locator(".status").inner_text(), 60, "RUNNING on the runs page")
    assert page.url == base_of(console[0]) + "/"  # the token left the address

    page.locator(f'tr[data-run="{name}"] a').first.click()
    chart = page.locator("#chart-loss")
    chart.wait_for(timeout=60_000)
    first = int(chart.get_attribute("data-points"))
    wait_for(lambda: int(chart.get_attribute("data-points")) > first, 60, "the loss curve gaining points")
    wait_for(lambda: "rank0 INFO" in page.locator("#log").inner_text(), 30, "rank 0's lines in the log tail")
    # Its ranks train on CPUs: the plan's H100 stand-in is labelled, and its speed is not set beside theirs.
    tokens = page.locator("#plan tbody tr", has_text="Tokens/s").locator("td")
    wait_for(lambda: tokens.nth(2).inner_text() not in ("", "-"), 30, "a measured tokens/s beside the plan")
    assert "planned (H100 stand-in)" in page.locator("#plan thead").inner_text() and tokens.nth(1).inner_text() == "-"
    assert "train on CPUs" in page.locator("#plan-note").inner_text()
    page.screenshot(path=str(tmp_path / "run.png"), full_page=True)
    assert f"==== attempt 1 (job {job}) ====" in page.locator("#log").inner_text()  # where its attempt begins
    assert page.locator("#resume").is_disabled() and "is RUNNING" in page.locator("#resume").get_attribute("title")
    for _ in range(4):  # left while its refresh still reads curves and log: nothing is drawn into the page left
        page.evaluate("location.hash = '#/'")
        wait_for(lambda: row.locator(".which").count() and "last" in row.locator(".which").first.inner_text(), 30,
                 "its tokens/s marked as the newest interval's")
        page.evaluate(f"location.hash = '#/run/{name}'")
        page.locator("#run-page").wait_for(timeout=30_000)

    page.locator("#stop").click()
    wait_for(lambda: re.search(rf"Stopped {name} \(job {job}\) at step \d+: every rank saved it",
                               page.locator("#said").inner_text()), 60, "stop's own words, once it saved")
    wait_for(lambda: "CANCELLED" in page.locator("#run-head .status").inner_text(), 60, "CANCELLED on its page")
    assert runs_json(slurm, console[1], env=console[2])[name]["status"] == "CANCELLED"
    assert ASKED[page] == [f"Stop {name}? Its ranks save the step they are at, then its job {job} ends (cancelled if "
                           "they have not saved in time); Resume goes on from there."]
    wait_for(lambda: page.locator("#stop").is_disabled() and page.locator("#resume").is_enabled(), 30,
             "Stop off and Resume on once it ended")
    assert page.locator("#stop").get_attribute("title") == f"{name} (job {job}) is not active; nothing to stop."
    page.locator("#delete").click()
    page.locator("#notice").wait_for(timeout=60_000)  # on the runs page the Delete led to
    assert page.locator("#notice").inner_text() == f"Deleted {name}."
    assert ASKED[page][-1].startswith(f"Delete run {name}? Its job is cancelled if active")


def test_a_waiting_run_shows_its_reason_in_the_words_of_launcher_runs(console, page, own_cluster):
    """A run on a cluster of the test's own whose GPUs a plain sbatch holds: the console asks that cluster (the
    run's record names its slurm.conf) and shows the reason `launcher runs` gives."""
    hog = own_cluster.run("sbatch", "--parsable", "-N2", "--gres=gpu:8", "-t", "30", "-o", "/dev/null",
                          "--wrap", "sleep 600").stdout.strip()
    try:
        wait_for(lambda: own_cluster.run("squeue", "-h", "-j", hog, "-o", "%T").stdout.strip() == "RUNNING", 60,
                 "every GPU held")
        name, _ = submitted(console, "gpus=2", "train.steps=10", env={"SLURM_CONF": own_cluster.env["SLURM_CONF"]})
        waiting = "waiting for 2 GPUs on partition 'gpu': 16 of its 16 are in use"
        row = page.locator(f'tr[data-run="{name}"]')
        wait_for(lambda: row.count() and waiting in row.locator(".reason").inner_text(), 60, "the reason on the page")
        assert row.locator(".status").inner_text() == "PENDING"
    finally:
        own_cluster.run("scancel", hog, check=False)


def test_a_grid_sweeps_page_refreshes_overlays_its_losses_stops_it_and_its_jobs_are_named(console, page, slurm):
    res = launcher(console, "-m", "gpus=1,2", "model=gpt_tiny", "train.steps=100000", "train.log_every=2",
                   env=UNTIL_STOPPED)
    assert res.returncode == 0, res.stderr
    sweep = re.search(r"Submitted sweep (\S+):", res.stdout).group(1)
    page.goto(base_of(console[0]) + f"/#/sweep/{sweep}")
    page.locator("#chart-scaling").wait_for(timeout=120_000)  # both runs measured
    assert page.locator("#chart-scaling").get_attribute("data-ticks") == "1,2"  # a tick at each GPU count only
    assert page.locator("#chart-losses").count() == 1 and "null" not in page.locator("#view").inner_text()
    stamp = page.locator("#updated").inner_text()
    wait_for(lambda: page.locator("#updated").inner_text() != stamp, 30, "the sweep's page refreshed")

    page.goto(base_of(console[0]) + "/#/clusters")
    jobs = page.locator('section[data-cluster="local"] table.queue')
    jobs.wait_for(timeout=30_000)
    named = jobs.locator("td.behind").all_inner_texts()  # the suite's other jobs are the same user's too
    for run in [row["name"] for row in runs_json(slurm, console[1], env=console[2]).values() if row["sweep"] == sweep]:
        job = jobs.locator("tr", has=page.locator("td.behind", has_text=re.compile(f"^{re.escape(run)}$")))
        assert job.locator(".status").inner_text() == "RUNNING" and job.locator("td.why").inner_text() == ""  # not None
        assert f"watcher of {run}" in named, named

    page.goto(base_of(console[0]) + f"/#/sweep/{sweep}")
    page.locator("#stop-sweep:enabled").click()
    wait_for(lambda: page.locator("#said").inner_text().count("Stopped ") == 2, 90, "each run's stop words")
    assert ASKED[page] == [f"Stop sweep {sweep}? Its 2 active runs each save the step they are at and end (one "
                           "still waiting is cancelled at once)."]
    wait_for(lambda: page.locator("#stop-sweep").is_disabled(), 30, "nothing left to stop")


def test_a_searchs_page_marks_the_best_trial_as_describe_does(console, page, slurm):
    res = launcher(console, "-m", "search=optuna", "search.trials=2", "search.parallel=2", "search.metric=loss",
                   "train.lr=tag(log, interval(1e-4, 3e-2))", "model=gpt_tiny", "gpus=1", "train.steps=4",
                   "train.log_every=1")
    assert res.returncode == 0, res.stderr
    search = re.search(r"Submitted search (\S+):", res.stdout).group(1)

    def described():
        info = json.loads(launcher(console, "describe", search, "--json").stdout)
        return info if info["ended"] else None
    info = wait_for(described, 240, "the search's end", interval=2)
    page.goto(base_of(console[0]) + f"/#/sweep/{search}")
    page.locator("#trials").wait_for(timeout=30_000)
    assert page.locator("#trials tr.best").get_attribute("data-trial") == str(info["best"]["number"])
    assert page.locator("#trials tbody tr").count() == 2


def test_an_unreachable_cluster_is_a_banner_and_the_others_still_show(console, page):
    page.goto(base_of(console[0]) + "/#/clusters")
    banner = page.locator(".banner", has_text="cluster ghost is unreachable")
    banner.wait_for(timeout=60_000)
    assert page.locator('section[data-cluster="local"] table').count() >= 1


def test_three_tabs_ask_slurm_no_more_than_one(console, browser):
    """Slurm's answers are shared by every tab (launcher/slurm/client.py SharedAnswers): over the same time, three
    tabs on the runs page cost Slurm about the calls one does, far from the three times that tabs asking each on
    their own would. Not exactly as many: each question is asked again at the first refresh after its answer is
    SLURM_EVERY_S old, and one tab refreshing every 2 s comes later after that than one of three (5-6 s apart
    against 5), besides the rounds a window's edges cut (seen: one tab 8 calls, three tabs 11)."""
    url = console[0]

    def calls_over(tabs: int, seconds: float) -> int:
        pages = [browser.new_page() for _ in range(tabs)]
        for tab in pages:
            tab.goto(url)
        before = json.loads(pages[0].evaluate("fetch('/api/load').then(r => r.text())"))["slurm_calls"]
        time.sleep(seconds)  # the load is what the open tabs ask over this time: nothing to wait for instead
        after = json.loads(pages[0].evaluate("fetch('/api/load').then(r => r.text())"))["slurm_calls"]
        for tab in pages:
            tab.close()
        return after - before

    one, three = calls_over(1, 4 * SLURM_EVERY_S), calls_over(3, 4 * SLURM_EVERY_S)
    print(f"Slurm calls over {4 * SLURM_EVERY_S} s: one tab {one}, three tabs {three}")
    assert one > 0 and three < 2 * one, (one, three)


def test_no_page_scrolls_sideways_in_a_window_800_px_wide(console, page, slurm):
    """At 800 px the runs list (held runs, one of a long name, and the module's other runs), a run's page, a
    sweep's page and the clusters page fit the window: nothing scrolls sideways."""
    name, job = submitted(console, "gpus=2", "train.steps=10", "name=a-run-of-a-long-name-that-the-runs-list-wraps",
                          "+cluster.sbatch_flags.hold=true")
    swept = launcher(console, "-m", "model=gpt_tiny", "gpus=1,2", "train.steps=10", "+cluster.sbatch_flags.hold=true")
    assert swept.returncode == 0, swept.stderr
    sweep = re.search(r"Submitted sweep (\S+):", swept.stdout).group(1)
    jobs = [line.split()[1] for line in swept.stdout.splitlines() if line.startswith("gpt-tiny-")]  # its table
    try:
        page.set_viewport_size({"width": 800, "height": 1000})
        for route, shown in (("/#/", f'tr[data-run="{name}"]'), (f"/#/run/{name}", "#run-head .status"),
                             (f"/#/sweep/{sweep}", "#sweep-runs tbody tr"),
                             ("/#/clusters", 'section[data-cluster="local"] table')):
            page.goto(base_of(console[0]) + route)
            page.locator(shown).first.wait_for(timeout=60_000)
            sizes = page.evaluate("[document.scrollingElement.scrollWidth, document.scrollingElement.clientWidth]")
            assert sizes[0] <= sizes[1], (route, sizes)
    finally:
        slurm.run("scancel", job, *jobs, check=False)
