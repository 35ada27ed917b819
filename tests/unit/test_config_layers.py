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


def test_the_default_cluster_comes_from_the_layers_and_cluster_on_the_command_line_wins(layers, capsys):
    from launcher import cli

    write(layers["user"], "cluster", "mysite", "name: mysite\npartition: a100\n")
    write(layers["site"], "cluster", "lab", "name: lab\n")
    assert cluster_of().name == "local"  # the package's default
    assert cli.main(["clusters", "default", "mysite"]) == 0
    assert (layers["user"] / "config.yaml").read_text().endswith("cluster: mysite\n")
    assert capsys.readouterr().out == (f"Wrote {layers['user'] / 'config.yaml'}: launches without cluster= go to "
                                       "mysite\n")
    assert cluster_of().name == "mysite" and cluster_of("cluster=local").name == "local"
    (run,) = compose_runs(["gpus=2"])
    assert run.run_file["cluster"] == "mysite"  # a run file records the cluster it went to
    (layers["site"] / "config.yaml").write_text("cluster: lab\n")  # the user's layer wins over the site's
    assert cluster_of().name == "mysite"
    (layers["project"] / "config.yaml").write_text("cluster: lab\n")  # and a project's over the user's
    assert cluster_of().name == "lab"
    assert cli.main(["clusters", "default"]) == 0
    assert capsys.readouterr().out == f"lab (from {layers['project'] / 'config.yaml'})\n"
    assert cli.main(["clusters", "default", "mysite"]) == 0
    assert capsys.readouterr().out.endswith(f"  but here {layers['project'] / 'config.yaml'} makes lab the default\n")


@pytest.mark.parametrize("text, message", [
    ("cluster: [a, b]\n", "must set only cluster (cluster: NAME), got {'cluster': ['a', 'b']}"),
    ("clusters: mysite\n", "must set only cluster (cluster: NAME), got {'clusters': 'mysite'}"),
    ("cluster: : x\n", "cannot be read: "),
])  # fmt: skip
def test_a_wrong_settings_file_is_one_line_naming_it(layers, capsys, text, message):
    from launcher import cli

    (layers["user"] / "config.yaml").write_text(text)
    assert cli.main(["model=gpt_tiny", "dry_run=true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {layers['user'] / 'config.yaml'} {message}") and err.count("\n") == 1, err


def test_clusters_default_refuses_a_cluster_no_layer_defines(layers, capsys):
    from launcher import cli

    assert cli.main(["clusters", "default", "nope"]) == 2
    assert capsys.readouterr().err == ("error: clusters default nope: no such cluster (clusters: local, slurm); add it "
                                       "first with 'launcher clusters add nope'\n")
    assert not (layers["user"] / "config.yaml").exists()


def test_local_with_a_sites_slurm_conf_is_refused_naming_the_clusters_configured(layers, tmp_path, monkeypatch, capsys):
    """$SLURM_CONF exported for a site's own tools: cluster local would submit there with virtual GPUs."""
    from launcher import cli

    site_conf = tmp_path / "site.conf"
    site_conf.write_text("ClusterName=big\nSlurmctldHost=ctl\n")
    monkeypatch.setenv("SLURM_CONF", str(site_conf))
    write(layers["user"], "cluster", "mysite", f"name: mysite\nslurm_conf: {site_conf}\n")
    assert cli.main(["model=gpt_tiny", "gpus=2", "dry_run=true"]) == 2
    refused = [line for line in capsys.readouterr().err.splitlines() if line.startswith("a launch would be refused")]
    assert refused == [f"a launch would be refused: cluster local is the local test cluster of slurm/up.sh, but "
                       f"$SLURM_CONF names another cluster's slurm.conf ({site_conf}): add that cluster with "
                       "'launcher clusters add NAME' and launch with cluster=NAME (configured: mysite; "
                       "cluster=mysite?)"]
    site_conf.write_text("# Written by slurm/up.sh (name=x). Edit up.sh, not this file.\nClusterName=x\n")
    assert cli.main(["model=gpt_tiny", "gpus=2", "dry_run=true"]) == 0  # one that up.sh wrote is the local one
