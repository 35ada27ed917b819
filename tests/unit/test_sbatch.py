"""The Slurm request: executor parameters, the rendered script, shell safety."""
import copy
import os
import subprocess
import sys

import pytest
from submitit.slurm.slurm import _get_default_parameters

from launcher.compose.composer import compose_runs
from launcher.core.config import ContainerConfig
from launcher.errors import LaunchError
from launcher.slurm.batch import executor_params, frozen_code_line, render_sbatch

# One worker makes its composed runs (a module-scoped fixture) for all the tests here.
pytestmark = pytest.mark.xdist_group("sbatch")


@pytest.fixture(scope="module")
def runs():
    """The default run on 8, 16 and 128 GPUs (local cluster) and on the site cluster."""
    composed = compose_runs(["gpus=8,16,128", "cluster=local,slurm"], multirun=True)
    return {(r.plan.gpus, r.config.cluster.name): r for r in composed}


def config_of(runs, gpus=8, cluster="local", **fields):
    """A private copy of a composed config, with cluster fields changed."""
    run = runs[(gpus, cluster)]
    cfg = copy.deepcopy(run.config)
    for key, value in fields.items():
        setattr(cfg.cluster, key, value)
    return cfg, run.plan


def sbatch_lines(script):
    return {line for line in script.splitlines() if line.startswith("#SBATCH")}


@pytest.mark.parametrize("gpus, nodes", [(8, 1), (16, 2), (128, 16)])
def test_script_requests_the_plans_layout(runs, gpus, nodes, tmp_path):
    run = runs[(gpus, "local")]
    script = render_sbatch(run.config, run.plan, f"r{gpus}", tmp_path / "submitit")
    assert {
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --cpus-per-task=1",
        "#SBATCH --gpus-per-node=8",
        f"#SBATCH --job-name=r{gpus}",
        "#SBATCH --signal=USR2@60",
        "#SBATCH --time=30",
    } <= sbatch_lines(script)
    assert "#SBATCH --partition" not in script  # the local cluster's default partition
    assert "--overcommit" not in script  # the local cluster has a CPU per GPU
    lines = script.rstrip().splitlines()
    srun = next(line for line in lines if line.startswith("srun "))
    assert "--kill-on-bad-exit=1" in srun and srun.endswith(f"-m launcher.job.task {tmp_path / 'submitit'}")
    # The attempt is recorded around the ranks, and its end judged with srun's exit status (launcher/job/recovery.py).
    assert lines.index(next(line for line in lines if line.endswith(f"-m launcher.job.recovery begin {tmp_path})"))) \
        < lines.index(srun) < lines.index(lines[-2]) and lines[-2].endswith(f"-m launcher.job.recovery end {tmp_path} $?")
    # The progress follower is the shell's to reap, after the end step, whose status the script ends with.
    assert lines[-1] == "ENDED=$?; kill $LAUNCHER_PROGRESS 2>/dev/null; wait $LAUNCHER_PROGRESS 2>/dev/null; exit $ENDED"


def test_the_job_imports_the_runs_frozen_code_from_its_first_line_of_python(runs, tmp_path):
    run = runs[(8, "local")]
    lines = render_sbatch(run.config, run.plan, "r", tmp_path / "submitit").splitlines()
    begin = next(i for i, line in enumerate(lines) if "-m launcher.job.recovery begin" in line)
    assert lines[begin - 1] == frozen_code_line(tmp_path) == \
        f"export PYTHONPATH={tmp_path}/code${{PYTHONPATH:+:$PYTHONPATH}} PYTHONSAFEPATH=1"


@pytest.mark.parametrize("begins, said", [("echo 30", "ran with 30"), ("echo; exit 1", "ran with"),
                                          ("exit 3", "")])
def test_the_begin_step_hands_slurms_kill_wait_to_the_tasks(runs, tmp_path, begins, said):
    """The begin step prints KillWait, which it asks Slurm on the host; the script exports it to the tasks (srun
    passes the environment on), and still ends at once when the begin step says the run is another job's (exit 3)."""
    run = runs[(8, "local")]
    lines = render_sbatch(run.config, run.plan, "r", tmp_path / "submitit").splitlines()
    begin = next(i for i, line in enumerate(lines) if "-m launcher.job.recovery begin" in line)
    assert lines[begin].startswith("LAUNCHER_KILL_WAIT_S=$(") and lines[begin + 2] == "export LAUNCHER_KILL_WAIT_S"
    fake = tmp_path / "python"  # the host's Python, as the begin step answers
    fake.write_text(f"#!/bin/sh\n{begins}\n")
    fake.chmod(0o755)
    steps = [line.replace(sys.executable, str(fake)) for line in lines[begin:begin + 3]]
    shell = subprocess.run(["bash", "-c", "\n".join([*steps, 'echo "ran with $(printenv LAUNCHER_KILL_WAIT_S)"'])],
                           capture_output=True, text=True)
    assert (shell.stdout.strip(), shell.returncode) == (said, 3 if begins == "exit 3" else 0)


def test_a_site_can_turn_the_progress_comment_off(runs, tmp_path):
    """The comment is the job's only steady RPC to slurmctld (launcher/job/comment.py); cluster.progress_comment:
    false starts no follower, and the script's end still reaps none cleanly."""
    follower = "-m launcher.job.comment "
    on = render_sbatch(*config_of(runs), "r", tmp_path / "submitit")
    assert sum(follower in line and line.endswith("& LAUNCHER_PROGRESS=$!") for line in on.splitlines()) == 1
    off = render_sbatch(*config_of(runs, progress_comment=False), "r", tmp_path / "submitit")
    assert follower not in off and off.splitlines()[-1] == on.splitlines()[-1]


