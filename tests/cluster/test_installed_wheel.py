"""The launcher as a site user gets it: the wheel built from this checkout, installed (not editable) into a
fresh virtual environment, run from an unrelated directory.

Two installs. The cluster's, with torch: the test environment's packages reused (no download of torch); it
lists its choices, plans, and trains gpt_tiny to COMPLETED on the local cluster with the code it froze from its
own installed copy. A laptop's, without extras: a real ``pip install`` of the wheel and its dependencies
(30 to 60 s here, mostly fetching them from the package index); it pulls no torch, yet plans, prints a dry run
and prepares data, and tasks that run its Python fail at once, naming it and the extra it lacks."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from support.helpers import REPO, events, job_id_of, record, runs_json

# In the cluster tier, though the laptop's install needs no cluster: a real ``pip install`` from the package index
# takes tens of seconds. One worker makes the installs (module-scoped fixtures) for all the tests here.
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("installed_wheel")]

# What a task whose Python has no torch records, in the user's words (launcher/job/entry.py).
NO_TORCH = ("the tasks' Python {python} has no torch: install 'slurm-gpt-launcher[train]' there (cluster.python, "
            "or cluster.container.python in a container)")


def without_pythonpath() -> dict:
    """This environment, less PYTHONPATH: an installed launcher must not find the checkout."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """The cluster's install: the new environment's launcher command, with torch."""
    venv = tmp_path_factory.mktemp("installed") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; "
                                "print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    # The test environment's packages (torch, hydra, submitit, ...), after the new environment's own: its
    # editable install of this checkout is a .pth file there, which a path listed in a .pth never runs.
    (site / "reuse.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True, text=True, timeout=300)
    return venv / "bin" / "launcher"


@pytest.fixture(scope="module")
def bare(wheel, tmp_path_factory):
    """A laptop's install: ``pip install WHEEL``, no extras, into a fresh virtual environment, its dependencies
    resolved and fetched as a user's would be. Returns its Python and the names of all pip installed (--report)."""
    tmp = tmp_path_factory.mktemp("bare")
    venv, report = tmp / "venv", tmp / "report.json"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # --no-compile: each command compiles only what it imports (saves about 8 s of byte-compiling numpy and pyarrow).
    res = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile",
                          "--report", str(report), str(wheel)], capture_output=True, text=True, timeout=600,
                         env=without_pythonpath())
    assert res.returncode == 0, f"pip could not install the wheel without extras: {res.stderr[-3000:]}"
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    return python, names


