"""The launcher as a site user gets it: the wheel built from this checkout, installed (not editable) into a
fresh virtual environment that reuses the test environment's packages (no download of torch), run from an
unrelated directory: it lists its choices, plans, and trains gpt_tiny to COMPLETED on the local cluster
with the code it froze from its own installed copy."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOP_LEVEL = {"launcher"}  # nothing with a generic name at the top of site-packages


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the new environment's launcher command, the wheel's top-level names)."""
    tmp = tmp_path_factory.mktemp("wheel")
    # Built from a copy of the checkout's files: setuptools' build/ in the checkout would keep modules since moved.
    source = tmp / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", ".slurm*", "build", "*.egg-info",
                                                                "__pycache__", ".pytest_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp / "dist"), str(source)], check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = (tmp / "dist").glob("*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist() if ".dist-info" not in name}
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; "
                                "print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    # The test environment's packages (torch, hydra, submitit, ...), after the new environment's own: its
    # editable install of this checkout is a .pth file there, which a path listed in a .pth never runs.
    (site / "reuse.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True, text=True, timeout=300)
    return venv / "bin" / "launcher", tops


def run(command, *args, cwd, env=None, timeout=120):
    return subprocess.run([str(command), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_the_wheel_holds_one_top_level_package_and_the_config_groups(installed):
    _, tops = installed
    assert tops == TOP_LEVEL


def test_installed_it_lists_choices_and_plans_from_any_directory(installed, tmp_path, slurm):
    launcher, _ = installed
    where = run(launcher.parent / "python", "-c", "import launcher; print(launcher.__file__)", cwd=tmp_path)
    assert "site-packages" in where.stdout and str(REPO) not in where.stdout  # not the checkout
    plan = run(launcher, "plan", "gpus=8", "model=gpt_1b", "--json", cwd=tmp_path, env=slurm.env)
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout.splitlines()[0])["params"] == 1_315_276_800
    wrong = run(launcher, "plan", "model=nope", cwd=tmp_path, env=slurm.env)
    assert wrong.returncode == 2 and "valid: gpt_1b, gpt_3b, gpt_7b, gpt_13b" in wrong.stderr  # not an empty list


@pytest.mark.slurm
def test_installed_it_trains_gpt_tiny_to_completed(installed, tmp_path, slurm):
    launcher, _ = installed
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
