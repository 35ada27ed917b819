"""What ``clusters add`` writes for the tasks' Python (launcher/commands/clusters.py tasks_python): a file the first
launch trains on; and for the GPUs, from sinfo's gres lines (typed or not) answered here. Asking a real Slurm for
the rest: tests/cluster/test_clusters_add.py."""
from __future__ import annotations

import sys

import pytest
import yaml

from launcher.commands.clusters import proposal, tasks_python
from launcher.compose.composer import compose_runs
from launcher.errors import LaunchError
from launcher.slurm.batch import gpu_request
from launcher.slurm.client import SlurmError
from launcher.slurm.fit import problems
from launcher.slurm.output import parse_nodes, partitions_of


def test_the_tasks_python_is_the_one_given_or_this_one_with_torch():
    notes = []
    assert tasks_python(None, notes) == sys.executable  # the suite's Python has torch
    assert notes == [f"the tasks run this Python, {sys.executable} (it has torch); --python names another"]
    notes.clear()
    assert tasks_python(sys.executable, notes) == sys.executable and notes == []
    assert tasks_python("/nodes/only/bin/python", notes) == "/nodes/only/bin/python"
    assert notes == ["--python /nodes/only/bin/python does not exist on this host: it must on the cluster's nodes"]


def test_a_python_without_torch_is_refused_in_one_line(tmp_path):
    bare = tmp_path / "python"
    bare.write_text("#!/bin/sh\nexec /usr/bin/python3 -S \"$@\"\n")  # no site-packages: none of the tasks' modules
    bare.chmod(0o755)
    with pytest.raises(LaunchError, match=rf"^--python {bare} lacks torch, submitit, omegaconf, yaml, numpy: name an "
                                          r"interpreter with 'slurm-gpt-launcher\[train\]'$"):
        tasks_python(str(bare), [])


def test_without_torch_here_a_note_says_the_tasks_need_one(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    notes = []
    assert tasks_python(None, notes) is None
    assert notes[0].startswith(f"the tasks need a Python with torch, which {sys.executable} lacks: add python: PATH")


class AnsweringSlurm:
    """What ``clusters add`` asks of a Slurm whose one node's gres is ``gres`` (sinfo's line, parsed as the
    adapter parses it), with no accounting."""

    conf = "/etc/slurm/slurm.conf"

    def __init__(self, gres: str, features=()):
        self.nodes = parse_nodes(f"n1|gpu*|{gres}|gpu:0|idle|32|256000|1-00:00:00|1-infinite|\n")
        self.node_features = list(features)

    def ping(self):
        return None

    def partition(self, name):
        return partitions_of(self.nodes)[0]

    def default_account(self):
        return None

    def site_rules(self):
        raise SlurmError("no accounting")

    def features(self, partition):
        return self.node_features


NO_TYPE = ("Slurm names no GPU type on partition gpu (gres gpu:4): plans show no step time, tokens/s or MFU; name it "
           "with --gpu-type TYPE (e.g. h100)")


@pytest.mark.parametrize("gres, given, features, written, notes", [
    ("gpu:4", None, (), {"gpu_type": None}, [NO_TYPE]),
    ("gpu:a100:4", None, (), {"gpu_type": "a100", "gpu_memory_gb": 40}, []),
    ("gpu:a100_80gb:4(S:0-1)", None, (), {"gpu_type": "a100_80gb", "gpu_memory_gb": 80}, []),
    ("gpu:4", "h100", (), {"gpu_type": "h100", "gres": "gpu", "gpu_memory_gb": 80}, []),
    ("gpu:a100:4", "a100-80gb", (), {"gpu_type": "a100-80gb", "gres": "gpu:a100", "gpu_memory_gb": 80}, []),
    ("gpu:4", None, ("virtual_gpus",), {"gpu_type": None}, []),  # the local cluster's: planned as a stand-in
    ("gpu:mi300x:4", None, (), {"gpu_type": "mi300x"},
     ["GPU type mi300x is not in the launcher's GPU table: plans assume its memory and show no step time, "
      "tokens/s or MFU; set gpu_memory_gb in the file"]),
])  # fmt: skip
def test_the_gpu_type_and_memory_are_written_where_slurm_names_them(gres, given, features, written, notes):
    said = []
    text = proposal("mysite", AnsweringSlurm(gres, features), None, "/opt/py", given, said)
    data = yaml.safe_load(text)
    gpu_keys = {key: data[key] for key in ("gpu_type", "gres", "gpu_memory_gb") if key in data}
    assert gpu_keys == written and said == notes and data["gpus_per_node"] == 4
    assert "docs/" not in text  # a wheel install has no docs


def test_a_type_named_for_an_untyped_gres_is_asked_of_slurm_untyped():
    """``--gpu-type h100`` on a gres ``gpu:4`` writes ``gres: gpu``: the request stays untyped (``--gres=gpu:N``), so
    the partition's check does not refuse the type it names for the plan."""
    (run,) = compose_runs(["model=gpt_tiny", "cluster=slurm", "gpus=4", "cluster.gpus_per_node=4",
                           "cluster.gpu_type=h100", "cluster.gres=gpu", "cluster.cpus_per_gpu=1"])
    part = AnsweringSlurm("gpu:4").partition(None)
    assert gpu_request(run.config.cluster, run.plan) == {"gres": f"gpu:{run.plan.gpus_per_node}"}
    assert not [line for line in problems(run.plan, run.config.cluster, part) if "gpu_type" in line]
