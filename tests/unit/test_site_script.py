"""The batch script a site gets, read line by line from a dry run of the real composition (no cluster needed):
what a GPU cluster with accounts, wckeys and fabrics needs that the local cluster does not show."""
from __future__ import annotations

import dataclasses
import pytest

from launcher.compose.composer import compose_runs
from launcher.errors import LaunchError
from launcher.slurm.batch import executor_params, render_sbatch, sbatch_script, watcher


def script(tmp_path, *overrides, exclude=()):
    (run,) = compose_runs(["cluster=slurm", "gpus=16", "model=gpt_1b", *overrides])
    if exclude:  # as a retry submits it (launcher/job/submission.py)
        params = executor_params(run.config, run.plan, "site", tmp_path, exclude=exclude)
        return sbatch_script(command="python -u -m launcher.job.task", folder=tmp_path / "submitit", **params)
    return render_sbatch(run.config, run.plan, "site", tmp_path / "submitit")


def lines(text):
    return text.splitlines()


def srun_line(text):
    (line,) = [line for line in lines(text) if line.startswith("srun ")]
    return line


def test_every_job_may_be_requeued_and_srun_gets_the_cpus_sbatch_asked_for(tmp_path):
    text = script(tmp_path)
    assert "#SBATCH --requeue" in lines(text)
    assert "#SBATCH --cpus-per-task=8" in lines(text)
    assert " --cpus-per-task=8 " in srun_line(text)  # Slurm >= 22.05: srun does not inherit it
    assert script(tmp_path, "cluster.cpus_per_gpu=null").count("cpus-per-task") == 0


def test_the_wckey_is_written_only_when_the_cluster_names_one(tmp_path):
    assert not [line for line in lines(script(tmp_path)) if line.startswith("#SBATCH --wckey")]
    assert "#SBATCH --wckey=proj-7" in lines(script(tmp_path, "cluster.wckey=proj-7"))
    with pytest.raises(LaunchError, match="cluster.wckey='a b' is not allowed in an sbatch script"):
        script(tmp_path, "cluster.wckey='a b'")


def test_tasks_get_faulthandler_nccl_warnings_and_the_clusters_variables(tmp_path):
    (export,) = [line for line in lines(script(tmp_path)) if line.startswith("export PYTHONFAULTHANDLER")]
    assert export == "export PYTHONFAULTHANDLER=1 NCCL_DEBUG=WARN"
    text = script(tmp_path, "+cluster.env.NCCL_SOCKET_IFNAME=ib0", "+cluster.env.NCCL_DEBUG=INFO",
                  "+cluster.env.PYTHONFAULTHANDLER=null", "+cluster.env.NOTE='two words'")
    assert "export NCCL_DEBUG=INFO NCCL_SOCKET_IFNAME=ib0 NOTE='two words'" in lines(text)
    with_setup = lines(script(tmp_path, "cluster.setup=[module load cuda/12.4]"))
    exports = with_setup.index("export PYTHONFAULTHANDLER=1 NCCL_DEBUG=WARN")
    assert with_setup[exports + 1] == "module load cuda/12.4"  # the cluster's own setup can use them
    with pytest.raises(LaunchError, match="cluster.env.BAD-NAME: not a variable name"):
        script(tmp_path, "+cluster.env.BAD-NAME=x")


def test_a_users_exclude_is_kept_beside_a_retrys(tmp_path):
    assert "#SBATCH --exclude=gpu-17" in lines(script(tmp_path, "+cluster.sbatch_flags.exclude=gpu-17"))
    retried = script(tmp_path, "+cluster.sbatch_flags.exclude=gpu-17", exclude=["gpu-03"])
    excluded = [line for line in lines(retried) if line.startswith("#SBATCH --exclude")]
    assert excluded == ["#SBATCH --exclude=gpu-17,gpu-03"]
    assert "#SBATCH --exclude=gpu-03" in lines(script(tmp_path, exclude=["gpu-03"]))


