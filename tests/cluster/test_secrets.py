"""`launcher secrets` on the local cluster: injection into real Slurm tasks (the store and the command line:
tests/unit/test_secrets.py).

The test proves a task saw the secrets without the task printing them: it puts a ``sitecustomize`` probe on
PYTHONPATH that, in each task process, fires when ``train`` is first imported (the moment the injection must be
complete) and writes the SHA-256 of what it finds (the env variable, the file behind the path variable) and the
file's mode to a directory outside the run. The launcher itself only prints the injected variables' names. The
test then searches everything Slurm and the run keep for the two random values.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import textwrap
from pathlib import Path


from support.helpers import REPO, job_id_of, run_launcher


PROBE = '''
import hashlib, json, os, sys

class _SecretsProbe:
    """When `launcher.train` is first imported (injection must be done by then), record what the task sees."""

    def find_spec(self, name, path=None, target=None):
        if name == "launcher.train":
            sys.meta_path.remove(self)
            env_var, file_var = os.environ["SECRETS_PROBE_VARS"].split(",")
            env_value, file_path = os.environ.get(env_var), os.environ.get(file_var)
            seen = {"env_sha256": env_value and hashlib.sha256(env_value.encode()).hexdigest(),
                    "file_path": file_path}
            if file_path:
                with open(file_path, "rb") as f:
                    seen["file_sha256"] = hashlib.sha256(f.read()).hexdigest()
                seen["file_mode"] = oct(os.stat(file_path).st_mode & 0o777)
            out = os.path.join(os.environ["SECRETS_PROBE_OUT"], "rank_%s.json" % os.environ.get("SLURM_PROCID"))
            with open(out, "w") as f:
                json.dump(seen, f)
        return None

sys.meta_path.insert(0, _SecretsProbe())
'''


def stored_job_files(slurm, job_id: str) -> list[Path]:
    """The environment and script slurmctld keeps for the job (readable where the test runs as SlurmUser)."""
    conf = Path(slurm.env["SLURM_CONF"]).read_text()
    m = re.search(r"^StateSaveLocation=(\S+)", conf, re.M)
    job = Path(m.group(1)) / f"hash.{int(job_id) % 10}" / f"job.{job_id}" if m else None
    if job is None or not os.access(job, os.R_OK):
        return []
    return [job / "environment", job / "script"]


def test_secrets_reach_every_task_and_appear_nowhere_else(slurm, tmp_path):
    env_value = "envsecret-" + os.urandom(16).hex()
    file_value = ("filesecret-" + os.urandom(16).hex() + "\n").encode()
    home, runs, probe, seen = (tmp_path / d for d in ("home", "runs", "probe", "seen"))
    probe.mkdir(), seen.mkdir()
    (probe / "sitecustomize.py").write_text(textwrap.dedent(PROBE))
    (tmp_path / "token").write_bytes(file_value)
    env = {**slurm.env, "LAUNCHER_HOME": str(home)}
    outputs = []

    def secrets(*args: str, stdin: bytes = b"") -> None:
        res = run_launcher("secrets", *args, input=stdin, env=env, cwd=REPO, timeout=60)
        assert res.returncode == 0, res.stderr
        outputs.append(res.stdout + res.stderr)

    secrets("create", "env", "test-env", "--env", "TEST_SECRET_TOKEN", stdin=env_value.encode())
    secrets("create", "file", "test-file", "--env", "TEST_SECRET_FILE", "--from", str(tmp_path / "token"))
    (tmp_path / "token").unlink()
    secrets("list")
    secrets("list", "--json")

    launch_env = {"LAUNCHER_HOME": str(home), "SECRETS_PROBE_OUT": str(seen),
                  "SECRETS_PROBE_VARS": "TEST_SECRET_TOKEN,TEST_SECRET_FILE",
                  "PYTHONPATH": os.pathsep.join(filter(None, [str(probe), slurm.env.get("PYTHONPATH")]))}
    res = slurm.launcher("gpus=2", "model=gpt_tiny", "train.steps=2", "name=sec", "+cluster.sbatch_flags.hold=true",
                         root=runs, env=launch_env)
    assert res.returncode == 0, res.stderr
    outputs.append((res.stdout + res.stderr).encode())
    job_id = job_id_of(res.stdout)
    try:
        # Everything Slurm holds about the job, while it waits: details, the batch script, its stored environment.
        outputs.append(slurm.run("scontrol", "show", "job", "-d", job_id).stdout.encode())
        outputs.append(slurm.run("scontrol", "show", "job", "-dd", job_id).stdout.encode())
        outputs.append(slurm.run("scontrol", "write", "batch_script", job_id, "-").stdout.encode())
        stored = stored_job_files(slurm, job_id)
        for path in stored:
            outputs.append(path.read_bytes())
        if stored:
            assert f"LAUNCHER_HOME={home}".encode() in stored[0].read_bytes()  # the path travels, not the value
        slurm.run("scontrol", "release", job_id)
        assert slurm.wait(job_id, timeout=180) == "COMPLETED"
    finally:
        slurm.run("scancel", job_id, check=False)
    outputs.append(slurm.run("sacct", "-j", job_id, "-P", "-o", "JobID,JobName,SubmitLine,WorkDir,Comment").stdout.encode())

    # Every task saw both secrets when it imported train: the value, and the path of the private file.
    expect_file_path = str(home / "secrets" / "test-file.value")
    for rank in (0, 1):
        got = json.loads((seen / f"rank_{rank}.json").read_text())
        assert got == {"env_sha256": hashlib.sha256(env_value.encode()).hexdigest(), "file_path": expect_file_path,
                       "file_sha256": hashlib.sha256(file_value).hexdigest(), "file_mode": "0o600"}, rank
        log = (runs / "sec" / "submitit" / f"{job_id}_{rank}_log.out").read_text()
        assert "launcher: injected secrets: TEST_SECRET_TOKEN, TEST_SECRET_FILE\n" in log

    # ...and the values are nowhere: not in what the commands printed, what Slurm keeps, or the run directory.
    run_files = [p for p in (runs / "sec").rglob("*") if p.is_file()]
    assert {"config.yaml", "sbatch.sh", "run.json", "events.jsonl", "rank_0.log", "task.pkl",
            f"{job_id}_0_log.err"} <= {p.name for p in run_files}
    needles = [env_value.encode(), file_value.strip()]
    assert [i for i, text in enumerate(outputs) if any(needle in text for needle in needles)] == []
    assert [p for p in run_files if any(needle in p.read_bytes() for needle in needles)] == []
