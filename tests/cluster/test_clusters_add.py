"""``launcher clusters add NAME`` asks the cluster's Slurm and writes a cluster file into the user's config
directory; against the local cluster the file it writes trains gpt_tiny unchanged."""
from __future__ import annotations

import re

import pytest
import yaml

pytestmark = pytest.mark.slurm


@pytest.fixture
def xdg(tmp_path):
    return {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "XDG_CACHE_HOME": str(tmp_path / "cache")}


def test_the_file_it_writes_trains_gpt_tiny_unchanged(slurm, tmp_path, xdg):
    added = slurm.launcher("clusters", "add", "mylocal", root=tmp_path / "runs", env=xdg)
    assert added.returncode == 0, added.stderr
    path = tmp_path / "xdg" / "launcher" / "cluster" / "mylocal.yaml"
    assert added.stdout.splitlines()[0] == f"Wrote {path}"
    written = yaml.safe_load(path.read_text())
    assert written["name"] == "mylocal" and written["slurm_conf"] == slurm.env["SLURM_CONF"]
    assert (written["gpus_per_node"], written["virtual_gpus"], written["cpus_per_gpu"]) == \
        (slurm.gpus_per_node, True, 1)  # the local nodes carry the virtual_gpus feature (slurm/up.sh)
    assert path.read_text().startswith("# Written by `launcher clusters add mylocal` on ")
    res = slurm.launcher("cluster=mylocal", "model=gpt_tiny", "gpus=2", "train.steps=20", "train.log_every=10",
                         "name=added", root=tmp_path / "runs", env=xdg)
    assert res.returncode == 0, res.stderr
    job = re.search(r"as Slurm job (\d+)", res.stdout).group(1)
    assert slurm.wait(job, timeout=300).startswith("COMPLETED")
    listed = slurm.launcher("clusters", "--json", root=tmp_path / "runs", env=xdg)
    assert f"user: {path}" in listed.stdout


def test_print_writes_nothing_and_an_existing_file_needs_force(slurm, tmp_path, xdg):
    printed = slurm.launcher("clusters", "add", "other", "--print", root=tmp_path, env=xdg)
    assert printed.returncode == 0 and "gpus_per_node: " in printed.stdout
    assert not (tmp_path / "xdg" / "launcher").exists()
    assert slurm.launcher("clusters", "add", "other", root=tmp_path, env=xdg).returncode == 0
    again = slurm.launcher("clusters", "add", "other", root=tmp_path, env=xdg)
    assert again.returncode == 2 and again.stderr.count("\n") == 1
    assert again.stderr.startswith(f"error: {tmp_path}/xdg/launcher/cluster/other.yaml exists; --force replaces it")
    assert slurm.launcher("clusters", "add", "other", "--force", root=tmp_path, env=xdg).returncode == 0


@pytest.mark.parametrize("args, message", [
    (["clusters", "add"], "error: clusters add needs a NAME of 1-64 letters, digits, '.', '_' or '-' (got None)"),
    (["clusters", "add", "a/b"], "error: clusters add needs a NAME of 1-64 letters"),
    (["clusters", "add", "x", "--partition", "nope"], "error: the cluster has no partition 'nope' (partitions: gpu)"),
    (["clusters", "add", "x", "--cluster-conf", "/nonexistent/slurm.conf"], "error: Slurm is not reachable"),
    (["clusters", "remove", "x"], "error: launcher clusters: argument action: invalid choice: 'remove'"),
    (["clusters", "--print"], "error: NAME, --partition, --print, --force, --ssh and --python go with "
                              "'launcher clusters add NAME'"),
])  # fmt: skip
def test_mistakes_are_one_line_and_write_nothing(slurm, tmp_path, xdg, args, message):
    res = slurm.launcher(*args, root=tmp_path, env=xdg)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and res.stderr.startswith(message), res.stderr
    assert not (tmp_path / "xdg").exists()