@pytest.mark.parametrize("typed, hint, written", [
    ("+cluster.sbatch_flags.mail-type=END,FAIL", "\"+cluster.sbatch_flags.mail-type='END,FAIL'\"",
     "#SBATCH --mail-type=END,FAIL"),
    ("cluster.account=a,b", "\"cluster.account='a,b'\"", "#SBATCH --account=a,b"),
])  # fmt: skip
def test_a_value_with_commas_is_shown_the_quoted_form_that_works(tmp_path, typed, hint, written):
    with pytest.raises(LaunchError) as err:
        compose_runs([typed])
    assert err.value.message.endswith(f"or quote the value to keep it whole: {hint}")
    assert written in lines(script(tmp_path, hint.strip('"')))  # the hint, as the shell hands it over


def test_a_sweep_of_a_number_is_not_told_to_quote_it():
    with pytest.raises(LaunchError) as err:
        compose_runs(["train.steps=10,20"])
    assert err.value.message == "'train.steps=10,20' is a sweep; add -m (--multirun) to launch one run per value"


def test_a_list_for_an_sbatch_option_is_shown_the_quoted_form(tmp_path):
    with pytest.raises(LaunchError, match=r"cluster.sbatch_flags.mail-type is a list \(END,FAIL\); an sbatch option "
                                          r"takes one value: quote it to keep its commas, "
                                          r"\"\+cluster.sbatch_flags.mail-type='END,FAIL'\""):
        script(tmp_path, "+cluster.sbatch_flags.mail-type=[END,FAIL]")


def test_a_container_runs_the_tasks_with_its_python_and_sees_the_run_data_and_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path / "home"))
    run_dir = tmp_path / "runs" / "site"
    (run,) = compose_runs(["cluster=slurm", "gpus=16", "model=gpt_1b", f"run_root={tmp_path / 'runs'}",
                           f"data.cache_dir={tmp_path / 'cache'}", "cluster.container.image=/images/pytorch.sqsh",
                           "cluster.container.name=gpt", "cluster.container.python=/usr/bin/python3",
                           "cluster.container.mounts=[/lustre:/lustre:ro]", "cluster.python=/opt/venv/bin/python"])
    text = render_sbatch(run.config, run.plan, "site", run_dir / "submitit", mounts=[str(tmp_path / "home/secrets")])
    srun = srun_line(text)
    assert (f"--container-image=/images/pytorch.sqsh --container-name=gpt --container-mounts="
            f"{tmp_path}/runs:{tmp_path}/runs,{tmp_path}/cache:{tmp_path}/cache,"
            f"{tmp_path}/home/secrets:{tmp_path}/home/secrets,/lustre:/lustre:ro "
            f"--container-workdir={run_dir} /usr/bin/python3 -u -m launcher.job.task") in srun
    # The batch script's own steps run on the host, with the cluster's interpreter, never inside the image: the
    # attempt's record, the squeue comment beside srun, and after it the requeue (the image needs no scontrol).
    host = [line.removeprefix("LAUNCHER_KILL_WAIT_S=$(").removesuffix(")") for line in lines(text)
            if "/opt/venv/bin/python " in line]
    assert host == [f"/opt/venv/bin/python -m launcher.job.recovery begin {run_dir}",
                    f"/opt/venv/bin/python -m launcher.job.comment {run_dir} & LAUNCHER_PROGRESS=$!",
                    f"/opt/venv/bin/python -m launcher.job.recovery end {run_dir} $?"]
    assert lines(text).index(host[1]) < lines(text).index(srun) < lines(text).index(host[2])


def test_without_a_container_the_tasks_run_the_clusters_python(tmp_path):
    srun = srun_line(script(tmp_path, "cluster.python=/opt/venv/bin/python"))
    assert "--container-" not in srun and srun.endswith("/opt/venv/bin/python -u -m launcher.job.task "
                                                     f"{tmp_path / 'submitit'}")