def test_a_retry_excludes_nodes(runs, tmp_path):
    run = runs[(8, "local")]
    params = executor_params(run.config, run.plan, "x", tmp_path, exclude=["node3", "node7"])
    assert params["exclude"] == "node3,node7"
    assert "begin" not in params.get("additional_parameters", {})
    # A retry that must wait until Slurm has marked a lost node down (launcher/job/recovery.py's schedulable)
    later = executor_params(run.config, run.plan, "x", tmp_path, begin_s=65)
    assert later["additional_parameters"]["begin"] == "now+65"


def test_four_gpus_spread_over_two_nodes(tmp_path):
    (run,) = compose_runs(["gpus=4"])
    lines = sbatch_lines(render_sbatch(run.config, run.plan, "four", tmp_path))
    assert {"#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2", "#SBATCH --gpus-per-node=2"} <= lines


def test_site_cluster_fields_reach_the_script(runs, tmp_path):
    cfg, plan = config_of(
        runs, 16, "slurm", account="proj", qos="high", gpu_type="h100",
        setup=["module load cuda/12.4", "source /opt/venv/bin/activate"],
        container=ContainerConfig(image="nvcr.io#nvidia/pytorch:24.05-py3"),
        sbatch_flags={"mail-type": "END", "requeue": True, "hint": None},
    )  # fmt: skip
    script = render_sbatch(cfg, plan, "site", tmp_path)
    assert {
        "#SBATCH --partition=gpu", "#SBATCH --account=proj", "#SBATCH --qos=high",
        "#SBATCH --gpus-per-node=h100:8", "#SBATCH --cpus-per-task=8", "#SBATCH --ntasks-per-node=8", "#SBATCH --mem-per-gpu=100G",
        "#SBATCH --exclusive", "#SBATCH --time=1440", "#SBATCH --signal=USR2@120",
        "#SBATCH --mail-type=END", "#SBATCH --requeue",
    } <= sbatch_lines(script)  # fmt: skip
    assert "overcommit" not in script and "hint" not in script
    assert "module load cuda/12.4\nsource /opt/venv/bin/activate\n" in script
    assert "'--container-image=nvcr.io#nvidia/pytorch:24.05-py3' " in script  # quoted by submitit


def test_params_are_valid_submitit_parameters(runs):
    run = runs[(16, "slurm")]
    params = executor_params(run.config, run.plan, "x")
    assert set(params) <= set(_get_default_parameters())
    assert (params["nodes"], params["ntasks_per_node"], params["job_name"]) == (2, 8, "x")


def test_launcher_managed_options_cannot_be_replaced(runs):
    cfg, plan = config_of(runs, sbatch_flags={"ntasks_per_node": 1})
    with pytest.raises(LaunchError, match="sbatch_flags.ntasks_per_node is set by the launcher"):
        executor_params(cfg, plan, "x")


INJECTIONS = ["$(touch {m})", "`touch {m}`", "x;touch {m}", "x\ntouch {m}", "x' && touch {m} #", "x | touch {m}"]


@pytest.mark.parametrize("field", ["partition", "account", "qos", "constraint", "mem_per_gpu", "mem", "gpu_type", "gres",
                                   "wckey"])
@pytest.mark.parametrize("payload", INJECTIONS)
def test_metacharacters_in_cluster_values_are_rejected(runs, field, payload, tmp_path):
    cfg, plan = config_of(runs, **{field: payload.format(m=tmp_path / "pwned")})
    with pytest.raises(LaunchError, match=f"cluster.{field}=.* is not allowed in an sbatch script"):
        executor_params(cfg, plan, "x")


@pytest.mark.parametrize("payload", INJECTIONS)
def test_metacharacters_in_run_names_and_flags_are_rejected(runs, payload, tmp_path):
    value = payload.format(m=tmp_path / "pwned")
    cfg, plan = config_of(runs)
    with pytest.raises(LaunchError, match="invalid run name"):
        executor_params(cfg, plan, value)
    cfg, plan = config_of(runs, sbatch_flags={"mail-user": value})
    with pytest.raises(LaunchError, match="not allowed in an sbatch script"):
        executor_params(cfg, plan, "x")


def test_setup_lines_must_be_single_lines(runs):
    cfg, plan = config_of(runs, setup=["echo ok\ntouch /tmp/pwned"])
    with pytest.raises(LaunchError, match="must be a single line"):
        executor_params(cfg, plan, "x")


@pytest.mark.skipif(sys.platform == "win32", reason="runs the script with bash")
def test_a_hostile_run_folder_is_quoted_and_runs_nothing(runs, tmp_path):
    """Run the rendered script with a stub srun: nothing but srun may execute,
    and srun must receive the folder verbatim."""
    run = runs[(8, "local")]
    marker = tmp_path / "pwned"
    folder = tmp_path / f"a $(touch {marker}) `touch {marker}`; touch {marker} 'q\" & | > x"
    script = tmp_path / "job.sh"
    script.write_text(render_sbatch(run.config, run.plan, "safe", folder))
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "srun").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > "$SRUN_ARGS"\n')
    (stub / "srun").chmod(0o755)
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "SRUN_ARGS": str(tmp_path / "args")}
    subprocess.run(["bash", str(script)], check=True, env=env, cwd=tmp_path, timeout=30)
    assert not marker.exists()
    args = (tmp_path / "args").read_text().splitlines()
    assert args[-1] == str(folder) and args[-4:-1] == ["-u", "-m", "launcher.job.task"]