def run(command, *args, cwd, env=None, timeout=120):
    return subprocess.run([str(command), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_without_extras_pip_installs_no_torch_and_the_launcher_plans_dry_runs_and_prepares_data(bare, tmp_path):
    python, names = bare
    assert "slurm-gpt-launcher" in names and not {n for n in names if n == "torch" or n.startswith("nvidia-")}, names
    env = without_pythonpath()
    found = run(python, "-c", "import importlib.util; print(importlib.util.find_spec('torch'))", cwd=tmp_path, env=env)
    assert found.stdout.strip() == "None", found.stderr
    plan = run(python, "-m", "launcher", "plan", "model=gpt_tiny", "gpus=2", cwd=tmp_path, env=env)
    assert plan.returncode == 0 and "gpt_tiny" in plan.stdout, plan.stderr
    dry = run(python, "-m", "launcher", "model=gpt_tiny", "gpus=2", "dry_run=true", cwd=tmp_path, env=env)
    assert dry.returncode == 2 and "#SBATCH" in dry.stdout and "srun" in dry.stdout, dry.stderr
    # the local cluster's tasks would run this very Python: the launch's refusal, said by the dry run
    assert f"a launch would be refused: {NO_TORCH.format(python=python)}" in dry.stderr.splitlines(), dry.stderr
    (tmp_path / "in.txt").write_text("the launcher prepares data without torch\n" * 200)
    prepared = run(python, "-m", "launcher", "data", "prepare", "out", "in.txt", "--tokenizer", "bpe:300", cwd=tmp_path,
                   env=env)
    assert prepared.returncode == 0 and (tmp_path / "out" / "tokenizer.json").is_file(), prepared.stderr
    sample = run(python, "-m", "launcher", "sample", "any", cwd=tmp_path, env=env)
    assert sample.returncode == 2 and sample.stderr.strip().endswith(
        f"launcher sample needs torch, missing from {python}: pip install 'slurm-gpt-launcher[train]'"), sample.stderr


def test_installed_it_lists_choices_and_plans_from_any_directory(installed, tmp_path, slurm):
    launcher = installed
    where = run(launcher.parent / "python", "-c", "import launcher; print(launcher.__file__)", cwd=tmp_path,
                env=without_pythonpath())
    assert "site-packages" in where.stdout and str(REPO) not in where.stdout  # not the checkout
    plan = run(launcher, "plan", "gpus=8", "model=gpt_1b", "--json", cwd=tmp_path, env=slurm.env)
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout.splitlines()[0])["params"] == 1_315_276_800
    wrong = run(launcher, "plan", "model=nope", cwd=tmp_path, env=slurm.env)
    assert wrong.returncode == 2 and "valid: gpt_1b, gpt_3b, gpt_7b, gpt_13b" in wrong.stderr  # not an empty list


@pytest.mark.slurm
def test_installed_it_trains_gpt_tiny_to_completed(installed, tmp_path, slurm):
    launcher = installed
    env = {**slurm.env, "LAUNCHER_RUN_ROOT": str(tmp_path / "runs")}
    env.pop("PYTHONPATH", None)
    res = run(launcher, "model=gpt_tiny", "gpus=2", "train.steps=20", "train.log_every=10", "name=wheel",
              cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    job = re.search(r"as Slurm job (\d+)", res.stdout).group(1)
    assert slurm.wait(job, timeout=300).startswith("COMPLETED")
    code = tmp_path / "runs" / "wheel" / "code"
    source = json.loads((code / "source.json").read_text())
    assert "site-packages" in source["source"] and source["commit"] is None  # no checkout behind it
    assert (code / "launcher" / "conf" / "config.yaml").is_file()
    final = json.loads((tmp_path / "runs" / "wheel" / "metrics.jsonl").read_text().splitlines()[-1])
    assert final["final"] and final["step"] == 20


def test_tasks_whose_python_has_no_torch_are_refused_or_fail_at_once_naming_it(bare, tmp_path, slurm):
    """``cluster.python`` names an interpreter with the launcher's dependencies but not the ``[train]`` extra: the
    launch refuses it in one line. Where the nodes' interpreter is not what the login node saw (here: a link
    pointed elsewhere once the job is queued), the run ends FAILED within a minute, after one attempt, and `runs`,
    `describe` and its events say why and what to do."""
    python, _ = bare
    refused = slurm.launcher("model=gpt_tiny", "gpus=2", f"cluster.python={python}", "name=notorch", root=tmp_path)
    assert (refused.returncode, refused.stderr) == (2, f"error: {NO_TORCH.format(python=python)}\n")
    assert not (tmp_path / "notorch").exists()
    wrapper = tmp_path / "bin" / "python"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # what the launch checks: a Python with torch
    wrapper.chmod(0o755)
    res = slurm.launcher("model=gpt_tiny", "gpus=2", "train.steps=20", f"cluster.python={wrapper}", "name=notorch",
                         "+cluster.sbatch_flags.hold=true", root=tmp_path)
    assert res.returncode == 0, res.stderr
    wrapper.write_text(f'#!/bin/sh\nexec {python} "$@"\n')  # what the nodes run
    slurm.run("scontrol", "release", job_id_of(res.stdout))
    run_dir = tmp_path / "notorch"
    assert slurm.wait(job_id_of(res.stdout), timeout=120) == "FAILED", record(run_dir)
    cause = NO_TORCH.format(python=python)
    kinds = [e["event"] for e in events(run_dir)]
    assert kinds.count("attempt") == 1 and "retrying" not in kinds, record(run_dir)
    (verdict,) = [e for e in events(run_dir) if e["event"] == "failed" and e.get("final")]
    assert verdict["error"].endswith(f": {cause}") and verdict["short"] == "no torch", verdict
    assert verdict["reason"] == "the tasks' Python has no torch: the same on every node and every try, not retried"
    row = runs_json(slurm, tmp_path)["notorch"]
    assert (row["status"], row["reason"], row["attempts"]) == ("FAILED", "no torch", 1)
    described = slurm.launcher("describe", "notorch", root=tmp_path).stdout
    assert cause in described and "gave up: the tasks' Python has no torch" in described, described
