"""On the local cluster, a run beside what another user (``lplanter``, support/planter.py) planted: an ``.index``
symlink in its sticky run root, and, in its node-local place (``cluster.env.LAUNCHER_LOCAL_DIR``, a sticky folder
as ``/dev/shm`` is), a folder at the run's name with a symlink in it and symlinks where the sweep of dead jobs'
folders looks, before and during the run; that place is also full. The run trains to the end, follows no link,
says each once in its record, and is never shown stalled (the refusals before Slurm is asked, and the units:
tests/unit/test_planted_links.py, tests/unit/test_node_local.py)."""
from __future__ import annotations

import json
import os
import subprocess
import time

from support.helpers import job_id_of, events, paced, wait_for
from support.planter import directory, planted, victim_file

from launcher.core.heartbeats import pulse_name

STEPS = 60
DEAD = {"rank": 0, "node": "n", "pid": 999999999, "step": 1, "step_since": 1.0, "alive": 1.0}


def test_a_run_beside_what_another_user_planted_trains_follows_no_link_and_says_why(slurm, base, tmpfs):
    victim, owners = victim_file(base), directory(base / "owners", 0o755)
    (owners / pulse_name(0)).write_text(json.dumps(DEAD))  # a dead job's folder, if a link to it were followed
    root = directory(base / "scratch", 0o1777)
    planted("ln", "-s", str(victim), str(root / ".index"))
    place = tmpfs("256k", at=base / "shm")
    place.chmod(0o1777)
    ours = f"{place}/launcher-{os.geteuid()}"
    planted("mkdir", "-m", "0777", ours)  # the run's node-local folder, made by another user first
    planted("ln", "-s", str(victim), f"{ours}/{pulse_name(0)}")
    planted("ln", "-s", str(owners), f"{ours}-before")  # where the sweep of dead jobs' folders looks
    subprocess.run(["dd", "if=/dev/zero", f"of={place}/filler", "bs=4k"], capture_output=True)  # the memory is full
    home = {"LAUNCHER_HOME": str(base / "home")}
    res = slurm.launcher("gpus=2", "model=gpt_tiny", f"train.steps={STEPS}", "train.log_every=1", "train.eval_every=0",
                         "train.stall_timeout_s=5", f"+cluster.env.LAUNCHER_LOCAL_DIR={place}", "name=planted",
                         root=root, env={**home, **paced(0.2)})
    assert res.returncode == 0, res.stderr
    job_id, run_dir = job_id_of(res.stdout), root / "planted"
    first = wait_for(lambda: [e["time"] for e in events(run_dir) if e["event"] == "ready"], 180, "the first step")[0]
    planted("ln", "-s", str(owners), f"{ours}-during")
    # Past the stall limit with no pulse in the node's memory: the node file, written from what is known, says the
    # run trains on. The run is listed from its directory, the planted index neither read nor written through.
    listed = wait_for(lambda: time.time() > first + 8 and runs(slurm, root, home), 120, "runs after the stall limit")
    assert [(row["name"], row["status"], row["reason"]) for row in listed] == [("planted", "RUNNING", "")], listed
    slurm.completes(job_id, run_dir, timeout=300)
    said = {kind: [e for e in events(run_dir) if e["event"] == kind] for kind in ("path_refused", "heartbeat_failed")}
    (refused,), (failed,) = said["path_refused"], said["heartbeat_failed"]
    assert (refused["path"], refused["found"], refused["owner"]) == (ours, "a folder of user lplanter", "lplanter")
    assert refused["used"].startswith(f"{ours}-") and failed["path"].startswith(refused["used"] + "/")
    assert (failed["errno"], failed["error"]) == ("ENOSPC", "[Errno 28] No space left on device")
    assert victim.read_text() == "root's own file\n" and os.listdir(owners) == [pulse_name(0)]
    assert (root / ".index").is_symlink() and {f"{ours}-before", f"{ours}-during"} <= {
        f"{place}/{name}" for name in os.listdir(place)}


def runs(slurm, root, env) -> list[dict]:
    res = slurm.launcher("runs", "--json", root=root, env=env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)
