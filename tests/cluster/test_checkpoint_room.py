"""On the local cluster: a launch into a run root too small for the run's checkpoints warns in one line and
goes on, and the warning comes true: the save that does not fit fails, named, and the earlier checkpoint
stays whole. A checkpoint directory that turns read-only fails its save, named, and is retried once."""
import json
import os
import re
import subprocess

from support.helpers import REPO, events, job_id_of, wait_for
from launcher.core.checkpoints import human, step_dir
from launcher.core.rundir import FROZEN, SUFFIXES
from launcher.forecast.disk import code_bytes
from launcher.train import manifest

PAGE_KB = 4  # a tmpfs holds whole pages: each file of the frozen copy takes at least one
FILLER_KB = 1800  # a file that keeps a second checkpoint out until it is removed


def frozen_code_kb() -> int:
    """What the run's frozen copy of the code takes on a tmpfs (it grows with the code)."""
    pages = 0
    for name in FROZEN:
        for folder, subfolders, files in os.walk(REPO / name):
            subfolders[:] = [sub for sub in subfolders if sub != "__pycache__"]
            pages += 1 + sum(-(-os.path.getsize(os.path.join(folder, f)) // (PAGE_KB * 1024))
                             for f in files if f.endswith(SUFFIXES))
    return pages * PAGE_KB


def test_a_launch_warns_of_a_small_run_root_and_a_full_disk_ends_the_run_until_space_is_freed(slurm, tmpfs):
    """The warning comes true: the second save does not fit. A full disk is the disk's fault, not a node's: the
    attempt's cause names the path, its free space and what a save needs, it is not retried while there is no room
    (no node is left out for it), and once space is freed ``launcher resume`` finishes the run."""
    # The frozen code and one gpt_tiny checkpoint (1.6 MB) fit beside a file of 1,800 KB, with room for logs and
    # metrics; two do not, until that file goes.
    size_kb = frozen_code_kb() + 2000 + FILLER_KB
    root = tmpfs(f"{size_kb}k")
    subprocess.run(["dd", "if=/dev/zero", f"of={root / 'filler'}", "bs=1k", f"count={FILLER_KB}"], check=True,
                   capture_output=True)
    free = (size_kb - FILLER_KB) * 1024
    res = slurm.launcher("gpus=1", "model=gpt_tiny", "train.steps=2", "train.checkpoint_every=1",
                         "train.keep_checkpoints=1", "train.eval_every=0", "name=small", root=root)
    assert res.returncode == 0, res.stderr
    assert [line for line in res.stderr.splitlines() if "warning" in line] == [
        "warning: checkpoints need 3.1 MB (2 x 1.6 MB: train.keep_checkpoints=1 kept and the one being saved) "
        f"but the run root's filesystem ({root}) has {human(free)} free, "
        f"{human(free - code_bytes())} once the run's code ({human(code_bytes())}) is copied there: "
        "saves will fail; lower "
        "train.keep_checkpoints or set run_root=... on a larger filesystem"]
    job_id = job_id_of(res.stdout)
    assert slurm.wait(job_id, timeout=300).startswith("FAILED")
    run_dir = root / "small"
    failed = [e for e in events(run_dir) if e["event"] == "failed"]
    assert failed and all("saving the checkpoint of step 2 failed" in e["error"] and "No space left on device"
                          in e["error"] for e in failed if not e.get("final")), failed
    assert manifest.damage(step_dir(run_dir, 1), 1) == []
    (ended,) = [e for e in events(run_dir) if e["event"] == "attempt_ended"]  # not retried, no node left out
    assert (ended["outcome"], ended["fault"], ended["short"], ended["rank"], ended["exclude"]) == (
        "FAILED", "disk full", "disk full", 0, None)
    assert ended["cause"].startswith("disk full: rank 0 on ") and re.search(
        rf"; at the attempt's end {run_dir} had 0\.\d MB free; a checkpoint needs about 1\.6 MB$", ended["cause"])
    assert failed[-1]["reason"] == "the disk is still full: not retried; free space there, then launcher resume the run"
    (row,) = json.loads(slurm.launcher("runs", "--json", root=root).stdout)
    assert (row["status"], row["reason"]) == ("FAILED", "disk full")
    (root / "filler").unlink()
    resumed = slurm.launcher("resume", "small", root=root)
    assert resumed.returncode == 0, resumed.stderr
    slurm.completes(job_id_of(resumed.stdout), run_dir)
    assert [e["step"] for e in events(run_dir) if e["event"] == "finished"] == [2]


def test_a_save_to_a_read_only_directory_is_retried_once_then_ends_the_run(slurm, tmpfs, tmp_path):
    """An I/O error while saving may be the node's (a mount gone read-only after disk errors) or the directory's:
    one retry on a fresh attempt tells them apart; the same error at the same step again ends the run."""
    res = slurm.launcher("gpus=2", "model=gpt_tiny", "train.steps=400", "train.checkpoint_every=40",
                         "train.log_every=10", "name=frozen", root=tmp_path)
    assert res.returncode == 0, res.stderr
    run_dir = tmp_path / "frozen"
    checkpoints = tmpfs("64m", at=run_dir / "checkpoints")  # mounted before the job's first save
    wait_for(lambda: list(checkpoints.glob("step_????????")), 180, "checkpoint")
    subprocess.run(["mount", "-o", "remount,ro", str(checkpoints)], check=True)
    final = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "failed" and e.get("final")], 240,
                     "verdict")[0]
    ended = [e for e in events(run_dir) if e["event"] == "attempt_ended"]
    assert [e["outcome"] for e in ended] == ["FAILED", "FAILED"], ended
    assert all(e["short"] == "CheckpointSaveError" and "Read-only file system" in e["cause"] for e in ended), ended
    assert [e["event"] for e in events(run_dir)].count("retrying") == 1
    assert final["reason"] == f"the same failure at step {ended[0]['step']} twice, not retried again", final
