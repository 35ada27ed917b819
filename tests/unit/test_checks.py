"""The checks a launch, a dry run and a plan share (launcher/submit/checks.py): the same refusal in the same words,
exit 2 for a dry run that a launch would refuse, and nothing created."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launcher import cli
from launcher.core.run_index import root_problem
from launcher.submit.checks import NoTorch, python_findings
from launcher.compose.composer import compose_runs

from support.helpers import said


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A Python of its own without torch (a venv without packages)."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    return venv / "bin" / "python"


def cluster_of(*overrides):
    (run,) = compose_runs(["model=gpt_tiny", "gpus=1", *overrides])
    return run.config.cluster


def test_a_tasks_python_without_torch_is_refused_in_the_words_of_the_task_that_would_fail(bare_python):
    notes = []
    (found,) = python_findings(0, cluster_of(f"cluster.python={bare_python}"), notes)
    assert found.refuses and found.text == str(NoTorch(str(bare_python)))
    assert python_findings(0, cluster_of(f"cluster.python={sys.executable}"), notes) == [] and notes == []


def test_a_tasks_python_you_cannot_run_is_refused_one_not_on_this_host_warned(tmp_path):
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    (found,) = python_findings(0, cluster_of(f"cluster.python={script}"), [])
    assert found.refuses and found.text == (f"cluster.python={script} cannot be executed by you (mode 644); name "
                                            "an interpreter you may run")
    script.chmod(0o755)  # runs, but is no Python
    (found,) = python_findings(0, cluster_of(f"cluster.python={script}"), [])
    assert found.refuses and found.text == (f"cluster.python={script} is not a Python that runs here (exit code 0, "
                                            "no answer); name an interpreter with the [train] extra")
    (found,) = python_findings(0, cluster_of("cluster.python=/nodes/only/bin/python"), [])
    assert not found.refuses and found.text.startswith("cluster.python=/nodes/only/bin/python does not exist on "
                                                       "this host, so it was not checked")


def test_a_containers_python_is_not_checked_and_the_dry_run_says_so():
    notes = []
    assert python_findings(0, cluster_of("cluster.container.image=/images/train.sqsh",
                                         "cluster.python=/missing"), notes) == []
    assert notes == ["the container's Python (cluster.container.python): it is inside the image"]


def test_a_run_root_problem_is_found_without_creating_anything(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert root_problem(str(tmp_path / "new" / "runs")) is None and not (tmp_path / "new").exists()
    if subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip() != "0":  # root may write anyway
        assert root_problem(str(locked / "runs")) == (f"run root {locked}/runs cannot be created ({locked} cannot be "
                                                      "written: Permission denied)")
    (tmp_path / "file").write_text("")
    assert root_problem(str(tmp_path / "file" / "runs")) == (f"run root {tmp_path}/file/runs cannot be created "
                                                             f"({tmp_path}/file cannot be written: Not a directory)")
    assert root_problem("/proc/launcher-runs") == ("run root /proc/launcher-runs cannot be created (/proc cannot be "
                                                   "written: No such file or directory)")  # even for root
    assert sorted(tmp_path.iterdir()) == [tmp_path / "file", locked]  # the probes left nothing


def test_a_dry_run_prints_everything_then_each_refusal_and_exits_2(tmp_path, capsys, bare_python):
    root = tmp_path / "file"
    root.write_text("")
    args = ["model=gpt_tiny", "gpus=2", f"run_root={root}/runs", f"cluster.python={bare_python}"]
    assert cli.main([*args, "dry_run=true"]) == 2
    out, err = capsys.readouterr()
    assert "# sbatch script" in out and not (tmp_path / "file" / "runs").exists()
    assert said(err) == [f"a launch would be refused: run root {root}/runs cannot be created ({root} cannot be "
                         "written: Not a directory)",
                         f"a launch would be refused: {NoTorch(str(bare_python))}"]
    assert any(line.startswith("not checked: the partition's limits on cluster local") for line in err.splitlines())
    assert cli.main(args) == 2  # the launch: the first reason, in the same words, alone
    assert capsys.readouterr().err == (f"error: run root {root}/runs cannot be created ({root} cannot be written: "
                                       "Not a directory)\n")


def test_plan_marks_what_a_launch_would_refuse_and_check_makes_it_exit_2(tmp_path, capsys, bare_python):
    args = ["plan", "model=gpt_tiny", "gpus=2", f"cluster.python={bare_python}"]
    assert cli.main(args) == 0
    assert f"a launch would be refused: {NoTorch(str(bare_python))}" in capsys.readouterr().out
    assert cli.main([*args[:1], "--check", *args[1:]]) == 2
    assert cli.main([*args[:1], "--json", *args[1:]]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["refused"] == [str(NoTorch(str(bare_python)))]
    assert cli.main(["plan", "--check", "model=gpt_tiny", "gpus=2"]) == 0
    assert "a launch would be refused" not in capsys.readouterr().out


def test_staging_the_environment_of_a_system_python_is_refused_in_plan_and_a_dry_run(tmp_path, capsys):
    system = tmp_path / "usr" / "bin" / "python"  # a Python with every package, in no environment of its own
    system.parent.mkdir(parents=True)
    system.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    system.chmod(0o755)
    (found,) = python_findings(0, cluster_of(f"cluster.python={system}", "cluster.stage_env=true"), [])
    assert found.refuses and found.text == (f"cluster.stage_env=true: the tasks' Python {system} is not in an "
                                            f"environment of its own (its prefix {tmp_path / 'usr'} has no pyvenv.cfg "
                                            "or conda-meta); make one (python -m venv) or set cluster.stage_env=false")
    assert python_findings(0, cluster_of(f"cluster.python={sys.executable}", "cluster.stage_env=true"), []) == []
    args = ["model=gpt_tiny", "gpus=2", f"cluster.python={system}", "cluster.stage_env=true"]
    assert cli.main(["plan", "--check", *args]) == 2
    assert f"a launch would be refused: {found.text}" in capsys.readouterr().out
    assert cli.main([*args, "dry_run=true"]) == 2
    assert f"a launch would be refused: {found.text}" in said(capsys.readouterr().err)
