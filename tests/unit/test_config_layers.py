"""Config layers: a site's, a user's and a project's cluster, model, gpus and tracking files beside the
package's, later layers adding options and overriding earlier files of the same name, each file checked and
named when it is wrong (launcher/compose/catalog.py, launcher/compose/layers.py). No cluster needed: runs are
composed, and `clusters` lists where each cluster file comes from."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from launcher.compose.catalog import model_micro_batch, options
from launcher.compose.composer import compose_runs
from launcher.errors import LaunchError
from support.helpers import REPO, run_launcher



@pytest.fixture
def layers(tmp_path, monkeypatch):
    """Empty site, user and project layers (and a cache for composition's view), with the current directory
    in the project."""
    site, user, project = tmp_path / "site", tmp_path / "xdg" / "launcher", tmp_path / "project"
    for path in (site, user, project / ".launcher" / "conf"):
        path.mkdir(parents=True)
    monkeypatch.setenv("LAUNCHER_SITE_CONFIG", str(site))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(project)
    return {"site": site, "user": user, "project": project / ".launcher" / "conf"}


def write(layer: Path, group: str, name: str, text: str) -> Path:
    path = layer / group / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def cluster_of(*overrides):
    (run,) = compose_runs(["gpus=2", *overrides])
    return run.config.cluster


def test_a_users_cluster_file_is_a_choice_with_its_values(layers):
    write(layers["user"], "cluster", "mysite", "name: mysite\npartition: a100\ngpus_per_node: 4\naccount: proj\n")
    assert "mysite" in options("cluster")
    cluster = cluster_of("cluster=mysite")
    assert (cluster.name, cluster.partition, cluster.gpus_per_node, cluster.account) == ("mysite", "a100", 4, "proj")
    with pytest.raises(LaunchError, match=r"unknown cluster 'nope'; valid: local, mysite, slurm"):
        cluster_of("cluster=nope")


def test_later_layers_override_earlier_files_of_the_same_name(layers):
    assert cluster_of().gpus_per_node == 8  # the package's local.yaml
    for gpus, layer in ((6, "site"), (4, "user"), (2, "project")):
        write(layers[layer], "cluster", "local", f"name: local\ngpus_per_node: {gpus}\nvirtual_gpus: true\n")
        assert cluster_of().gpus_per_node == gpus, layer
    (layers["project"] / "cluster" / "local.yaml").unlink()
    assert cluster_of().gpus_per_node == 4  # the user's again


def test_a_model_size_from_a_layer_composes_and_starts_auto_from_its_micro_batch(layers):
    write(layers["site"], "model", "gpt_mini", "# @package _global_\nmodel:\n  name: gpt_mini\n  d_model: 96\n"
                                               "  n_heads: 2\n  n_layers: 3\n  seq_len: 64\ntrain:\n  micro_batch: 3\n")
    (run,) = compose_runs(["model=gpt_mini", "gpus=1", "train.micro_batch=auto", "train.global_batch=6"])
    assert (run.config.model.d_model, run.config.model.n_layers, run.plan.micro_batch) == (96, 3, 3)
    assert model_micro_batch("gpt_mini") == 3


@pytest.mark.parametrize("text, message", [
    ("name: bad\npartition: [a\n", "does not parse as YAML (line 3): expected ',' or ']', but got '<stream end>'"),
    ("name: bad\npartitoin: gpu\n", "unknown key 'cluster.partitoin' (did you mean 'cluster.partition'?)"),
    ("- a\n- b\n", "must be a mapping of keys to values, not a list"),
    ("name: bad\ncontainer:\n  imag: x\n",
     "unknown key 'cluster.container.imag' (did you mean 'cluster.container.image'?)"),
])  # fmt: skip
def test_a_wrong_file_is_one_line_naming_it(layers, text, message):
    path = write(layers["user"], "cluster", "bad", text)
    with pytest.raises(LaunchError) as err:
        cluster_of()  # any composition checks every file the layers add, not only the chosen one
    assert err.value.message == f"{path}: {message}"


def test_a_relative_slurm_conf_is_relative_to_its_file_or_to_where_it_was_typed(layers):
    path = write(layers["user"], "cluster", "mysite", "name: mysite\nslurm_conf: etc/slurm.conf\n")
    assert cluster_of("cluster=mysite").slurm_conf == str(path.parent / "etc" / "slurm.conf")
    assert cluster_of("cluster=mysite", "cluster.slurm_conf=here/slurm.conf").slurm_conf == \
        str(Path.cwd() / "here" / "slurm.conf")
    assert cluster_of("cluster=mysite", "cluster.slurm_conf=/abs/slurm.conf").slurm_conf == "/abs/slurm.conf"


def test_clusters_says_which_layer_each_cluster_comes_from(layers, tmp_path):
    site = write(layers["site"], "cluster", "lab", f"name: lab\nslurm_conf: {tmp_path}/none/slurm.conf\n")
    mine = write(layers["project"], "cluster", "mine", f"name: mine\nslurm_conf: {tmp_path}/none2/slurm.conf\n")
    result = run_launcher("clusters", "--json", timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    origins = {entry["cluster"]: entry["origins"] for entry in json.loads(result.stdout)}
    assert origins["lab"] == [f"site: {site}"] and origins["mine"] == [f"project: {mine}"]
    assert origins["local"][0] == f"package: {REPO / 'conf' / 'cluster' / 'local.yaml'}"
    assert "local2" not in origins  # the developers' second test cluster is not in the package


def test_without_added_files_composition_reads_the_package_directly(layers, tmp_path):
    from launcher.compose.catalog import CONF_DIR
    from launcher.compose.layers import conf_dir

    assert conf_dir() == CONF_DIR
    write(layers["user"], "cluster", "mysite", "name: mysite\n")
    view = conf_dir()
    assert view.parent == tmp_path / "cache" / "launcher" and (view / "cluster" / "mysite.yaml").is_file()
    assert conf_dir() == view  # made once per set of files


def test_a_relative_data_path_is_where_the_command_runs_and_recorded_absolute(layers, tmp_path):
    import numpy as np

    (np.arange(20_000) % 256).astype(np.uint16).tofile(Path.cwd() / "tokens.bin")
    (run,) = compose_runs(["gpus=1", "data.path=tokens.bin", "data.dtype=uint16"])
    assert run.config.data.path == str(Path.cwd() / "tokens.bin")
    assert run.resolved.data.path == str(Path.cwd() / "tokens.bin")  # config.yaml
    assert run.run_file["data"]["path"] == str(Path.cwd() / "tokens.bin")  # run.yaml
