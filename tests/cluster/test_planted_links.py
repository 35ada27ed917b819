"""On the local cluster, a launch into a sticky run root where another user (``lplanter``, support/planter.py)
planted an ``.index`` symlink trains and follows no link (the refusals before Slurm is asked:
tests/unit/test_planted_links.py)."""
from __future__ import annotations

import json

from support.helpers import launch, run_name
from support.planter import directory, planted, victim_file

TINY = ("gpus=2", "model=gpt_tiny", "train.steps=2", "train.log_every=1", "train.eval_every=2")


def test_a_launch_into_a_sticky_root_with_a_planted_index_trains_and_follows_no_link(slurm, base):
    """On the real cluster: the launcher, submitit, Slurm and the tasks write the run; the planted ``.index``
    is never written through, and the run is listed from its directory."""
    victim = victim_file(base)
    root = directory(base / "scratch", 0o1777)
    planted("ln", "-s", str(victim), str(root / ".index"))
    job = launch(slurm, root, *TINY, env={"LAUNCHER_HOME": str(base / "home")}, timeout=120)
    assert slurm.wait(job, timeout=300) == "COMPLETED"
    name = run_name(root, job)
    res = slurm.launcher("runs", "--json", root=root, env={"LAUNCHER_HOME": str(base / "home")})
    assert res.returncode == 0, res.stderr
    assert [row["name"] for row in json.loads(res.stdout)] == [name]
    assert victim.read_text() == "root's own file\n" and (root / ".index").is_symlink()