def test_the_old_container_key_is_refused_with_its_new_spelling(tmp_path):
    with pytest.raises(LaunchError, match=r"^cluster.container_image is now cluster.container.image; set "
                                          r"cluster.container.image=nvcr.io#nvidia/pytorch:24.05-py3 "):
        script(tmp_path, "cluster.container_image='nvcr.io#nvidia/pytorch:24.05-py3'")
    with pytest.raises(LaunchError, match="cluster.container.image=.* is not allowed in an sbatch script"):
        script(tmp_path, "cluster.container.image='img;touch x'")


def test_gres_memory_per_node_and_srun_options_for_a_site(tmp_path):
    text = script(tmp_path, "cluster.gres=gpu:h100", "cluster.mem=0", "cluster.srun_args=['--mpi=pmix']")
    assert "#SBATCH --gres=gpu:h100:8" in lines(text) and "#SBATCH --mem=0" in lines(text)
    assert not [line for line in lines(text) if line.startswith(("#SBATCH --gpus-per-node", "#SBATCH --mem-per"))]
    assert " --mpi=pmix " in srun_line(text)
    with pytest.raises(LaunchError, match="cluster.gres=gpu:h100:8 names a count; give the gres without it"):
        script(tmp_path, "cluster.gres=gpu:h100:8")
    with pytest.raises(LaunchError, match="cluster.sbatch_flags.mem is set by the launcher"):
        script(tmp_path, "+cluster.sbatch_flags.mem=0")


def test_a_job_arrays_watcher_judges_each_element_once_the_array_ended_unfinished(tmp_path):
    """One watcher for a whole array: it waits on the array (Slurm counts it failed once every element ended and
    one did not complete) and runs the watch step for each element with that element's own frozen code; a plain
    job's watcher waits on that job alone."""
    (run,) = compose_runs(["cluster=slurm", "gpus=8", "model=gpt_tiny", "cluster.account=ml", "cluster.python=/opt/py"])
    elements = [(tmp_path / "a", "77_0"), (tmp_path / "b c", "77_1")]
    text, flags = watcher(run.config, elements, "77", "sweep-1", tmp_path / "watch_%j.log")
    watch_lines = [line for line in lines(text) if "launcher.job.recovery watch" in line]
    assert watch_lines == [f"/opt/py -m launcher.job.recovery watch {tmp_path}/a 77_0",
                           f"/opt/py -m launcher.job.recovery watch '{tmp_path}/b c' 77_1"]
    exports = [line for line in lines(text) if line.startswith("export PYTHONPATH=")]
    assert len(exports) == 2 and f"{tmp_path}/a" in exports[0] and "b c" in exports[1]
    assert "--dependency=afternotok:77" in flags and "--kill-on-invalid-dep=yes" in flags
    assert "--account=ml" in flags and "--job-name=sweep-1.watch" in flags
    assert f"--output={tmp_path}/watch_%j.log" in flags


def test_a_bucket_is_not_mounted_into_a_container_but_a_chosen_cache_folder_is(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path / "home"))
    (run,) = compose_runs(["cluster=slurm", "gpus=16", "model=gpt_1b", f"run_root={tmp_path / 'runs'}",
                           "cluster.container.image=/images/pytorch.sqsh"])
    streamed = dataclasses.replace(run.config.data, path="s3://datasets/books")
    for cache, mounted in ((None, ""), (str(tmp_path / "scratch"), f",{tmp_path}/scratch:{tmp_path}/scratch")):
        cfg = dataclasses.replace(run.config, data=dataclasses.replace(streamed, stream_cache_dir=cache))
        text = render_sbatch(cfg, run.plan, "site", tmp_path / "runs" / "site" / "submitit")
        assert f"--container-mounts={tmp_path}/runs:{tmp_path}/runs{mounted} " in srun_line(text)
        assert "s3:" not in srun_line(text)
